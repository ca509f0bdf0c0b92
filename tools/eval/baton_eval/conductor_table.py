"""`baton eval table`: every way Baton can route, scored on the same held-out rows of an outcome matrix.

    baton eval table --config config/examples/replay-pool.yaml --train A.csv --test B.csv \
        [--rows 200] [--cost-weight W] [--model DIR] [--adapter NAME=DIR ...] [--report DIR] [--json]

Rows of the table, each scored on `--rows` rows spread evenly over TEST as the config's worker pool sees
them (`pool_matrix`: one column per worker, each call priced in USD with the worker's prices; a worker
the matrix does not record, such as a local model, is scored wrong at no cost):

- the static plan: `conductor.plan`, the same workflow for every query;
- the best single worker of the pool, on these rows;
- the fast policy, trained on TRAIN with cost weight W (`baton eval replay`'s policy, on the pool), which
  is given each row's group (`eval_name`); then as served (`as_served`): without the group, which a
  served request seldom names and the LLM conductor's estimate is not given, at W and at the cost weight
  whose point is the most accurate at no more than the best single worker's cost;
- with `conductor.evidence` set, the worker the router's estimate puts first (what the LLM conductor is
  shown, followed blindly; the group is not given, as a served request names none);
- the LLM conductor untrained (`--model`, else the config's), and once per `--adapter` (a LoRA adapter
  from `baton-trainer warm-start` or `grpo`). Its plans are written by the router's own transformers
  backend, prompt, grammar and all, decoding greedily (`--temperature`); a plan the router would refuse
  is replaced by `conductor.fallback_plan`, as the router does, and counted as invalid. Its plan
  latency is measured on the first `--latency-rows` questions asked one at a time, as a lone client
  would wait for them; the table's plans are written in batches.

A plan is scored as replay scores it: its answer is its last worker's recorded answer, it costs the sum
of its steps' recorded costs, and every step is a call. For the LLM rows, `accuracy` is what the router
serves (an invalid plan answered by the fallback plan) and `own_accuracy` the conductor's own: an
invalid plan scores 0, as the GRPO reward scores it. `copied_example` is the share of plans the router
refused for copying the prompt's worked example (`baton_router.planning.COPIED_EXAMPLE`): their workers
would have been told to work on the example's arithmetic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from baton.v1 import common_pb2, requests_pb2
from baton_eval.report import rounded
from baton_platform.config import BatonConfig, ConfigError, load_config
from baton_router.conductor import build_backend
from baton_router.conductor.llm import ConductorUnavailable
from baton_router.planning import COPIED_EXAMPLE, Planner, PlanResult
from baton_workflow import CONDUCTOR


def score_plans(pool, plans: Sequence[Sequence[str]], wrong: Sequence[bool] | None = None) -> dict:
    """Accuracy, cost and calls of one plan per row of `pool` (a `pool_matrix`), plans given as worker
    names; `wrong[i]` scores row i's answer as wrong whatever its worker recorded. A conductor step is an
    inner call replay cannot score: it keeps the answer before it."""
    if len(plans) != len(pool):
        raise ValueError(f"{len(plans)} plans for {len(pool)} rows")
    column = {name: j for j, name in enumerate(pool.models)}
    scores, costs, calls = [], [], []
    for i, workers in enumerate(plans):
        ran = [w for w in workers if w != CONDUCTOR]
        # A worker the matrix does not record (a local model) is scored wrong, at no cost.
        last = column.get(ran[-1]) if ran else None
        scores.append(pool.scores[i, last] if last is not None and not (wrong and wrong[i]) else 0.0)
        costs.append(sum(pool.costs[i, column[w]] for w in ran if w in column))
        calls.append(len(ran))
    return {"accuracy": rounded(np.mean(scores)), "avg_cost": rounded(np.mean(costs), 6),
            "calls_per_query": rounded(np.mean(calls), 3)}


# Cost weights searched for the fast policy's most accurate point within a cost budget.
BUDGET_WEIGHTS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


def as_served(train, test, cost_weight: float, *, budget: float, log=print) -> tuple[dict, dict | None]:
    """The fast policy on `test` as a served request meets it: with no group (`eval_name`), which a
    client seldom names and the LLM conductor's estimate is not given either. Returns its replay at
    `cost_weight`, and the most accurate point of its frontier over BUDGET_WEIGHTS that costs no more
    than `budget` per query (None if none does): the fast policy at the same price as the rows it is
    compared with."""
    import dataclasses

    from baton_eval.replay import run_replay

    log(f"[table] fast policy as served (no group), W={cost_weight} and within {budget:.6f} USD per query")
    blank = dataclasses.replace(test, eval_names=[""] * len(test))
    replay, _, _ = run_replay(train, blank, cost_weight=cost_weight, frontier=BUDGET_WEIGHTS)
    affordable = [p for p in replay["frontier"] if p["avg_cost"] <= budget]
    return replay, max(affordable, key=lambda p: (p["accuracy"], -p["avg_cost"]), default=None)


def _policy_row(replay: dict) -> dict:
    return {k: replay[k] for k in ("accuracy", "avg_cost", "calls_per_query")} | {
        "plans": dict(list(replay["workflow_shares"].items())[:5])}


def _shares(plans: Sequence[Sequence[str]], top: int = 5) -> dict[str, float]:
    counts = Counter(" > ".join(p) for p in plans)
    return {k: rounded(v / len(plans), 3) for k, v in counts.most_common(top)}


def llm_config(config: BatonConfig, *, model: Path | None, adapter: Path | None, temperature: float) -> BatonConfig:
    data = config.model_dump(mode="python")
    conductor = data["conductor"]
    conductor["backend"] = "transformers"
    settings = conductor["transformers"]
    settings.update(temperature=temperature, adapter=adapter, seed=0)
    if model is not None:
        settings.update(model_path=model, gguf_file=None)
    return BatonConfig(**data)


async def write_plans(config: BatonConfig, questions: Sequence[str],
                      latency_rows: int = 0) -> tuple[list[PlanResult], float, list[float]]:
    """What the router would run for each question: its own backend and `Planner`, so an invalid plan is
    replaced by the safe plan exactly as when serving. Returns the plans, the seconds they took in all
    (asked together, so batched), and the seconds of each of the first `latency_rows` asked alone."""
    backend = build_backend(config.conductor, config.workers)
    planner = Planner(config.conductor, config.workers, backend)
    await backend.start()

    def ask(i: int, text: str) -> requests_pb2.ChatRequest:
        return requests_pb2.ChatRequest(request_id=f"eval-{i}", policy="baton",
                                        messages=[common_pb2.ChatMessage(role="user", content=text)])

    try:
        started = time.perf_counter()
        results = await asyncio.gather(*(planner.plan(ask(i, q)) for i, q in enumerate(questions)))
        seconds = time.perf_counter() - started
        alone = []
        for i, q in enumerate(questions[:latency_rows]):
            one = time.perf_counter()
            await planner.plan(ask(i, q))
            alone.append(time.perf_counter() - one)
    finally:
        await backend.aclose()
    return list(results), seconds, alone


def latency(seconds: Sequence[float]) -> dict:
    """Plan latency p50 and p99 in milliseconds (nearest rank)."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    rank = lambda q: ordered[min(len(ordered) - 1, max(0, int(np.ceil(q * len(ordered))) - 1))]  # noqa: E731
    return {"plan_ms_p50": rounded(rank(0.5) * 1000, 1), "plan_ms_p99": rounded(rank(0.99) * 1000, 1)}


