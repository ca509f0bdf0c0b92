"""Routing gains on held-out groups: the fast policy against the best single model of the test side, on
splits that hold out whole evaluations (subjects, tasks: `--by eval_name`) or random questions, for
several seeds, with the spread. A gain measured on one random split of one file can be a property of
that split; one that holds on subjects the policy never saw is one a new deployment can expect.

    baton eval heldout --in data/routing/mmlu_pro_dev.csv \\
        --models gemini-1.5-pro-002,gemini-1.5-flash-002,Meta-Llama-3_1-70B-Instruct --by eval_name --seeds 5

`--router estimate` scores instead what the LLM conductor is shown (`baton_policy.evidence`): one call to
the worker whose estimated chance is highest, the question's group hidden as a served request's is.

The best single model is chosen on the test side itself (the strongest a user could have picked in
hindsight), so the gain is a conservative one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from baton_eval.replay import run_replay
from baton_policy.evidence import Evidence
from baton_policy.matrix import OutcomeMatrix, from_rows, group_key, read_rows
from baton_trainer.split import split_indices


def held_out_split(matrix: OutcomeMatrix, by: str, seed: int, test_share: float) -> tuple[OutcomeMatrix, OutcomeMatrix]:
    """Train and test sides; a question that also sits on the training side (asked under two groups)
    leaves the test side, so no question is scored that was trained on."""
    groups = list(matrix.eval_names) if by == "eval_name" else None
    train_rows, test_rows = split_indices(matrix.prompts, test_share, seed, groups)
    seen = {group_key(matrix.prompts[i]) for i in train_rows}
    test_rows = [i for i in test_rows if group_key(matrix.prompts[i]) not in seen]
    return matrix.subset(train_rows), matrix.subset(test_rows)


def estimate_first(train: OutcomeMatrix, test: OutcomeMatrix, seed: int) -> dict:
    """One call per test question, to the worker the estimate fitted on `train` puts first (groups hidden)."""
    pick = Evidence.fit(train, seed=seed).chances(test.prompts).argmax(1)
    rows = np.arange(len(test))
    return {"accuracy": float(test.scores[rows, pick].mean()), "avg_cost": float(test.costs[rows, pick].mean()),
            "calls_per_query": 1.0}


def one_split(matrix: OutcomeMatrix, by: str, seed: int, test_share: float, cost_weight: float,
              router: str = "policy") -> dict:
    train, test = held_out_split(matrix, by, seed, test_share)
    if router == "estimate":
        result = estimate_first(train, test, seed)
    else:
        result, _, _ = run_replay(train, test, cost_weight=cost_weight, seed=seed)
    singles = test.scores.mean(0)
    best = int(singles.argmax())
    return {
        "seed": seed, "test_rows": len(test), "test_groups": sorted(set(test.eval_names)) if by == "eval_name" else None,
        "policy_accuracy": round(float(result["accuracy"]), 4), "policy_cost": float(result["avg_cost"]),
        "calls_per_query": float(result["calls_per_query"]), "best_single": test.models[best],
        "best_single_accuracy": round(float(singles[best]), 4), "best_single_cost": float(test.costs[:, best].mean()),
        "gain_points": round(100 * (float(result["accuracy"]) - float(singles[best])), 2),
    }


def run(matrix: OutcomeMatrix, *, by: str, seeds: int, test_share: float, cost_weight: float, router: str = "policy",
        log=None) -> dict:
    splits = []
    for seed in range(seeds):
        splits.append(one_split(matrix, by, seed, test_share, cost_weight, router))
        if log:
            log(json.dumps(splits[-1]))
    gains = [s["gain_points"] for s in splits]
    return {"router": router, "by": by, "seeds": seeds, "test_share": test_share, "cost_weight": cost_weight, "models": matrix.models,
            "gain_points_mean": round(statistics.mean(gains), 2),
            "gain_points_sd": round(statistics.stdev(gains), 2) if len(gains) > 1 else 0.0,
            "gain_points_min": min(gains), "gain_points_max": max(gains), "splits": splits}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton eval heldout", description=__doc__.split("\n\n")[0])
    p.add_argument("--in", dest="src", required=True, help="outcome CSV (RouterBench layout)")
    p.add_argument("--models", help="comma-separated model columns to route between (default: all)")
    p.add_argument("--by", choices=("question", "eval_name"), default="eval_name",
                   help="hold out whole evaluations (default) or random questions")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--test-share", type=float, default=0.3)
    p.add_argument("--cost-weight", type=float, default=0.0)
    p.add_argument("--router", choices=("policy", "estimate"), default="policy",
                   help="the fast policy (default), or one call to the worker the router's estimate puts first")
    args = p.parse_args(argv)
    try:
        header, rows = read_rows(args.src)
        matrix = from_rows(header, rows, models=args.models.split(",") if args.models else None)
        if args.seeds < 1:
            raise ValueError("--seeds must be at least 1")
        result = run(matrix, by=args.by, seeds=args.seeds, test_share=args.test_share, cost_weight=args.cost_weight,
                     router=args.router, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps(result))
    return 0
