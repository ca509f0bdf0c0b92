"""What GRPO training of the LLM conductor reads: its prompts, and the logged outcome of every worker on
every query.

Prompts are built by the router's own prompt builder (`baton_conductor.Prompter`), for the worker pool of a Baton
config, so the model is trained on exactly the text it is asked at serving time: workers appear by
index, in the config's order.

The outcome table says, per query and per worker, how that worker did on that query when it ran: the
share of its logged answers graded right, and what one call cost. Two sources, which can be merged:

- the episode dataset the reward logger writes (Parquet, hive-partitioned by date). Every step output
  of an episode that carries a grader and a reference is graded as an answer to the query; a step that
  failed is skipped (a provider error says nothing about what the worker knows). An episode without a
  gradable reference still counts when its plan had one step: that step's output was the answer, so
  the episode's quality (else its reward, clipped to [0, 1]) is that worker's outcome.
- an outcome matrix in RouterBench's CSV layout (replay data): one score column per model, mapped to
  workers through the config (`sim.column`, else the worker's `model`, else its name).

Queries are matched by `matrix.group_key` (whitespace- and case-normalised text), the identity the
trainer already uses to keep a question on one side of a split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from baton.v1 import common_pb2, requests_pb2
from baton_conductor import PlanBounds, Prompter
from baton_graders import GradingError, grade
from baton_platform.config import BatonConfig, WorkerConfig
from baton_policy.matrix import COST_CHARS, COST_TOTAL, OutcomeMatrix, group_key
from baton_workflow import CONDUCTOR

# The sim executor's estimate of characters per token, used to price a matrix that records characters.
CHARS_PER_TOKEN = 4

EPISODE_COLUMNS = ("request_id", "query", "messages_json", "plan_json", "steps", "grader", "reference",
                   "quality", "reward")


def query_key(text: str) -> str:
    return group_key(text)


# ---------------------------------------------------------------- outcome table


@dataclass(frozen=True)
class Outcome:
    """How one worker did on one query over its logged runs."""

    quality: float  # mean graded score in [0, 1]: the share of runs graded right for 0/1 graders
    cost_usd: float | None  # mean cost of one call, None when nothing priced it
    runs: int


@dataclass
class _Cell:
    quality_sum: float = 0.0
    runs: int = 0
    cost_sum: float = 0.0
    costed: int = 0

    def outcome(self) -> Outcome:
        cost = self.cost_sum / self.costed if self.costed else None
        return Outcome(self.quality_sum / self.runs, cost, self.runs)


@dataclass
class OutcomeTable:
    """Per query (by `query_key`) and per worker name: the logged `Outcome`."""

    workers: list[str]
    _cells: dict[str, dict[str, _Cell]] = field(default_factory=dict, repr=False)
    texts: dict[str, str] = field(default_factory=dict, repr=False)  # key -> the query's text, first seen

    def add(self, query: str, worker: str, quality: float, cost_usd: float | None = None) -> None:
        if not 0.0 <= quality <= 1.0 or math.isnan(quality):
            raise ValueError(f"quality must lie in [0, 1], got {quality}")
        key = query_key(query)
        self.texts.setdefault(key, query)
        cell = self._cells.setdefault(key, {}).setdefault(worker, _Cell())
        cell.quality_sum += quality
        cell.runs += 1
        if cost_usd is not None and not math.isnan(cost_usd):
            cell.cost_sum += cost_usd
            cell.costed += 1

    def get(self, key: str, worker: str) -> Outcome | None:
        """The outcome of `worker` on the query with this key (see `query_key`); None when never logged."""
        cell = self._cells.get(key, {}).get(worker)
        return cell.outcome() if cell is not None and cell.runs else None

    def known(self, key: str) -> dict[str, Outcome]:
        return {w: c.outcome() for w, c in self._cells.get(key, {}).items() if c.runs}

    def keys(self) -> list[str]:
        return list(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def mean_cost(self, worker: str) -> float | None:
        """The worker's mean cost per call over every query that priced it: a stand-in for an unpriced cell."""
        total = n = 0.0
        for cells in self._cells.values():
            cell = cells.get(worker)
            if cell is not None and cell.costed:
                total += cell.cost_sum
                n += cell.costed
        return total / n if n else None

    def spread(self, key: str) -> bool:
        """Whether the workers' logged outcomes on this query differ, i.e. the choice of worker matters."""
        qualities = {round(o.quality, 9) for o in self.known(key).values()}
        return len(qualities) > 1

    def merge(self, other: OutcomeTable) -> OutcomeTable:
        """A new table holding both tables' runs (the same worker on the same query pools its runs)."""
        out = OutcomeTable(list(self.workers) + [w for w in other.workers if w not in self.workers])
        for table in (self, other):
            for key, cells in table._cells.items():
                out.texts.setdefault(key, table.texts.get(key, ""))
                for worker, cell in cells.items():
                    mine = out._cells.setdefault(key, {}).setdefault(worker, _Cell())
                    mine.quality_sum += cell.quality_sum
                    mine.runs += cell.runs
                    mine.cost_sum += cell.cost_sum
                    mine.costed += cell.costed
        return out