def llm_row(pool, results: Sequence[PlanResult]) -> dict:
    plans = [[s.worker for s in r.plan.steps] for r in results]
    valid = [r.valid for r in results]
    copied = [COPIED_EXAMPLE in r.plan.invalid_reason for r in results]
    n = len(results)
    return {**score_plans(pool, plans), "own_accuracy": score_plans(pool, plans, wrong=[not v for v in valid])["accuracy"],
            "valid_share": rounded(sum(valid) / n, 3), "copied_example": rounded(sum(copied) / n, 3), "plans": _shares(plans)}


def run_table(config: BatonConfig, train_path: Path, test_path: Path, *, rows: int, cost_weight: float,
              model: Path | None, adapters: dict[str, Path], temperature: float, latency_rows: int = 0,
              untrained: bool = True, log=print) -> dict:
    from baton_eval.replay import refuse_shared_questions, run_replay
    from baton_policy.matrix import load_matrix
    from baton_trainer.grpo_data import matrix_column, pool_matrix

    train, test = load_matrix(train_path), load_matrix(test_path)
    # The pool's workers the matrices record; the LLM conductor still plans for the whole pool.
    scored = [w for w in config.workers if matrix_column(w, train.models) is not None]
    train, test = pool_matrix(train, scored), pool_matrix(test, scored)
    refuse_shared_questions(train, test)
    # Rows spread evenly over the file, which may be ordered by subject.
    test = test.subset(np.unique(np.linspace(0, len(test) - 1, min(rows, len(test))).round().astype(int)))
    n = len(test)
    table: dict[str, dict] = {}
    if config.conductor.plan is None:
        raise ValueError("the config sets no conductor.plan: the static plan's row needs one")
    static = list(config.conductor.plan.workers)
    table["static plan"] = {**score_plans(test, [static] * n), "plans": {" > ".join(static): 1.0}}
    singles = {w: score_plans(test, [[w]] * n) for w in test.models}
    best = max(singles, key=lambda w: (singles[w]["accuracy"], -singles[w]["avg_cost"]))
    table[f"best single ({best})"] = {**singles[best], "plans": {best: 1.0}}
    log(f"[table] fast policy on {len(train)} training rows, W={cost_weight}")
    replay, _, _ = run_replay(train, test, cost_weight=cost_weight)
    table[f"fast policy (W={cost_weight:g})"] = _policy_row(replay)
    served, within = as_served(train, test, cost_weight, budget=singles[best]["avg_cost"], log=log)
    table[f"fast policy as served (W={cost_weight:g})"] = _policy_row(served)
    if within is not None:
        table[f"fast policy as served, at most {best}'s cost (W={within['cost_weight']:g})"] = {
            k: within[k] for k in ("accuracy", "avg_cost", "calls_per_query")}
    if config.conductor.evidence is not None:
        from baton_policy.evidence import Evidence

        # What the LLM conductor is shown, followed blindly: the question's group is not given, as served.
        estimate = Evidence.load(config.conductor.evidence)
        first = [[estimate.workers[j]] for j in estimate.chances(test.prompts).argmax(1)]
        table["router's estimate, first worker"] = {**score_plans(test, first), "plans": _shares(first)}
    timing = {}
    llms = [("LLM conductor, untrained", None)] if untrained else []
    for label, adapter in [*llms, *((f"LLM conductor, {k}", v) for k, v in adapters.items())]:
        log(f"[table] {label}: planning {n} questions")
        llm = llm_config(config, model=model, adapter=adapter, temperature=temperature)
        results, seconds, alone = asyncio.run(write_plans(llm, test.prompts, latency_rows))
        table[label] = llm_row(test, results) | latency(alone)
        timing[label] = rounded(seconds, 1)
    return {"rows": n, "test": str(test_path), "train": str(train_path), "pool": test.models,
            "cost_source": "USD per query, each call priced with the worker's configured prices",
            "temperature": temperature, "table": table, "frontier": replay["frontier"],
            "singles": singles, "plan_seconds": timing}


