"""Workflow templates the policy chooses between, and their outcomes on an outcome matrix.

Templates (every one is scored from the matrix, and its cost is the sum of the costs of the
workers it actually calls):

- ``single``: one worker.
- ``vote``: a panel of k workers, plurality over their answers (ties go to the stronger worker).
- ``panel``: a panel of k workers, answer picked by a learned :class:`PanelAggregator`.
- ``escalate``: solve-then-verify. The first ``first`` workers answer; if they all agree the
  answer stands (the second worker acted as an independent verifier), otherwise the remaining
  workers are called and the learned aggregator of the whole panel decides.

Panel templates need each worker's answer (``<model>|answer`` columns). A panel answer is
scored against the reference column when there is one, else it earns the mean score of the
panel members that gave that answer (0 when none did).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .aggregate import PanelAggregator, is_letter_task, plurality
from .matrix import OutcomeMatrix

KINDS = ("single", "vote", "panel", "escalate")


@dataclass(frozen=True)
class Workflow:
    name: str
    kind: str
    workers: tuple[str, ...]
    first: int = 0  # escalate only: workers called before checking agreement

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workflow kind {self.kind!r}")
        if not self.workers:
            raise ValueError("a workflow needs at least one worker")
        if self.kind == "single" and len(self.workers) != 1:
            raise ValueError("a single workflow has exactly one worker")
        if self.kind == "escalate" and not 1 < self.first < len(self.workers):
            raise ValueError("escalate needs 1 < first < number of workers")

    @property
    def needs_aggregator(self) -> bool:
        return self.kind in ("panel", "escalate")

    def to_json(self) -> dict:
        d = asdict(self)
        d["workers"] = list(self.workers)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Workflow:
        return cls(d["name"], d["kind"], tuple(d["workers"]), int(d.get("first", 0)))


def single(model: str) -> Workflow:
    return Workflow(model, "single", (model,))


def candidate_workflows(
    matrix: OutcomeMatrix,
    vote_sizes: Sequence[int] = (3, 5),
    panel_sizes: Sequence[int] = (3, 5, 8),
    escalate: Sequence[tuple[int, int]] = ((2, 5), (2, 8)),
) -> list[Workflow]:
    """Every single worker, plus panels of the k most accurate workers on ``matrix`` when the
    matrix has per-worker answers."""
    flows = [single(m) for m in matrix.models]
    if not matrix.has_answers or len(matrix.models) < 2:
        return flows
    order = [matrix.models[j] for j in np.argsort(-matrix.scores.mean(0), kind="stable")]
    m = len(order)
    for k in vote_sizes:
        if 2 < k <= m:
            flows.append(Workflow(f"vote-{k}", "vote", tuple(order[:k])))
    for k in panel_sizes:
        if 1 < k <= m:
            flows.append(Workflow(f"panel-{k}", "panel", tuple(order[:k])))
    panel_workers = {f.workers for f in flows if f.kind == "panel"}
    for first, k in escalate:
        if 1 < first < k <= m and tuple(order[:k]) in panel_workers:
            flows.append(Workflow(f"escalate-{first}to{k}", "escalate", tuple(order[:k]), first))
    return flows


@dataclass
class Outcomes:
    workflows: list[Workflow]
    scores: np.ndarray  # [n, A]
    costs: np.ndarray  # [n, A]
    calls: np.ndarray  # [n, A]

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workflows]


def _columns(matrix: OutcomeMatrix, workers: Sequence[str]) -> list[int]:
    try:
        return [matrix.models.index(w) for w in workers]
    except ValueError as exc:
        raise ValueError(f"worker missing from the matrix: {exc}") from exc


def answer_scores(matrix: OutcomeMatrix, cols: list[int], preds: Sequence[str]) -> np.ndarray:
    """What each row's answer ``preds[i]`` of the panel on columns ``cols`` scores (see the module docstring)."""
    n = len(preds)
    out = np.zeros(n)
    if matrix.reference is not None:
        for i, p in enumerate(preds):
            out[i] = 1.0 if p and p == matrix.reference[i] else 0.0
        return out
    answers = matrix.answer_columns("scoring a panel's answer")[:, cols]
    scores = matrix.scores[:, cols]
    for i, p in enumerate(preds):
        if p:
            hit = answers[i] == p
            if hit.any():
                out[i] = scores[i, hit].mean()
    return out


def training_reference(matrix: OutcomeMatrix) -> list[str]:
    """The reference answer per row: the ``answer`` column, else any answer that scored >= 0.5."""
    if matrix.reference is not None:
        return list(matrix.reference)
    assert matrix.answers is not None
    refs = []
    for i in range(len(matrix)):
        good = [a for a, s in zip(matrix.answers[i], matrix.scores[i], strict=True) if a and s >= 0.5]
        # First most frequent answer in worker order, so ties resolve the same way every run.
        refs.append(max(good, key=good.count) if good else "")
    return refs


def fit_aggregator(
    matrix: OutcomeMatrix, workers: Sequence[str], l2: float = 3e-3, reliability: np.ndarray | None = None
) -> PanelAggregator:
    """``reliability``: optional [n, models] predicted P(model right | prompt), columns in
    ``matrix.models`` order; predictions for training rows should be out of fold."""
    all_answers = matrix.answer_columns("a learned panel")
    cols = _columns(matrix, workers)
    answers = all_answers[:, cols]
    lengths = matrix.output_chars[:, cols] if matrix.output_chars is not None else None
    agg = PanelAggregator(
        workers,
        letters=is_letter_task(all_answers),
        eval_names=sorted({e for e in matrix.eval_names if e}),
        use_lengths=lengths is not None,
        l2=l2,
        use_reliability=reliability is not None,
    )
    rel = reliability[:, cols] if reliability is not None else None
    return agg.fit(answers, lengths, matrix.prompts, matrix.eval_names, training_reference(matrix), rel)


