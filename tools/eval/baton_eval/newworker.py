"""Replay of a new worker's first day: ``baton eval replay --train A --test B --new-worker NAME``.

NAME's column is hidden from training: the policy is fitted on the other workers only. The test
rows then arrive one at a time, as a stream (in a seeded shuffled order by default: outcome files
are often grouped by subject, and traffic is not). ``seed`` seeds the policies' fitting and
``stream_seed`` (``seed`` unless given) the stream's order and the choices' draws, so one fitted
reference can be replayed in many orders. The policy meets NAME knowing only its price
(its mean cost on TRAIN, as a price sheet would give it), explores it, learns from the rewards of
the rows it sent there (:mod:`baton_policy.newcomers`) and routes the rest. Two references run on
the same rows in the same order: the policy trained with NAME from the start, and the policy that
never sees it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from baton_eval.report import rounded
from baton_policy.aggregate import join, most_likely
from baton_policy.fastpolicy import Policy
from baton_policy.matrix import OutcomeMatrix, without
from baton_policy.newcomers import Newcomers
from baton_policy.templates import Workflow, answer_scores, candidate_workflows, evaluate_workflows

WINDOWS = 10


def _figures(scores: np.ndarray, costs: np.ndarray, calls: np.ndarray) -> dict:
    half = len(scores) // 2
    return {
        "accuracy": rounded(scores.mean()), "avg_cost": rounded(costs.mean(), 6), "calls_per_query": rounded(calls.mean(), 3),
        "last_half": {"accuracy": rounded(scores[half:].mean()), "avg_cost": rounded(costs[half:].mean(), 6)},
    }


def _greedy(policy: Policy, test: OutcomeMatrix, cost_weight: float):
    """The fitted policy's greedy choice on every test row, and its realised outcomes."""
    quality = policy.quality(test.prompts, test.eval_names)
    outcomes = evaluate_workflows(test, policy.workflows, policy.aggregators,
                                  policy.reliability(test.prompts, test.eval_names, quality=quality))
    pick = policy.values([], None, cost_weight, quality=quality).argmax(1)
    rows = np.arange(len(test))
    return quality, outcomes, pick, (outcomes.scores[rows, pick], outcomes.costs[rows, pick], outcomes.calls[rows, pick])


class _Joined:
    """A newcomer's panel on the test rows: the known panel's probabilities, the newcomer's answers,
    and what either answer scores. Its final answer (aggregate.join) is one of the two."""

    def __init__(self, test: OutcomeMatrix, hidden: OutcomeMatrix, newcomers: Newcomers, workers: tuple[str, ...],
                 quality: np.ndarray) -> None:
        *members, worker = workers
        cols = [hidden.models.index(m) for m in members]
        lengths = hidden.output_chars[:, cols] if hidden.output_chars is not None else None
        self.candidates, self.probs = newcomers.panel_probabilities(
            tuple(members), hidden.prompts, hidden.eval_names, hidden.answer_columns("a panel")[:, cols], lengths, quality)
        self.answers = test.answer_columns("a panel")[:, test.models.index(worker)]
        top = most_likely(self.candidates, self.probs)
        test_cols = [test.models.index(m) for m in workers]
        self.top, self.top_score = top, answer_scores(test, test_cols, top)
        self.answer_score = answer_scores(test, test_cols, list(self.answers))

    def score(self, i: int, p_right: float) -> float:
        answer = join(self.candidates[i], self.probs[i], self.answers[i], p_right)
        if answer and answer == self.answers[i]:
            return float(self.answer_score[i])
        return float(self.top_score[i]) if answer and answer == self.top[i] else 0.0