def markdown(result: dict) -> str:
    lines = [f"{result['rows']} held-out rows of {result['test']}; pool {', '.join(result['pool'])}; "
             f"cost in {result['cost_source']}.", "",
             "| router | accuracy | its own plans' accuracy | cost per query (USD) | calls per query "
             "| valid plans | copied example | plan p50 / p99 (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in result["table"].items():
        valid = f"{row['valid_share']:.1%}" if "valid_share" in row else ""
        copied = f"{row['copied_example']:.1%}" if "copied_example" in row else ""
        own = f"{row['own_accuracy']:.4f}" if "own_accuracy" in row else ""
        plan_ms = f"{row['plan_ms_p50']:.0f} / {row['plan_ms_p99']:.0f}" if "plan_ms_p50" in row else ""
        lines.append(f"| {name} | {row['accuracy']:.4f} | {own} | {row['avg_cost']:.6f} "
                     f"| {row['calls_per_query']:.2f} | {valid} | {copied} | {plan_ms} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for name, row in result["singles"].items():
        ax.scatter([row["avg_cost"]], [row["accuracy"]], s=22, color="tab:gray", zorder=2)
        ax.annotate(name, (row["avg_cost"], row["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    pts = sorted(result["frontier"], key=lambda p: p["avg_cost"])
    ax.plot([p["avg_cost"] for p in pts], [p["accuracy"] for p in pts], "-o", color="tab:blue", ms=3,
            label="fast policy (several W)", zorder=3)
    marks = iter(["s", "D", "^", "v", "P", "X", "*"])
    for name, row in result["table"].items():
        if name.startswith("best single"):
            continue
        ax.scatter([row["avg_cost"]], [row["accuracy"]], marker=next(marks, "o"), s=60, label=name, zorder=4)
    ax.set_xlabel("average cost per query (USD)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"Routing on {result['rows']} held-out rows")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)  # the LLM rows may sit at the bottom right
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _adapter(item: str) -> tuple[str, Path]:
    name, sep, path = item.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--adapter takes NAME=DIR, got {item!r}")
    return name, Path(path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton eval table", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, type=Path, help="Baton YAML: its workers are the pool, each with a "
                   "column in the matrices (sim.column, else model, else name)")
    p.add_argument("--train", required=True, type=Path, help="outcome matrix the fast policy is trained on")
    p.add_argument("--test", required=True, type=Path, help="held-out outcome matrix (no question shared with TRAIN)")
    p.add_argument("--rows", type=int, default=200, help="score ROWS rows spread evenly over TEST (the LLM writes a plan each)")
    p.add_argument("--cost-weight", type=float, default=0.0, help="the fast policy's cost weight W")
    p.add_argument("--model", type=Path, help="the LLM conductor's base model directory; unset: the config's")
    p.add_argument("--adapter", type=_adapter, action="append", default=[], metavar="NAME=DIR",
                   help="a LoRA adapter (OUT/adapter of `baton-trainer warm-start` or `grpo`); repeatable")
    p.add_argument("--latency-rows", type=int, default=0, help="time the LLM's plans for the first N questions "
                   "asked one at a time (p50/p99)")
    p.add_argument("--no-untrained", action="store_true", help="leave out the untrained LLM conductor's row")
    p.add_argument("--temperature", type=float, default=0.0, help="the LLM conductor's sampling; 0 is greedy")
    p.add_argument("--report", type=Path, metavar="DIR", help="write table.md, cost_quality.png and result.json here")
    p.add_argument("--json", action="store_true", help="print the JSON object on one line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rows < 1:
        print(json.dumps({"error": "--rows must be at least 1"}))
        return 2
    try:
        config = load_config(args.config)
        result = run_table(config, args.train, args.test, rows=args.rows, cost_weight=args.cost_weight,
                           model=args.model, adapters=dict(args.adapter), temperature=args.temperature,
                           latency_rows=args.latency_rows, untrained=not args.no_untrained, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except (OSError, ValueError, ConfigError, ConductorUnavailable) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        (args.report / "table.md").write_text(markdown(result), encoding="utf-8")
        plot(result, args.report / "cost_quality.png")
    print(json.dumps(result) if args.json else markdown(result))
    return 0
