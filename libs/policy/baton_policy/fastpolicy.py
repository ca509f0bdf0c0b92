"""Fast CPU routing policy: query text -> workflow.

One logistic head per workflow predicts the expected quality score of that workflow for the
query (features: hashed prompt n-grams + eval name, see :mod:`features`). The policy picks

    argmax_a  quality_a(x) - W * cost_a / max_model_cost

where ``cost_a`` is the workflow's mean cost on the training data and ``max_model_cost`` the
mean per-call cost of the dearest single model, so W = 1 prices the dearest model's call at
one right answer. W is applied at choice time, so one fitted policy serves any cost weight.

Two ways to learn:

- :meth:`Policy.fit_matrix` - full information: every workflow's outcome is known for every
  training query (an outcome matrix, i.e. offline replay).
- :meth:`Policy.fit_logged` - bandit feedback: tuples of (query, action, reward, propensity) as
  logged by a serving policy. Each head is fitted on the rows where its action was taken,
  weighted by 1/propensity (clipped), i.e. inverse-propensity-weighted regression, so rows the
  logging policy rarely chose for that action count as much as they would have under uniform
  exploration.

With many actions the argmax over noisy heads favours whichever head happens to be
over-optimistic for a query (the winner's curse), and routing on text can then do worse than
always taking the best workflow. :meth:`Policy.fit_matrix` therefore measures, by grouped
cross-validation on the training rows only, how far the heads should be trusted at each cost
weight: values are ``mean_a + trust(W) * (quality_a(x) - mean_a) - W * cost_a / max_model_cost``
with ``trust`` in [0, 1] (1 = plain heads, 0 = the best fixed workflow at that price). The
table is stored with the policy; a policy saved without one uses trust 1. ``quality`` itself (and
so the escalation ranking and panel reliability) is not shrunk.

Rewards in [0, 1] are fitted as (possibly fractional) logistic targets; a wider reward range is
rescaled to [0, 1] for fitting and mapped back for prediction.

Persistence is a directory with ``policy.json`` and ``arrays.npz`` (loaded with
``allow_pickle=False``); nothing executable is stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression

from .aggregate import PanelAggregator, plurality
from .choice import Choice
from .features import TextFeaturizer
from .matrix import OutcomeMatrix
from .newcomers import measure_prior_scale
from .templates import Outcomes, Workflow, crossfit_outcomes, fit_aggregators, single

# 2: the featurizer may add a packaged sentence embedding (its config names it). A version-1
# directory holds the same fields without it and loads as it always did.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

TRUST_GRID = (0.0, 0.25, 0.5, 1.0)
TRUST_COST_WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


@dataclass
class Episode:
    """One logged decision. ``reward`` is the quality score when ``cost`` is given (the policy
    then trades it off against cost with its cost weight); otherwise it is used as the whole
    reward."""

    prompt: str
    action: str
    reward: float
    propensity: float
    eval_name: str | None = None
    cost: float | None = None


class ValueModel:
    """Per-action logistic heads on shared sparse features."""

    def __init__(self, n_actions: int, dim: int, C: float = 1.0):
        self.C = float(C)
        self.coef = np.zeros((n_actions, dim), dtype=np.float32)
        self.intercept = np.zeros(n_actions, dtype=np.float64)
        self.lo = 0.0
        self.hi = 1.0

    def _fit_head(self, a: int, X: sp.csr_matrix, y: np.ndarray, w: np.ndarray) -> None:
        if len(y) == 0:
            return
        mean = float(np.average(y, weights=w))
        if mean <= 1e-6 or mean >= 1 - 1e-6 or len(y) < 2:
            p = min(max(mean, 1e-3), 1 - 1e-3)
            self.coef[a] = 0.0
            self.intercept[a] = np.log(p / (1 - p))
            return
        binary = np.all((y == 0) | (y == 1))
        if binary:
            Xf, yf, wf = X, y.astype(int), w
        else:
            # Fractional targets: each row appears once as a success weighted by y and once as a
            # failure weighted by 1 - y, which is the cross-entropy on the fractional label.
            Xf = sp.vstack([X, X], format="csr")
            yf = np.concatenate([np.ones(len(y), int), np.zeros(len(y), int)])
            wf = np.concatenate([w * y, w * (1 - y)])
        # The dual solver suits many more features than rows, which is the usual case here.
        clf = LogisticRegression(C=self.C, solver="liblinear", dual=True, max_iter=2000, tol=1e-4)
        clf.fit(Xf, yf, sample_weight=wf)
        self.coef[a] = clf.coef_[0].astype(np.float32)
        self.intercept[a] = float(clf.intercept_[0])

    def set_range(self, rewards: np.ndarray) -> None:
        lo, hi = float(np.min(rewards)), float(np.max(rewards))
        self.lo, self.hi = min(0.0, lo), max(1.0, hi)

    def _scaled(self, r: np.ndarray) -> np.ndarray:
        return (r - self.lo) / (self.hi - self.lo)

    def fit_full(self, X: sp.csr_matrix, rewards: np.ndarray) -> ValueModel:
        self.set_range(rewards)
        w = np.ones(X.shape[0])
        for a in range(rewards.shape[1]):
            self._fit_head(a, X, self._scaled(rewards[:, a]), w)
        return self

    def fit_logged(
        self, X: sp.csr_matrix, actions: np.ndarray, rewards: np.ndarray, propensities: np.ndarray, clip: float
    ) -> ValueModel:
        self.set_range(rewards)
        weights = 1.0 / np.maximum(propensities, clip)
        overall = float(np.clip(np.average(self._scaled(rewards), weights=weights), 1e-3, 1 - 1e-3))
        for a in range(self.coef.shape[0]):
            rows = np.flatnonzero(actions == a)
            if len(rows) == 0:
                # Never logged: predict the average logged reward rather than an arbitrary value.
                self.intercept[a] = np.log(overall / (1 - overall))
                continue
            w = weights[rows] / weights[rows].mean()
            self._fit_head(a, X[rows], self._scaled(rewards[rows]), w)
        return self

    def predict(self, X: sp.csr_matrix) -> np.ndarray:
        z = np.asarray(X @ self.coef.T) + self.intercept
        return self.lo + (self.hi - self.lo) / (1.0 + np.exp(-z))


def oof_model_quality(
    matrix: OutcomeMatrix, folds: int = 5, seed: int = 0, C: float = 1.0, n_features_log2: int = 16,
    embedding: str | None = None,
) -> np.ndarray:
    """Out-of-fold text predictions of each model's score on the matrix's own rows, [n, models]."""
    n = len(matrix)
    out = np.zeros((n, len(matrix.models)))
    fold_of = np.random.default_rng(seed + 1).permutation(n) % max(2, folds)
    for f in range(max(2, folds)):
        held = np.flatnonzero(fold_of == f)
        rest = np.flatnonzero(fold_of != f)
        if len(held) == 0:
            continue
        feat = TextFeaturizer(n_features_log2, embedding=embedding).fit([matrix.prompts[i] for i in rest], [matrix.eval_names[i] for i in rest])
        Xr = feat.transform([matrix.prompts[i] for i in rest], [matrix.eval_names[i] for i in rest])
        Xh = feat.transform([matrix.prompts[i] for i in held], [matrix.eval_names[i] for i in held])
        vm = ValueModel(len(matrix.models), feat.dim, C).fit_full(Xr, matrix.scores[rest])
        out[held] = vm.predict(Xh)
    return out


def grouped_folds(prompts: Sequence[str], folds: int, seed: int = 0) -> np.ndarray:
    """Fold id per row; rows with the same question (see :func:`matrix.group_key`) share a fold.
    Groups are dealt round-robin in a seeded hash order, so folds have near-equal group counts."""
    import hashlib

    from .matrix import group_key

    keys = [group_key(p) for p in prompts]
    order = sorted(set(keys), key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    fold_of_key = {k: i % folds for i, k in enumerate(order)}
    return np.array([fold_of_key[k] for k in keys], dtype=int)


def tune_trust(
    quality: np.ndarray,
    scores: np.ndarray,
    costs: np.ndarray,
    fold_of: np.ndarray,
    cost_scale: float,
    cost_weights: Sequence[float] = TRUST_COST_WEIGHTS,
    grid: Sequence[float] = TRUST_GRID,
) -> list[float]:
    """Trust in the text heads per cost weight, from out-of-fold head predictions ``quality``
    [n, A] and the realised ``scores``/``costs`` [n, A] of every action on the same rows.

    For each W the reward of the greedy choice is measured for each trust level (the action
    means and costs come from the other folds, as they would at fitting time). The largest trust
    whose mean reward is within one standard error (of the paired per-row difference) of the best
    level is kept: full trust unless the data show that shrinking is better."""
    n, _ = quality.shape
    rows = np.arange(n)
    q_bar = np.zeros_like(quality)
    c_bar = np.zeros_like(quality)
    for f in np.unique(fold_of):
        held, rest = fold_of == f, fold_of != f
        q_bar[held] = scores[rest].mean(0)
        c_bar[held] = costs[rest].mean(0)
    out = []
    for W in cost_weights:
        rewards = []
        for lam in grid:
            pick = np.argmax(q_bar + lam * (quality - q_bar) - W * c_bar / cost_scale, axis=1)
            rewards.append(scores[rows, pick] - W * costs[rows, pick] / cost_scale)
        means = np.array([r.mean() for r in rewards])
        best = int(np.argmax(means))
        chosen = best
        for j in sorted(range(len(grid)), key=lambda j: -grid[j]):
            if grid[j] <= grid[best]:
                break
            d = rewards[j] - rewards[best]
            if d.mean() >= -d.std(ddof=1) / np.sqrt(n):
                chosen = j
                break
        out.append(float(grid[chosen]))
    return out


@dataclass
class Policy:
    featurizer: TextFeaturizer
    workflows: list[Workflow]
    value_model: ValueModel
    mean_costs: np.ndarray  # [A], in the matrix's cost units
    cost_scale: float  # mean per-call cost of the dearest single model
    cost_weight: float = 0.0
    epsilon: float = 0.0
    aggregators: dict[tuple, PanelAggregator] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    # Shrinkage of the heads towards the mean training quality per action, by cost weight
    # (see the module docstring); None = trust the heads fully (policies saved without it).
    prior_quality: np.ndarray | None = None  # [A] mean training quality per action
    trust: dict | None = None  # {"cost_weights": [...], "trust": [...]}

    # ------------------------------------------------------------------ construction

    @classmethod
    def fit_matrix(
        cls,
        matrix: OutcomeMatrix,
        workflows: Sequence[Workflow] | None = None,
        *,
        cost_weight: float = 0.0,
        folds: int = 5,
        seed: int = 0,
        C: float = 1.0,
        n_features_log2: int = 16,
        outcomes: Outcomes | None = None,
        panel_reliability: bool = False,
        tune_trust_folds: int = 3,
        embedding: str | None = None,
    ) -> Policy:
        """Fit on a full-information outcome matrix. Learned panels are scored out of fold
        for the value heads; with ``panel_reliability`` their aggregators also see each
        member's text-predicted chance of being right (out-of-fold on the training rows).
        ``tune_trust_folds`` (0 = off) sets the grouped cross-validation folds that measure how
        far the heads are trusted at each cost weight (see :func:`tune_trust`). ``embedding``
        names a packaged sentence embedding added to the query features (:mod:`embeddings`)."""
        from .templates import candidate_workflows

        workflows = list(workflows) if workflows is not None else candidate_workflows(matrix)
        reliability = None
        if panel_reliability and any(w.needs_aggregator for w in workflows):
            reliability = oof_model_quality(matrix, folds=folds, seed=seed, C=C, n_features_log2=n_features_log2,
                                            embedding=embedding)
        if outcomes is None:
            outcomes = crossfit_outcomes(matrix, workflows, folds=folds, seed=seed, reliability=reliability)
        featurizer = TextFeaturizer(n_features_log2, embedding=embedding).fit(matrix.prompts, matrix.eval_names)
        X = featurizer.transform(matrix.prompts, matrix.eval_names)
        value_model = ValueModel(len(workflows), featurizer.dim, C).fit_full(X, outcomes.scores)
        model_costs = matrix.costs.mean(0)
        cost_scale = float(model_costs.max()) if model_costs.max() > 0 else 1.0
        trust = None
        oof: np.ndarray | None = None
        if tune_trust_folds >= 2 and len(workflows) > 1:
            fold_of = grouped_folds(matrix.prompts, tune_trust_folds, seed)
            if len(np.unique(fold_of)) >= 2:
                oof = np.zeros_like(outcomes.scores)
                for f in np.unique(fold_of):
                    held, rest = np.flatnonzero(fold_of == f), np.flatnonzero(fold_of != f)
                    p_rest = [matrix.prompts[i] for i in rest]
                    e_rest = [matrix.eval_names[i] for i in rest]
                    feat = TextFeaturizer(n_features_log2, embedding=embedding).fit(p_rest, e_rest)
                    vm = ValueModel(len(workflows), feat.dim, C).fit_full(feat.transform(p_rest, e_rest), outcomes.scores[rest])
                    oof[held] = vm.predict(feat.transform([matrix.prompts[i] for i in held], [matrix.eval_names[i] for i in held]))
                weights = sorted(set(TRUST_COST_WEIGHTS) | {float(cost_weight)})
                trust = {
                    "cost_weights": weights,
                    "trust": tune_trust(oof, outcomes.scores, outcomes.costs, fold_of, cost_scale, weights),
                    "folds": int(tune_trust_folds),
                }
        policy = cls(
            featurizer=featurizer,
            workflows=list(workflows),
            value_model=value_model,
            mean_costs=outcomes.costs.mean(0),
            cost_scale=cost_scale,
            cost_weight=cost_weight,
            aggregators=fit_aggregators(matrix, workflows, reliability=reliability),
            prior_quality=outcomes.scores.mean(0) if trust is not None else None,
            trust=trust,
            meta={
                "trained_on": "matrix",
                "n_train": len(matrix),
                "models": list(matrix.models),
                "cost_source": matrix.cost_source,
                "train_quality": dict(zip([w.name for w in workflows], outcomes.scores.mean(0).round(4).tolist(), strict=True)),
            },
        )
        if oof is not None:
            # The trust folds' out-of-fold predictions also tell how far a worker's chance moves from
            # query to query, which sets the prior of the online heads of workers added later.
            policy.meta["newcomer_prior_scale"] = measure_prior_scale(policy, matrix.prompts, matrix.eval_names, oof,
                                                                      outcomes.scores, seed=seed)
        return policy

    @classmethod
    def fit_logged(
        cls,
        episodes: Iterable[Episode | tuple],
        workflows: Sequence[Workflow | str],
        *,
        cost_weight: float = 0.0,
        clip: float = 0.01,
        C: float = 1.0,
        n_features_log2: int = 16,
        cost_scale: float | None = None,
        embedding: str | None = None,
    ) -> Policy:
        """Learn from logged bandit feedback. ``episodes`` holds :class:`Episode` objects or
        tuples ``(prompt, action, reward, propensity[, eval_name[, cost]])``; ``workflows`` are
        Workflow objects or worker names (each then becomes a single-worker workflow)."""
        flows = [w if isinstance(w, Workflow) else single(w) for w in workflows]
        names = [w.name for w in flows]
        eps = [e if isinstance(e, Episode) else Episode(*e) for e in episodes]
        if not eps:
            raise ValueError("no episodes to learn from")
        index = {n: i for i, n in enumerate(names)}
        unknown = {e.action for e in eps} - set(index)
        if unknown:
            raise ValueError(f"episodes use actions that are not among the workflows: {sorted(unknown)}")
        props = np.array([e.propensity for e in eps], dtype=float)
        if np.any(props <= 0) or np.any(props > 1):
            raise ValueError("propensities must lie in (0, 1]")
        prompts = [e.prompt for e in eps]
        evals = [e.eval_name or "" for e in eps]
        featurizer = TextFeaturizer(n_features_log2, embedding=embedding).fit(prompts, evals)
        X = featurizer.transform(prompts, evals)
        actions = np.array([index[e.action] for e in eps])
        rewards = np.array([e.reward for e in eps], dtype=float)
        value_model = ValueModel(len(flows), featurizer.dim, C).fit_logged(X, actions, rewards, props, clip)
        mean_costs = np.zeros(len(flows))
        has_cost = all(e.cost is not None for e in eps)
        if has_cost:
            costs = np.array([e.cost for e in eps], dtype=float)
            for a in range(len(flows)):
                rows = actions == a
                if rows.any():
                    w = 1.0 / np.maximum(props[rows], clip)
                    mean_costs[a] = np.average(costs[rows], weights=w)
        single_costs = [mean_costs[i] for i, w in enumerate(flows) if w.kind == "single"]
        scale = cost_scale or (max(single_costs) if single_costs and max(single_costs) > 0 else 1.0)
        return cls(
            featurizer=featurizer,
            workflows=flows,
            value_model=value_model,
            mean_costs=mean_costs,
            cost_scale=float(scale),
            cost_weight=cost_weight if has_cost else 0.0,
            meta={"trained_on": "logged", "n_train": len(eps), "propensity_clip": clip, "has_cost": has_cost},
        )

    # ------------------------------------------------------------------ scoring

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workflows]

    def quality(self, prompts: Sequence[str], eval_names: Sequence[str | None] | None = None) -> np.ndarray:
        """Predicted quality score per workflow, shape [n, A]."""
        X = self.featurizer.transform(prompts, eval_names)
        return self.value_model.predict(X)

    def values(
        self,
        prompts: Sequence[str],
        eval_names: Sequence[str | None] | None = None,
        cost_weight: float | None = None,
        quality: np.ndarray | None = None,
    ) -> np.ndarray:
        W = self.cost_weight if cost_weight is None else cost_weight
        q = self.quality(prompts, eval_names) if quality is None else quality
        lam = self.trust_at(W)
        if lam < 1.0 and self.prior_quality is not None:
            q = self.prior_quality[None, :] + lam * (q - self.prior_quality[None, :])
        return q - W * self.mean_costs[None, :] / self.cost_scale

    def trust_at(self, cost_weight: float) -> float:
        """Trust in the text heads at this cost weight: the tuned value at the nearest tuned
        weight below or equal (1.0 when the policy has no table)."""
        if not self.trust or self.prior_quality is None:
            return 1.0
        ws = np.asarray(self.trust["cost_weights"], dtype=float)
        ts = np.asarray(self.trust["trust"], dtype=float)
        j = int(np.searchsorted(ws, float(cost_weight) + 1e-12, side="right")) - 1
        return float(ts[max(j, 0)])

    def reliability(
        self, prompts: Sequence[str], eval_names: Sequence[str | None] | None = None, quality: np.ndarray | None = None
    ) -> np.ndarray:
        """Predicted P(right) of every model the policy was trained on, [n, models] in
        ``meta["models"]`` order (0.5 for a model without a single-worker head)."""
        q = self.quality(prompts, eval_names) if quality is None else quality
        models = self.meta.get("models", [])
        heads = {w.workers[0]: a for a, w in enumerate(self.workflows) if w.kind == "single"}
        out = np.full((q.shape[0], len(models)), 0.5)
        for j, m in enumerate(models):
            if m in heads:
                out[:, j] = q[:, heads[m]]
        return out

    def member_reliability(self, members: Sequence[str], prompts: Sequence[str],
                           eval_names: Sequence[str | None] | None = None, quality: np.ndarray | None = None) -> np.ndarray:
        """:meth:`reliability` of a panel's members, [n, k] in their order (0.5 for an unknown one)."""
        full = self.reliability(prompts, eval_names, quality=quality)
        models = self.meta.get("models", [])
        return np.stack([full[:, models.index(m)] if m in models else np.full(len(full), 0.5) for m in members], 1)

    def choose_index(self, values: np.ndarray) -> np.ndarray:
        return np.argmax(values, axis=1)

    def choose(
        self,
        prompt: str,
        eval_name: str | None = None,
        *,
        cost_weight: float | None = None,
        epsilon: float | None = None,
        rng: np.random.Generator | None = None,
    ) -> Choice:
        """Pick a workflow. With ``epsilon`` > 0 (default: the policy's own), explores
        uniformly with that probability and reports the propensity of the returned choice."""
        v = self.values([prompt], [eval_name], cost_weight)[0]
        eps = self.epsilon if epsilon is None else float(epsilon)
        greedy = int(np.argmax(v))
        A = len(self.workflows)
        a = greedy
        if eps > 0:
            rng = rng or np.random.default_rng()
            if rng.random() < eps:
                a = int(rng.integers(A))
        propensity = (1 - eps) * (a == greedy) + eps / A
        w = self.workflows[a]
        return Choice(w.name, list(w.workers), float(propensity), w.kind, float(v[a]))

    def workflow(self, name: str) -> Workflow:
        for w in self.workflows:
            if w.name == name:
                return w
        raise KeyError(name)

    def aggregate(
        self,
        workflow: str,
        prompt: str,
        answers: Mapping[str, str],
        eval_name: str | None = None,
        output_chars: Mapping[str, float] | None = None,
    ) -> str:
        """Final answer of a panel workflow from its workers' answers (serving-time helper)."""
        w = self.workflow(workflow)
        row = [answers.get(m, "") or "" for m in w.workers]
        if w.kind == "single":
            return row[0]
        if w.kind == "vote":
            return plurality(row)
        if w.kind == "escalate":
            head = row[: w.first]
            if head[0] and all(h == head[0] for h in head):
                return head[0]
        agg = self.aggregators.get(w.workers)
        if agg is None:
            return plurality(row)
        lengths = None
        if output_chars is not None:
            lengths = np.array([[float(output_chars.get(m, np.nan)) for m in w.workers]])
        rel = self.member_reliability(w.workers, [prompt], [eval_name]) if agg.use_reliability else None
        return agg.predict(np.array([row], dtype=object), lengths, [prompt], [eval_name], rel)[0]

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {
            **self.featurizer.arrays(),
            "value_coef": self.value_model.coef,
            "value_intercept": self.value_model.intercept,
            "mean_costs": np.asarray(self.mean_costs, dtype=float),
        }
        if self.prior_quality is not None:
            arrays["prior_quality"] = np.asarray(self.prior_quality, dtype=float)
        aggs = []
        for i, (workers, agg) in enumerate(self.aggregators.items()):
            prefix = f"agg{i}_"
            arrays.update(agg.arrays(prefix))
            aggs.append({"prefix": prefix, "workers": list(workers), "config": agg.config()})
        config = {
            "format": "baton-fastpolicy",
            "version": FORMAT_VERSION,
            "featurizer": self.featurizer.config(),
            "workflows": [w.to_json() for w in self.workflows],
            "value_model": {"C": self.value_model.C, "lo": self.value_model.lo, "hi": self.value_model.hi},
            "cost_scale": self.cost_scale,
            "cost_weight": self.cost_weight,
            "epsilon": self.epsilon,
            "aggregators": aggs,
            "meta": self.meta,
        }
        if self.trust is not None:
            config["trust"] = self.trust
        (out / "policy.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        np.savez_compressed(out / "arrays.npz", **arrays)
        return out

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        src = Path(path)
        config = json.loads((src / "policy.json").read_text(encoding="utf-8"))
        if config.get("format") != "baton-fastpolicy":
            raise ValueError(f"{src} does not hold a baton fast policy")
        if config.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{src} holds a baton fast policy of version {config.get('version')!r}; this release "
                             f"reads versions {list(READABLE_VERSIONS)}: retrain it with this release's trainer")
        with np.load(src / "arrays.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        featurizer = TextFeaturizer.from_saved(config["featurizer"], arrays)
        workflows = [Workflow.from_json(d) for d in config["workflows"]]
        vm_cfg = config["value_model"]
        vm = ValueModel(len(workflows), featurizer.dim, vm_cfg["C"])
        vm.coef = arrays["value_coef"]
        vm.intercept = arrays["value_intercept"]
        vm.lo, vm.hi = vm_cfg["lo"], vm_cfg["hi"]
        aggregators = {
            tuple(a["workers"]): PanelAggregator.from_saved(a["config"], arrays, a["prefix"]) for a in config["aggregators"]
        }
        return cls(
            featurizer=featurizer,
            workflows=workflows,
            value_model=vm,
            mean_costs=arrays["mean_costs"],
            cost_scale=float(config["cost_scale"]),
            cost_weight=float(config["cost_weight"]),
            epsilon=float(config["epsilon"]),
            aggregators=aggregators,
            meta=config.get("meta", {}),
            prior_quality=arrays.get("prior_quality"),
            trust=config.get("trust"),
        )