def fit_aggregators(
    matrix: OutcomeMatrix, workflows: Sequence[Workflow], l2: float = 3e-3, reliability: np.ndarray | None = None
) -> dict[tuple, PanelAggregator]:
    found: dict[tuple, PanelAggregator] = {}
    for w in workflows:
        if w.needs_aggregator and w.workers not in found:
            found[w.workers] = fit_aggregator(matrix, w.workers, l2, reliability)
    return found


def evaluate_workflows(
    matrix: OutcomeMatrix,
    workflows: Sequence[Workflow],
    aggregators: dict[tuple, PanelAggregator] | None = None,
    reliability: np.ndarray | None = None,
) -> Outcomes:
    n, A = len(matrix), len(workflows)
    scores, costs, calls = np.zeros((n, A)), np.zeros((n, A)), np.zeros((n, A))
    aggregators = aggregators or {}
    learned_cache: dict[tuple, list[str]] = {}

    def learned(workers: tuple) -> list[str]:
        if workers not in learned_cache:
            agg = aggregators.get(workers)
            if agg is None:
                raise ValueError(f"no aggregator fitted for panel {list(workers)}")
            cols = _columns(matrix, workers)
            lengths = matrix.output_chars[:, cols] if matrix.output_chars is not None else None
            rel = reliability[:, cols] if (reliability is not None and agg.use_reliability) else None
            learned_cache[workers] = agg.predict(matrix.answer_columns("a learned panel")[:, cols], lengths, matrix.prompts, matrix.eval_names, rel)
        return learned_cache[workers]

    for a, w in enumerate(workflows):
        cols = _columns(matrix, w.workers)
        if w.kind == "single":
            scores[:, a] = matrix.scores[:, cols[0]]
            costs[:, a] = matrix.costs[:, cols[0]]
            calls[:, a] = 1
            continue
        answers = matrix.answer_columns(f"workflow {w.name}")[:, cols]
        if w.kind == "vote":
            preds = [plurality(list(answers[i])) for i in range(n)]
            scores[:, a] = answer_scores(matrix, cols, preds)
            costs[:, a] = matrix.costs[:, cols].sum(1)
            calls[:, a] = len(cols)
        elif w.kind == "panel":
            scores[:, a] = answer_scores(matrix, cols, learned(w.workers))
            costs[:, a] = matrix.costs[:, cols].sum(1)
            calls[:, a] = len(cols)
        else:  # escalate
            full = learned(w.workers)
            head = answers[:, : w.first]
            agree = np.array([bool(h[0]) and all(x == h[0] for x in h) for h in head])
            preds = [head[i, 0] if agree[i] else full[i] for i in range(n)]
            scores[:, a] = answer_scores(matrix, cols, preds)
            head_cost = matrix.costs[:, cols[: w.first]].sum(1)
            costs[:, a] = np.where(agree, head_cost, matrix.costs[:, cols].sum(1))
            calls[:, a] = np.where(agree, w.first, len(cols))
    return Outcomes(list(workflows), scores, costs, calls)


def crossfit_outcomes(
    matrix: OutcomeMatrix,
    workflows: Sequence[Workflow],
    folds: int = 5,
    seed: int = 0,
    l2: float = 3e-3,
    reliability: np.ndarray | None = None,
) -> Outcomes:
    """Outcomes on the training matrix itself, with learned panels scored out of fold so their
    training rewards are not inflated by the aggregator having seen the row."""
    outcomes = evaluate_workflows(matrix, [w for w in workflows if not w.needs_aggregator])
    learned = [w for w in workflows if w.needs_aggregator]
    n, A = len(matrix), len(workflows)
    scores, costs, calls = np.zeros((n, A)), np.zeros((n, A)), np.zeros((n, A))
    plain_pos = {w.name: j for j, w in enumerate(outcomes.workflows)}
    for a, w in enumerate(workflows):
        if w.name in plain_pos:
            j = plain_pos[w.name]
            scores[:, a], costs[:, a], calls[:, a] = outcomes.scores[:, j], outcomes.costs[:, j], outcomes.calls[:, j]
    if learned:
        rng = np.random.default_rng(seed)
        fold_of = rng.permutation(n) % max(2, folds)
        learned_pos = [workflows.index(w) for w in learned]
        for f in range(max(2, folds)):
            test_rows = np.flatnonzero(fold_of == f)
            train_rows = np.flatnonzero(fold_of != f)
            if len(test_rows) == 0:
                continue
            rel_train = reliability[train_rows] if reliability is not None else None
            rel_test = reliability[test_rows] if reliability is not None else None
            aggs = fit_aggregators(matrix.subset(train_rows), learned, l2, rel_train)
            part = evaluate_workflows(matrix.subset(test_rows), learned, aggs, rel_test)
            for j, a in enumerate(learned_pos):
                scores[test_rows, a] = part.scores[:, j]
                costs[test_rows, a] = part.costs[:, j]
                calls[test_rows, a] = part.calls[:, j]
    return Outcomes(list(workflows), scores, costs, calls)