def run_new_worker(train: OutcomeMatrix, test: OutcomeMatrix, name: str, *, cost_weight: float = 0.0,
                   share: float = 0.1, seed: int = 0, stream_seed: int | None = None, order: str = "shuffled",
                   folds: int = 5, singles_only: bool = False, log=None) -> tuple[dict, dict]:
    """The JSON figures, and the per-row series behind the plot."""
    log = log or (lambda msg: None)
    if name not in train.models:
        raise ValueError(f"--new-worker {name!r} is not a model column of the files")
    if order not in ("shuffled", "file"):
        raise ValueError(f"stream order must be 'shuffled' or 'file', got {order!r}")

    def fit(matrix: OutcomeMatrix) -> Policy:
        flows = candidate_workflows(matrix, vote_sizes=(), panel_sizes=(), escalate=()) if singles_only else None
        return Policy.fit_matrix(matrix, flows, cost_weight=cost_weight, folds=folds, seed=seed)

    log(f"fitting the policy without {name}")
    absent = fit(without(train, [name]))
    log(f"fitting the policy with {name} (the reference)")
    trained_with = fit(train)

    hidden_test = without(test, [name])
    quality, outcomes, pick, absent_series = _greedy(absent, hidden_test, cost_weight)
    _, _, _, with_series = _greedy(trained_with, test, cost_weight)

    price = float(train.costs[:, train.models.index(name)].mean())
    newcomers = Newcomers(absent, {name: price}, share=share)
    actions = newcomers.newcomers
    features = newcomers.features(hidden_test.prompts, hidden_test.eval_names, quality)
    # A newcomer's panel costs and calls what a vote of its workers does; its score is _Joined's.
    new_outcomes = evaluate_workflows(test, [Workflow(a.name, "vote" if a.kind == "panel" else a.kind, a.workers)
                                             for a in actions])
    joined = {k: _Joined(test, hidden_test, newcomers, a.workers, quality)
              for k, a in enumerate(actions) if a.kind == "panel"}
    values = absent.values([], None, cost_weight, quality=quality)

    n = len(test)
    stream_seed = seed if stream_seed is None else stream_seed
    rng = np.random.default_rng(stream_seed)
    stream = rng.permutation(n) if order == "shuffled" else np.arange(n)
    scores, costs, calls = np.zeros(n), np.zeros(n), np.zeros(n)
    chose = np.full(n, -1)  # index into `actions`, -1: the policy's own choice
    for t, i in enumerate(stream):
        greedy, probs = newcomers.shares(features[i:i + 1], values[i:i + 1], quality[i:i + 1], cost_weight)
        k = int(rng.choice(probs.shape[1], p=probs[0] / probs[0].sum())) - 1
        if k < 0:
            a = int(greedy[0])
            scores[t], costs[t], calls[t] = outcomes.scores[i, a], outcomes.costs[i, a], outcomes.calls[i, a]
            continue
        chose[t] = k
        scores[t], costs[t], calls[t] = new_outcomes.scores[i, k], new_outcomes.costs[i, k], new_outcomes.calls[i, k]
        if k in joined:  # its answer depends on what the newcomer's head has learned by now
            scores[t] = joined[k].score(i, float(newcomers.reliability(name, features[i:i + 1])[0]))
        newcomers.update("", None, actions[k].name, float(scores[t]), test.sample_ids[i], features=features[i:i + 1])

    def ordered(series):
        return [s[stream] for s in series]

    with_s, absent_s = ordered(with_series), ordered(absent_series)
    windows = np.array_split(np.arange(n), WINDOWS)
    share_over_time = [rounded((chose[w] >= 0).mean()) for w in windows]
    reward = scores - cost_weight * costs / absent.cost_scale
    with_reward = with_s[0] - cost_weight * with_s[1] / absent.cost_scale
    regret = np.cumsum(with_reward - reward)
    half = n // 2
    result = {
        **_figures(scores, costs, calls),
        "new_worker": name,
        "cost_weight": cost_weight,
        "exploration_share": share,
        "stream_order": order,
        "seed": seed,
        "stream_seed": stream_seed,
        "n_train": len(train),
        "n_test": n,
        "price_used": rounded(price, 6),
        "prior_scale": newcomers.prior_scale,
        "actions": {a.name: {"workers": list(a.workers), "prior_quality": rounded(a.head.prior),
                             "share": rounded((chose == k).mean()),
                             "share_last_half": rounded((chose[half:] == k).mean()), "updates": a.head.updates}
                    for k, a in enumerate(actions)},
        "new_worker_share": rounded((chose >= 0).mean()),
        "new_worker_share_over_time": share_over_time,
        "with_new_worker_from_start": _figures(*with_s),
        "without_new_worker": _figures(*absent_s),
        "regret_vs_trained_with": {"total": rounded(regret[-1]), "per_query": rounded(regret[-1] / n),
                                   "last_half_per_query": rounded((regret[-1] - regret[half - 1]) / (n - half))},
    }
    series = {"online": scores, "with": with_s[0], "absent": absent_s[0], "chose": chose, "regret": regret}
    return result, series


def plot_new_worker(result: dict, series: dict, path: str | Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series["online"])
    x = np.arange(1, n + 1)
    width = max(25, n // 20)
    kernel = np.ones(width) / width

    def rolling(s):
        return np.convolve(np.asarray(s, dtype=float), kernel, mode="valid")

    xs = x[width - 1:]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 9), dpi=120, sharex=True,
                                              gridspec_kw={"height_ratios": [3, 2, 2]})
    top.plot(xs, rolling(series["online"]), label="online (meets it in the stream)", color="tab:blue")
    top.plot(xs, rolling(series["with"]), label="trained with it from the start", color="tab:green", alpha=0.8)
    top.plot(xs, rolling(series["absent"]), label="never sees it", color="tab:gray", alpha=0.8)
    top.set_ylabel(f"accuracy (rolling {width})")
    top.set_title(f"New worker {result['new_worker']} (W={result['cost_weight']})")
    top.legend(fontsize=8, loc="lower right")
    top.grid(alpha=0.3)
    # The running gap in points since the stream began: what the last-half and whole-stream
    # figures summarise, without the rolling window's noise.
    online = np.cumsum(series["online"])
    middle.plot(x, 100 * (online - np.cumsum(series["with"])) / x, color="tab:green",
                label="online minus trained with it")
    middle.plot(x, 100 * (online - np.cumsum(series["absent"])) / x, color="tab:gray",
                label="online minus never sees it")
    middle.axhline(0, color="black", lw=0.8)
    middle.set_ylabel("accuracy gap so far (points)")
    middle.set_ylim(-6, 10)
    middle.grid(alpha=0.3)
    middle.legend(fontsize=8, loc="upper right")
    chose = np.asarray(series["chose"])
    colours = ["tab:blue", "tab:purple", "tab:red", "tab:brown"]
    for k, action in enumerate(result["actions"]):
        bottom.plot(xs, rolling(chose == k), color=colours[k % len(colours)], label=f"share sent to {action}")
    bottom.plot(xs, rolling(chose >= 0), color="black", ls="--", lw=1, label="share with the new worker, in all")
    bottom.set_xlabel("queries in the stream")
    bottom.set_ylabel("share")
    bottom.set_ylim(-0.02, 1.05)
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return str(out)