def read_episodes(directory: str | Path) -> list[dict]:
    """Episode rows from the reward logger's dataset: `directory` is its `episodes/` folder or the
    dataset root above it, a local path or an fsspec URL (s3://bucket/prefix). Only the columns
    training needs are read."""
    from baton_platform.dataset import locate, open_dataset

    root = str(directory).rstrip("/")
    fs, path = locate(root)
    if fs.isdir(f"{path}/episodes"):
        root, path = f"{root}/episodes", f"{path}/episodes"
    if not fs.isdir(path):
        raise ValueError(f"episode dataset {root} is not a directory")
    dataset = open_dataset(root)
    if dataset is None:
        raise ValueError(f"episode dataset {root} holds no Parquet file")
    columns = [c for c in EPISODE_COLUMNS if c in dataset.schema.names]
    missing = {"query", "steps"} - set(columns)
    if missing:
        raise ValueError(f"episode dataset {root} lacks columns {sorted(missing)}")
    return dataset.to_table(columns=columns).to_pylist()


def _plan_steps(row: Mapping) -> int:
    try:
        return len(json.loads(row.get("plan_json") or "[]"))
    except (TypeError, ValueError):
        return 0


def outcomes_from_episodes(rows: Iterable[Mapping], workers: Sequence[str], *,
                           intermediate: bool = True) -> OutcomeTable:
    """The outcome table of logged episodes (see the module's docstring for what counts).

    `intermediate=False` grades only each episode's final step, for pools whose intermediate steps are
    not meant to answer the question (drafts, critiques) and should not be judged as answers.
    """
    table = OutcomeTable(list(workers))
    seen: set[str] = set()
    for row in rows:
        rid = row.get("request_id")
        if rid:
            if rid in seen:
                continue  # a redelivered response is one run, not two
            seen.add(rid)
        query = row.get("query") or ""
        if not query.strip():
            continue
        # A conductor step's output depends on the workflow before it, not on the query alone: it is
        # no outcome of a worker (the reward scores such plans by their last worker step).
        steps = [s for s in (row.get("steps") or []) if s.get("worker") and s["worker"] != CONDUCTOR]
        ran = [s for s in steps if not s.get("error") and s.get("output") is not None]
        grader, reference = row.get("grader"), row.get("reference")
        if grader and reference and ran:
            last = max(s.get("step") or 0 for s in ran)
            for s in ran:
                if not intermediate and (s.get("step") or 0) != last:
                    continue
                try:
                    quality = grade(grader, s["output"], reference).score
                except (ValueError, GradingError):
                    break  # an unknown grader, or one that cannot grade here: nothing in this episode counts
                table.add(query, s["worker"], quality, s.get("cost_usd"))
            continue
        value = row.get("quality")
        if value is None and row.get("reward") is not None:
            value = min(1.0, max(0.0, float(row["reward"])))
        if value is not None and len(ran) == 1 and _plan_steps(row) <= 1:
            table.add(query, ran[0]["worker"], float(value), ran[0].get("cost_usd"))
    return table


def matrix_column(worker: WorkerConfig, models: Sequence[str]) -> str | None:
    """The matrix column that records `worker`: its sim column, else its model, else its name."""
    for name in ((worker.sim.column if worker.sim else None), worker.model, worker.name):
        if name and name in models:
            return name
    return None


