"""Offline replay evaluation of the fast policy on outcome matrices.

CLI (the ``baton eval replay`` subcommand; ``argv`` excludes "eval replay")::

    --train TRAIN.csv --test TEST.csv [--cost-weight W] [--report DIR] [--json]
    [--unit-cost MODEL=COST ...] [--save-policy DIR] [--folds 5] [--seed 0]
    [--singles-only] [--panel-reliability] [--quality-target 0.95] [--strong-model M]
    [--embedding NAME]
    [--new-worker NAME [--new-worker-share 0.1] [--stream-order shuffled|file] [--stream-seed S]]

Prints one JSON object. The policy is trained on TRAIN only; every figure is measured on TEST.
Baselines: ``best_single`` is the single model with the highest TEST accuracy (the strictest
single-model baseline), ``oracle`` picks per query the cheapest single model with the best
score (RouterBench's oracle). ``calls_per_query`` counts worker calls: a panel of k is k calls,
an escalation counts the calls it actually made.

``escalation`` answers "what share of queries must go to the strong model to reach
``quality_target`` x its accuracy": queries are ranked by the policy's predicted quality margin
of the strong model over the best alternative, the top share goes to the strong model and the
rest to that alternative (the best other single model by predicted quality), and the share is
swept from 0 to 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from baton_eval.report import rounded
from baton_policy.embeddings import EMBEDDERS
from baton_policy.fastpolicy import Policy
from baton_policy.matrix import OutcomeMatrix, load_matrix
from baton_policy.templates import Outcomes, candidate_workflows, evaluate_workflows

DEFAULT_FRONTIER = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)



def policy_point(policy: Policy, quality: np.ndarray, outcomes: Outcomes, cost_weight: float) -> dict:
    values = policy.values([], None, cost_weight, quality=quality)
    pick = policy.choose_index(values)
    rows = np.arange(len(pick))
    names = policy.names
    shares = Counter(names[a] for a in pick)
    return {
        "cost_weight": cost_weight,
        "accuracy": rounded(outcomes.scores[rows, pick].mean()),
        "avg_cost": rounded(outcomes.costs[rows, pick].mean(), 6),
        "calls_per_query": rounded(outcomes.calls[rows, pick].mean(), 3),
        "avg_reward": rounded((outcomes.scores[rows, pick] - cost_weight * outcomes.costs[rows, pick] / policy.cost_scale).mean()),
        "workflow_shares": {k: rounded(v / len(pick)) for k, v in shares.most_common()},
    }


def single_model_table(test: OutcomeMatrix) -> dict[str, dict]:
    return {
        m: {"accuracy": rounded(test.scores[:, j].mean()), "avg_cost": rounded(test.costs[:, j].mean(), 6), "calls_per_query": 1.0}
        for j, m in enumerate(test.models)
    }


def oracle_point(test: OutcomeMatrix) -> dict:
    best = test.scores.max(1, keepdims=True)
    # Among the models reaching the best score, the cheapest one.
    masked_cost = np.where(test.scores >= best - 1e-12, test.costs, np.inf)
    pick = masked_cost.argmin(1)
    rows = np.arange(len(test))
    return {
        "accuracy": rounded(test.scores[rows, pick].mean()),
        "avg_cost": rounded(test.costs[rows, pick].mean(), 6),
        "calls_per_query": 1.0,
        "note": "per query, the cheapest single model with the best score",
    }


def escalation_curve(
    policy: Policy, quality: np.ndarray, outcomes: Outcomes, strong: str, target: float = 0.95
) -> dict:
    names = policy.names
    if strong not in names:
        raise ValueError(f"strong model {strong!r} is not a policy action")
    s = names.index(strong)
    # The question is about single-model routing, so panels are not alternatives here.
    others = [a for a, w in enumerate(policy.workflows) if a != s and w.kind == "single"]
    if not others:
        raise ValueError("escalation needs at least two single-model actions")
    alt_q = quality[:, others]
    alt = np.array(others)[alt_q.argmax(1)]
    margin = quality[:, s] - alt_q.max(1)
    order = np.argsort(-margin, kind="stable")
    rows = np.arange(len(margin))
    strong_scores = outcomes.scores[:, s]
    alt_scores = outcomes.scores[rows, alt]
    n = len(margin)
    gain = (strong_scores - alt_scores)[order]
    acc = (alt_scores.sum() + np.concatenate([[0.0], np.cumsum(gain)])) / n  # acc[j]: top j sent
    strong_acc = float(strong_scores.mean())
    goal = target * strong_acc
    reached = np.flatnonzero(acc >= goal - 1e-12)
    needed = int(reached[0]) if len(reached) else None
    curve = []
    for share in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        j = int(round(share * n))
        curve.append({"share_strong": share, "accuracy": rounded(acc[j])})
    alt_names = Counter(names[a] for a in alt)
    return {
        "strong": strong,
        "strong_accuracy": rounded(strong_acc),
        "target_fraction": target,
        "target_accuracy": rounded(goal),
        "share_needed": rounded(needed / n) if needed is not None else None,
        "threshold_margin": rounded(margin[order[needed - 1]]) if needed else None,
        "alternatives": dict(alt_names.most_common()),
        "random_routing_share_needed": rounded(_random_share(strong_scores, alt_scores, goal)),
        "curve": curve,
    }


def _random_share(strong: np.ndarray, alt: np.ndarray, goal: float) -> float:
    lo, hi = alt.mean(), strong.mean()
    if hi <= lo:
        return 0.0 if lo >= goal else 1.0
    return float(min(1.0, max(0.0, (goal - lo) / (hi - lo))))


def refuse_shared_questions(train: OutcomeMatrix, test: OutcomeMatrix) -> None:
    """A question in both files would be scored on what the policy was fitted to: the held-out
    figure would be optimistic by an unknown amount, so such a pair is refused, not reported."""
    shared = {p.strip() for p in train.prompts} & {p.strip() for p in test.prompts}
    if shared:
        example = next(iter(sorted(shared)))[:80]
        raise ValueError(f"train and test files share {len(shared)} question(s), e.g. {example!r}; "
                         "split one file with `python -m baton_trainer split` instead")


def run_replay(
    train: OutcomeMatrix,
    test: OutcomeMatrix,
    *,
    cost_weight: float = 0.0,
    folds: int = 5,
    seed: int = 0,
    singles_only: bool = False,
    quality_target: float = 0.95,
    strong_model: str | None = None,
    frontier: tuple[float, ...] = DEFAULT_FRONTIER,
    panel_reliability: bool = False,
    embedding: str | None = None,
    log=None,
) -> tuple[dict, Policy, dict]:
    if train.models != test.models:
        raise ValueError("train and test files must have the same model columns")
    refuse_shared_questions(train, test)
    log = log or (lambda msg: None)
    t0 = time.monotonic()
    workflows = candidate_workflows(train, vote_sizes=(), panel_sizes=(), escalate=()) if singles_only else candidate_workflows(train)
    log(f"{len(workflows)} workflows; fitting the policy (learned panels cross-fitted over {folds} folds)")
    policy = Policy.fit_matrix(train, workflows, cost_weight=cost_weight, folds=folds, seed=seed,
                               panel_reliability=panel_reliability, embedding=embedding)
    train_s = time.monotonic() - t0
    t1 = time.monotonic()
    quality = policy.quality(test.prompts, test.eval_names)
    reliability = policy.reliability(test.prompts, test.eval_names, quality=quality)
    outcomes = evaluate_workflows(test, policy.workflows, policy.aggregators, reliability)
    main_point = policy_point(policy, quality, outcomes, cost_weight)
    models = single_model_table(test)
    best_model = max(models, key=lambda m: (models[m]["accuracy"], -models[m]["avg_cost"]))
    train_acc = train.scores.mean(0)
    strong = strong_model or train.models[int(np.argmax(train_acc))]
    result = {
        "accuracy": main_point["accuracy"],
        "avg_cost": main_point["avg_cost"],
        "calls_per_query": main_point["calls_per_query"],
        "avg_reward": main_point["avg_reward"],
        "cost_weight": cost_weight,
        "cost_source": test.cost_description(),
        "cost_scale": rounded(policy.cost_scale, 6),
        "n_train": len(train),
        "n_test": len(test),
        "best_single": {"model": best_model, **models[best_model]},
        "oracle": oracle_point(test),
        "accuracy_gain_vs_best_single": rounded(main_point["accuracy"] - models[best_model]["accuracy"]),
        "workflow_shares": main_point["workflow_shares"],
        "workflows": {
            w.name: {
                "kind": w.kind,
                "workers": list(w.workers),
                "accuracy": rounded(outcomes.scores[:, a].mean()),
                "avg_cost": rounded(outcomes.costs[:, a].mean(), 6),
                "calls_per_query": rounded(outcomes.calls[:, a].mean(), 3),
            }
            for a, w in enumerate(policy.workflows)
            if w.kind != "single"
        },
        "models": models,
        "train_crossfit_accuracy": {
            k: v for k, v in policy.meta.get("train_quality", {}).items() if k in {w.name for w in policy.workflows if w.kind != "single"}
        },
        "value_trust": policy.trust,
        "escalation": escalation_curve(policy, quality, outcomes, strong, quality_target),
        "frontier": [policy_point(policy, quality, outcomes, w) for w in sorted(set(frontier) | {cost_weight})],
        "timing_s": {"train": rounded(train_s, 2), "evaluate": rounded(time.monotonic() - t1, 2)},
    }
    for p in result["frontier"]:
        p.pop("workflow_shares", None)
    return result, policy, {"outcomes": outcomes, "quality": quality}


# ---------------------------------------------------------------------- report


def write_report(result: dict, out_dir: str | Path, title: str = "Replay evaluation") -> dict[str, str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "cost_quality.png"
    _plot(result, png, title)
    (out / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    best, oracle = result["best_single"], result["oracle"]
    lines = [
        f"# {title}",
        "",
        f"Train rows: {result['n_train']}, test rows: {result['n_test']}. Cost: {result['cost_source']}.",
        f"Cost weight W = {result['cost_weight']} (reward = score - W x cost / {result['cost_scale']}, "
        "the mean per-call cost of the dearest model).",
        "",
        "| system | accuracy | avg cost | calls/query |",
        "|---|---|---|---|",
        f"| policy (W={result['cost_weight']}) | {result['accuracy']:.4f} | {result['avg_cost']:.4g} | {result['calls_per_query']:.2f} |",
        f"| best single: {best['model']} | {best['accuracy']:.4f} | {best['avg_cost']:.4g} | 1.00 |",
        f"| oracle (single models) | {oracle['accuracy']:.4f} | {oracle['avg_cost']:.4g} | 1.00 |",
        "",
        "## Policy across cost weights",
        "",
        "| W | accuracy | avg cost | calls/query |",
        "|---|---|---|---|",
    ]
    for p in result["frontier"]:
        lines.append(f"| {p['cost_weight']} | {p['accuracy']:.4f} | {p['avg_cost']:.4g} | {p['calls_per_query']:.2f} |")
    lines += ["", "## Workflow usage at the chosen W", ""]
    lines += [f"- {k}: {v:.1%}" for k, v in result["workflow_shares"].items()]
    if result["workflows"]:
        lines += ["", "## Panel workflows on their own", "", "| workflow | accuracy | avg cost | calls/query |", "|---|---|---|---|"]
        for k, v in result["workflows"].items():
            lines.append(f"| {k} | {v['accuracy']:.4f} | {v['avg_cost']:.4g} | {v['calls_per_query']:.2f} |")
    esc = result["escalation"]
    lines += [
        "",
        "## Escalation to the strong model",
        "",
        f"Strong model: {esc['strong']} (test accuracy {esc['strong_accuracy']:.4f}). Share of queries it must "
        f"receive to reach {esc['target_fraction']:.0%} of its accuracy ({esc['target_accuracy']:.4f}): "
        f"**{esc['share_needed']}** (random routing: {esc['random_routing_share_needed']}).",
        "",
        "## Single models",
        "",
        "| model | accuracy | avg cost |",
        "|---|---|---|",
    ]
    for m, v in sorted(result["models"].items(), key=lambda kv: -kv[1]["accuracy"]):
        lines.append(f"| {m} | {v['accuracy']:.4f} | {v['avg_cost']:.4g} |")
    lines += ["", f"![cost-quality]({png.name})", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return {"markdown": str(md), "plot": str(png), "json": str(out / "result.json")}


def _plot(result: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    models = result["models"]
    xs = [v["avg_cost"] for v in models.values()]
    ys = [v["accuracy"] for v in models.values()]
    ax.scatter(xs, ys, s=22, color="tab:gray", label="single models", zorder=2)
    top = sorted(models.items(), key=lambda kv: -kv[1]["accuracy"])[:6]
    for name, v in top:
        ax.annotate(name.split("/")[-1], (v["avg_cost"], v["accuracy"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for name, v in result.get("workflows", {}).items():
        ax.scatter([v["avg_cost"]], [v["accuracy"]], marker="s", s=24, color="tab:green", zorder=3)
        ax.annotate(name, (v["avg_cost"], v["accuracy"]), fontsize=7, color="tab:green", xytext=(3, -9), textcoords="offset points")
    pts = sorted(result["frontier"], key=lambda p: p["avg_cost"])
    ax.plot([p["avg_cost"] for p in pts], [p["accuracy"] for p in pts], "-o", color="tab:blue", ms=4, label="policy (several W)", zorder=4)
    for p in pts:
        ax.annotate(f"W={p['cost_weight']:g}", (p["avg_cost"], p["accuracy"]), fontsize=7, color="tab:blue", xytext=(3, 5), textcoords="offset points")
    o = result["oracle"]
    ax.scatter([o["avg_cost"]], [o["accuracy"]], marker="*", s=160, color="tab:red", label="oracle", zorder=5)
    ax.set_xlabel(f"average cost per query ({result['cost_source'].split(' (')[0]})")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------- CLI


def _parse_unit_costs(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--unit-cost takes MODEL=COST, got {item!r}")
        out[name] = float(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton eval replay", description="Train the fast routing policy on one outcome CSV and replay it on another.")
    p.add_argument("--train", required=True, help="training outcome CSV (RouterBench layout)")
    p.add_argument("--test", required=True, help="test outcome CSV with the same model columns")
    p.add_argument("--cost-weight", type=float, default=0.0, help="W in reward = score - W * cost / dearest model's mean cost")
    p.add_argument("--report", metavar="DIR", help="write report.md, cost_quality.png and result.json here")
    p.add_argument("--json", action="store_true", help="print the JSON object on one line")
    p.add_argument("--unit-cost", action="append", default=[], metavar="MODEL=COST", help="per-call cost for files without cost columns")
    p.add_argument("--save-policy", metavar="DIR", help="save the trained policy (policy.json + arrays.npz)")
    p.add_argument("--folds", type=int, default=5, help="cross-fitting folds for learned panels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--singles-only", action="store_true", help="route between single models only")
    p.add_argument("--panel-reliability", action="store_true",
                   help="learned panels also use each member's text-predicted reliability (slower; stacked out of fold)")
    p.add_argument("--embedding", choices=sorted(EMBEDDERS),
                   help="add this packaged sentence embedding of the prompt to the query features")
    p.add_argument("--quality-target", type=float, default=0.95, help="fraction of the strong model's accuracy for the escalation figure")
    p.add_argument("--strong-model", help="strong model for the escalation figure (default: most accurate on TRAIN)")
    p.add_argument("--new-worker", metavar="NAME", help="replay NAME's first day: hidden from training, met in the "
                   "test stream with only its price, explored and learned online (see baton_eval.newworker)")
    p.add_argument("--new-worker-share", type=float, default=0.1, help="exploration share for --new-worker")
    p.add_argument("--stream-order", choices=["shuffled", "file"], default="shuffled",
                   help="order of the test stream for --new-worker (shuffled with --stream-seed, or the file's)")
    p.add_argument("--stream-seed", type=int, help="seed of the --new-worker stream's order and draws (default: --seed, "
                   "which seeds the fitting); vary it alone to replay one fitted reference in other orders")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(f"[replay] {msg}", file=sys.stderr, flush=True))
    try:
        unit_costs = _parse_unit_costs(args.unit_cost)
        train = load_matrix(args.train, unit_costs=unit_costs)
        test = load_matrix(args.test, unit_costs=unit_costs)
        if args.new_worker:
            return _new_worker(args, train, test, log)
        result, policy, _ = run_replay(
            train,
            test,
            cost_weight=args.cost_weight,
            folds=args.folds,
            seed=args.seed,
            singles_only=args.singles_only,
            quality_target=args.quality_target,
            strong_model=args.strong_model,
            panel_reliability=args.panel_reliability,
            embedding=args.embedding,
            log=log,
        )
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    result["train_file"], result["test_file"] = args.train, args.test
    if args.save_policy:
        result["policy_dir"] = str(policy.save(args.save_policy))
    if args.report:
        result["report"] = write_report(result, args.report, title=f"Replay: {Path(args.test).name}")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _new_worker(args, train: OutcomeMatrix, test: OutcomeMatrix, log) -> int:
    from baton_eval.newworker import plot_new_worker, run_new_worker

    if train.models != test.models:
        raise ValueError("train and test files must have the same model columns")
    refuse_shared_questions(train, test)
    result, series = run_new_worker(train, test, args.new_worker, cost_weight=args.cost_weight,
                                    share=args.new_worker_share, seed=args.seed, stream_seed=args.stream_seed,
                                    order=args.stream_order,
                                    folds=args.folds, singles_only=args.singles_only, log=log)
    result["train_file"], result["test_file"] = args.train, args.test
    if args.report:
        result["plot"] = plot_new_worker(result, series, Path(args.report) / "new_worker.png")
        (Path(args.report) / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