def _call_cost(matrix: OutcomeMatrix, i: int, j: int, worker: WorkerConfig) -> float | None:
    """What one call of `worker` cost on row i, recorded in column j: USD as recorded, or characters
    priced with the worker's configured prices (tokens estimated as the sim executor does: characters
    / 4 for the prompt and for the output); None when the matrix records neither."""
    if matrix.cost_source == COST_TOTAL:
        return float(matrix.costs[i, j])
    if matrix.cost_source == COST_CHARS:
        prompt_tokens = len(matrix.prompts[i]) // CHARS_PER_TOKEN
        return worker.price.cost(prompt_tokens, int(float(matrix.costs[i, j])) // CHARS_PER_TOKEN)
    return None


def _pool_columns(matrix: OutcomeMatrix, workers: Sequence[WorkerConfig],
                  columns: Mapping[str, str] | None = None) -> list[tuple[WorkerConfig, int]]:
    columns = dict(columns or {})
    picks = []
    for w in workers:
        column = columns.get(w.name) or matrix_column(w, matrix.models)
        if column is not None:
            if column not in matrix.models:
                raise ValueError(f"worker {w.name!r}: column {column!r} is not in the matrix")
            picks.append((w, matrix.models.index(column)))
    if not picks:
        raise ValueError(f"no worker of the pool has a column in the matrix (models: {matrix.models[:8]} ...)")
    return picks


def outcomes_from_matrix(matrix: OutcomeMatrix, workers: Sequence[WorkerConfig], *,
                         columns: Mapping[str, str] | None = None) -> OutcomeTable:
    """The outcome table of a replay matrix for a configured pool (costs as `_call_cost` prices them).
    Workers without a column in the matrix have no outcomes."""
    table = OutcomeTable([w.name for w in workers])
    picks = _pool_columns(matrix, workers, columns)
    for i, prompt in enumerate(matrix.prompts):
        for w, j in picks:
            table.add(prompt, w.name, float(matrix.scores[i, j]), _call_cost(matrix, i, j, w))
    return table


def pool_matrix(matrix: OutcomeMatrix, workers: Sequence[WorkerConfig]) -> OutcomeMatrix:
    """The matrix as the configured pool sees it: one column per worker, named after it, in pool order,
    with each call priced in USD as the GRPO reward prices it. Every plan of the pool can then be scored
    on it, so a conductor, the fast policy and single workers are compared on the same rows and costs."""
    picks = _pool_columns(matrix, workers)
    missing = [w.name for w in workers if w.name not in {p.name for p, _ in picks}]
    if missing:
        raise ValueError(f"workers {missing} have no column in the matrix: their plans could not be scored")
    if matrix.cost_source not in (COST_TOTAL, COST_CHARS):
        raise ValueError("the matrix records no cost (<model>|total_cost or <model>|output_chars columns)")
    cols = [j for _, j in picks]
    costs = np.array([[_call_cost(matrix, i, j, w) for w, j in picks] for i in range(len(matrix))], dtype=float)
    return OutcomeMatrix(
        sample_ids=list(matrix.sample_ids), eval_names=list(matrix.eval_names), prompts=list(matrix.prompts),
        models=[w.name for w, _ in picks], scores=matrix.scores[:, cols], costs=costs.reshape(len(matrix), len(cols)),
        cost_source=COST_TOTAL, reference=matrix.reference,
        answers=matrix.answers[:, cols] if matrix.answers is not None else None,
        output_chars=matrix.output_chars[:, cols] if matrix.output_chars is not None else None)


# ---------------------------------------------------------------- prompts


@dataclass
class PromptSet:
    """Training prompts for one worker pool: rows of {"prompt": chat messages, "query_key", "query"}.

    `worker_names` is the pool in index order (what "Model i" in the prompt means) and `bounds` the
    plan limits the prompt announces; the reward reads plans with both.
    """

    rows: list[dict]
    worker_names: list[str]
    bounds: PlanBounds

    def __len__(self) -> int:
        return len(self.rows)

    def to_dataset(self):
        """The rows as a `datasets.Dataset` (conversational prompts, as TRL's trainers take them)."""
        from datasets import Dataset

        return Dataset.from_list(self.rows)


def build_prompts(conversations: Iterable[Sequence[Mapping[str, str]]], config: BatonConfig, *,
                  outcomes: OutcomeTable | None = None, require_outcome: bool = True,
                  spread_only: bool = False, limit: int | None = None,
                  estimate: Mapping[str, Mapping[str, float]] | None = None) -> PromptSet:
    """One training prompt per distinct query (the last user message of each conversation).

    `estimate` maps a query's key to the router's estimate the prompt shows (`shown_estimate`), as the
    router shows it when the config sets `conductor.evidence`.

    With `outcomes` and `require_outcome`, a query none of the pool's workers has a logged outcome on is
    left out: every valid plan for it would score the same, which teaches nothing about routing. With
    `spread_only`, so is a query on which every logged worker did equally well: such a query still
    teaches the plan format (and cost, with a cost weight), but not which worker to pick.
    """
    prompter = Prompter(config.conductor, config.workers)
    rows: list[dict] = []
    seen: set[str] = set()
    for conversation in conversations:
        messages = [{"role": m["role"], "content": m["content"]} for m in conversation]
        user = [m["content"] for m in messages if m["role"] == "user"]
        if not user or not user[-1].strip():
            continue
        key = query_key(user[-1])
        if key in seen:
            continue
        if outcomes is not None and require_outcome and not any(
                w in prompter.worker_names for w in outcomes.known(key)):
            continue
        if outcomes is not None and spread_only and not outcomes.spread(key):
            continue
        seen.add(key)
        # The router's own path from a request to the conductor's messages, so training and serving
        # prompts cannot drift apart.
        request = requests_pb2.ChatRequest(messages=[common_pb2.ChatMessage(**m) for m in messages])
        prompt = prompter.messages(request, estimate.get(key) if estimate is not None else None)
        rows.append({"prompt": prompt, "query_key": key, "query": user[-1]})
        if limit is not None and len(rows) >= limit:
            break
    return PromptSet(rows, list(prompter.worker_names), prompter.bounds)


def shown_estimate(config: BatonConfig, conversations: Iterable[Sequence[Mapping[str, str]]],
                   matrix: OutcomeMatrix | None = None) -> dict[str, dict[str, float]] | None:
    """The router's estimate each training query's prompt shows (by query key), or None when the config
    sets no `conductor.evidence` and the router shows none: a conductor trained on prompts without the
    estimate would be served prompts with it.

    A logged query gets what the router showed it, the config's estimate guessing its subject from the
    text. A matrix question gets the estimate fitted without its fold (`out_of_fold`), as the warm start
    shows it: the configured estimate was fitted on such questions, and on them is surer than it is on
    the new questions it is served."""
    if config.conductor.evidence is None:
        return None
    from baton_policy.evidence import Evidence, out_of_fold

    served = Evidence.load(config.conductor.evidence)
    shown: dict[str, dict[str, float]] = {}
    for conversation in conversations:
        user = [m["content"] for m in conversation if m["role"] == "user"]
        if user and user[-1].strip():
            shown.setdefault(query_key(user[-1]), served.chance_of(user[-1]))
    if matrix is not None:
        scored = [w for w in config.workers if matrix_column(w, matrix.models) is not None]
        pool = pool_matrix(matrix, scored)
        for prompt, row in zip(pool.prompts, out_of_fold(pool), strict=True):
            shown[query_key(prompt)] = dict(zip(pool.models, row.tolist(), strict=True))
    return shown


def episode_conversations(rows: Iterable[Mapping]) -> list[list[dict[str, str]]]:
    """The conversation each logged request carried (its query alone when the messages were not logged)."""
    out = []
    for row in rows:
        messages = None
        if row.get("messages_json"):
            try:
                messages = json.loads(row["messages_json"])
            except ValueError:
                messages = None
        if not messages:
            messages = [{"role": "user", "content": row.get("query") or ""}]
        out.append(messages)
    return out


@dataclass
class TrainingData:
    prompts: PromptSet
    outcomes: OutcomeTable


def load_training_data(config: BatonConfig, *, episodes: str | Path | None = None,
                       matrix: OutcomeMatrix | None = None, intermediate: bool = True,
                       spread_only: bool = False, limit: int | None = None) -> TrainingData:
    """Prompts and outcomes from an episode dataset, a replay matrix, or both (outcomes pooled)."""
    if episodes is None and matrix is None:
        raise ValueError("give an episode dataset, an outcome matrix, or both")
    names = [w.name for w in config.workers]
    table = OutcomeTable(names)
    conversations: list[list[dict[str, str]]] = []
    if episodes is not None:
        rows = read_episodes(episodes)
        table = table.merge(outcomes_from_episodes(rows, names, intermediate=intermediate))
        conversations += episode_conversations(rows)
    if matrix is not None:
        table = table.merge(outcomes_from_matrix(matrix, config.workers))
        conversations += [[{"role": "user", "content": p}] for p in matrix.prompts]
    prompts = build_prompts(conversations, config, outcomes=table, spread_only=spread_only, limit=limit,
                            estimate=shown_estimate(config, conversations, matrix))
    if not len(prompts):
        raise ValueError("no query has a logged outcome for any worker of the pool: nothing to train on")
    return TrainingData(prompts, table)
