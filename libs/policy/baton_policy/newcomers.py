"""Workers a fitted policy has never seen: traffic from the first request, learned online.

A fitted :class:`~baton_policy.fastpolicy.Policy` has one head per workflow it was trained on, so a
worker added to the configuration later would get no traffic until the trainer ran on episodes
that contain it, and no episode can contain it while it gets no traffic. :class:`Newcomers` breaks
that circle without a trainer run.

Each newcomer gets an online head: probit regression on what the policy already knows of a query
(see :class:`Newcomers`), with a Gaussian posterior over its weights that is updated in closed form
after each reward (assumed-density filtering, the update of Graepel et al., "Web-scale Bayesian
click-through rate prediction", ICML 2010, with a full covariance since the inputs are few). Its
prior mean is the training quality of the known workers priced like it (:func:`price_prior`); its
intercept's prior variance is wide, so its optimistic bound competes from the first request.

How far a worker's chance of being right moves from query to query with these inputs is what the
known workers show: :func:`measure_prior_scale` runs the same head on each known worker's own
training outcomes (its own column hidden) and keeps the prior scale of the weights under which
those outcomes were best predicted (the marginal likelihood, type-II maximum likelihood over a
grid). The trainer stores it with the policy. Too wide a prior, and a newcomer's per-query
posterior stays spread for as long as a stream lasts; too narrow, and it cannot learn where it is
strong.

Per query, the policy picks its greedy workflow by its values, which may shrink its heads toward
their training means (its trust, a ranking device: see :mod:`baton_policy.fastpolicy`); ``v`` is
that workflow's own predicted quality for the query, less its priced cost. At trust 0 the value is
the workflow's training mean on every query (comparing against the per-query prediction would keep a
newcomer away from subjects its head found hard, where the policy's choice does worse still). Each
newcomer k has an optimistic value: its quality with the score one
posterior sd above its mean (:data:`OPTIMISM`), less ``W * cost_k / scale``. The newcomer with the
best optimistic value takes the query when that value beats ``v``: where the head is unsure,
optimism sends it traffic and its rewards settle the question; where it is sure, it is used as it
deserves. Not Thompson sampling: it keeps choosing at random between options whose posteriors
overlap, so a newcomer a few points better is passed over a third of the time for the whole stream.
Every newcomer whose upper bound (mean + 2
sd) is above ``v`` keeps at least the exploration share. If the newcomers' shares sum past 1 they
are scaled down together; the rest goes to the policy's choice. Every share is exact, so the logged
propensity is exact.

Every router replica reads the same rewards and must reach the same heads: a fractional reward
becomes a 0/1 outcome by a hash of the episode's id, never by a random draw, and a reward already
applied is not applied twice.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import log_ndtr, ndtr, ndtri

from .choice import Choice

if TYPE_CHECKING:  # only annotations name Policy, and fastpolicy imports this module
    from .fastpolicy import Policy

BETA = 1.0  # probit noise scale: quality = Phi(w.x / BETA)
PRIOR_VAR = 1.0  # intercept variance: quality anywhere from about 0.1 to 0.9 at two sd
OPTIMISM = 1.0  # posterior sds above the mean at which a newcomer's quality competes
PRIOR_SCALES = (0.01, 0.03, 0.1, 0.3, 1.0)  # the grid measure_prior_scale chooses from
# For policies saved without a measured scale (fitted from logged episodes, or before it was
# measured): the scale the known workers of MMLU-Pro's dev split support.
DEFAULT_PRIOR_SCALE = 0.1


class OnlineHead:
    """Probit regression with a Gaussian posterior over its weights (full covariance: the inputs
    are few and correlated); one closed-form update per outcome. ``weight_var`` is each weight's
    prior variance; the intercept's is PRIOR_VAR."""

    def __init__(self, weight_var: np.ndarray, prior_quality: float) -> None:
        self.mean = np.zeros(len(weight_var) + 1)
        self.cov = np.diag(np.append(np.asarray(weight_var, dtype=float), PRIOR_VAR))
        p = float(np.clip(prior_quality, 0.02, 0.98))
        self.prior = p
        # Predictive quality with the features at zero is Phi(m / sqrt(BETA^2 + var)): solve it for p.
        self.mean[-1] = float(ndtri(p)) * np.sqrt(BETA**2 + PRIOR_VAR)
        self.updates = 0

    def stats(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the score ``w.x`` per row."""
        Z = np.hstack([X, np.ones((X.shape[0], 1))])
        return Z @ self.mean, np.einsum("ij,jk,ik->i", Z, self.cov, Z)

    def quality(self, X: np.ndarray) -> np.ndarray:
        mu, s2 = self.stats(X)
        return ndtr(mu / np.sqrt(BETA**2 + s2))

    def upper(self, X: np.ndarray, sds: float = 2.0) -> np.ndarray:
        """Quality at the score's mean plus ``sds`` standard deviations."""
        mu, s2 = self.stats(X)
        return ndtr((mu + sds * np.sqrt(s2)) / BETA)

    def update(self, x: np.ndarray, outcome: bool) -> None:
        z = np.append(np.asarray(x, dtype=float).ravel(), 1.0)
        _adf_step(self.mean[None], self.cov[None], z[None], np.array([1.0 if outcome else -1.0]))
        self.updates += 1


def _adf_step(mean: np.ndarray, cov: np.ndarray, z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One closed-form update, in place, of H heads' posteriors (``mean`` [H, d], ``cov`` [H, d, d])
    by one outcome each (``y`` [H] of +-1 at inputs ``z`` [H, d]); returns each outcome's
    predictive log probability before the update."""
    cz = np.einsum("hjk,hk->hj", cov, z)
    sigma2 = BETA**2 + np.einsum("hj,hj->h", z, cz)
    sigma = np.sqrt(sigma2)
    t = y * np.einsum("hj,hj->h", z, mean) / sigma
    log_p = log_ndtr(t)
    v = np.exp(-0.5 * t * t - 0.5 * np.log(2 * np.pi) - log_p)  # phi(t) / Phi(t)
    mean += (y * v / sigma)[:, None] * cz
    cov -= np.einsum("hj,hk->hjk", cz, cz) * (v * (v + t) / sigma2)[:, None, None]
    return log_p


def price_prior(known: Mapping[str, tuple[float, float]], cost: float) -> float:
    """Expected quality of a worker costing ``cost``: the known workers' (cost, quality), weighted
    by closeness in log cost, so a newcomer priced like the strong workers starts out like them."""
    if not known:
        return 0.5
    costs = np.array([c for c, _ in known.values()], dtype=float)
    quality = np.array([q for _, q in known.values()], dtype=float)
    floor = max(float(costs[costs > 0].min()) if np.any(costs > 0) else 1.0, 1e-12) / 10
    d = np.abs(np.log(np.maximum(costs, floor)) - np.log(max(cost, floor)))
    w = np.exp(-d)
    return float(np.average(quality, weights=w))


def feature_var(known: int, evals: int, scale: float) -> np.ndarray:
    """Prior variance of each weight of a newcomer head: the known workers' log-odds share one
    unit, each eval name a quarter, all times ``scale``."""
    return scale * np.concatenate([np.full(known, 1.0 / max(known, 1)), np.full(evals, 0.25)])


def log_evidence(X: np.ndarray, outcomes: np.ndarray, heads: Sequence[OnlineHead]) -> np.ndarray:
    """Log marginal likelihood of each head's outcomes, taken in row order: the sum of each
    outcome's predictive log probability before the head learns it (copies of the heads learn, all
    at once; the heads themselves are left as they are). ``X`` [n, d] or [H, n, d] are the inputs
    (per head when they differ), ``outcomes`` [n, H] 0/1."""
    mean = np.stack([h.mean for h in heads])
    cov = np.stack([h.cov for h in heads])
    X = np.broadcast_to(X, (len(heads), *X.shape[-2:]))
    Z = np.concatenate([X, np.ones((*X.shape[:2], 1))], axis=2)
    y = np.where(np.asarray(outcomes, dtype=bool), 1.0, -1.0)
    total = np.zeros(len(heads))
    for i in range(Z.shape[1]):
        total += _adf_step(mean, cov, Z[:, i], y[i])
    return total


def measure_prior_scale(policy: Policy, prompts: Sequence[str], eval_names: Sequence[str | None], quality: np.ndarray,
                        scores: np.ndarray, *, rows: int = 1000, seed: int = 0) -> float:
    """The scale of :func:`feature_var` that the known workers' outcomes support best.

    ``quality`` [n, A] are the policy's out-of-fold predictions on its training rows (a newcomer
    meets queries the heads were not fitted on) and ``scores`` [n, A] the outcomes. Each known
    worker in turn is treated as a newcomer: its head reads the others' log-odds and the eval
    name (its own column zeroed) and learns its outcomes on up to ``rows`` rows in a seeded
    order; the scale with the largest summed log evidence wins."""
    probe = Newcomers(policy, {})
    known = probe._known
    if not known or not len(prompts):
        return DEFAULT_PRIOR_SCALE
    take = np.random.default_rng(seed).permutation(len(prompts))[:rows]
    F = probe.features([prompts[i] for i in take], [eval_names[i] for i in take], np.asarray(quality)[take])
    Y = np.asarray(scores, dtype=float)[take][:, known]
    Y = np.array([[outcome_of(float(r), f"{seed}:{i}:{k}") for k, r in enumerate(row)] for i, row in zip(take, Y)])
    K, S = len(known), len(PRIOR_SCALES)
    own = np.ones((K, F.shape[1]))
    own[np.arange(K), np.arange(K)] = 0.0  # a newcomer has no head of its own among the inputs
    X = np.tile(F[None, :, :] * own[:, None, :], (S, 1, 1))  # head h: scale h // K, worker h % K
    heads = [OnlineHead(feature_var(K, probe._evals, c), q) for c in PRIOR_SCALES for q in Y.mean(0)]
    evidence = log_evidence(X, np.tile(Y, (1, S)), heads)
    return PRIOR_SCALES[int(np.argmax(evidence.reshape(S, K).sum(1)))]


def outcome_of(reward: float, key: str) -> bool:
    """A 0/1 outcome for a reward in [0, 1], drawn by ``key``'s hash so every replica agrees."""
    if reward >= 1.0:
        return True
    if reward <= 0.0:
        return False
    u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return u < reward


@dataclass
class Newcomer:
    """One action that involves a new worker: the worker alone, or a vote with it in a seat."""

    name: str
    workers: tuple[str, ...]
    kind: str
    cost: float  # expected cost of the action, in the policy's cost units
    head: OnlineHead


class Newcomers:
    """A fitted policy plus workers it does not know (see the module docstring).

    A newcomer's head reads what the policy already knows of a query: how likely each known
    worker is to get it right (centred log-odds of their heads: hard questions are hard for
    everyone), and its eval name when it has one. A few dozen weights learn from a few hundred
    rewards, where the policy's hashed text features would need thousands.

    ``removed`` names workers whose workflows must get no traffic (taken out of the
    configuration since the policy was trained)."""

    def __init__(self, policy: Policy, costs: Mapping[str, float], *, share: float = 0.1,
                 removed: Sequence[str] = (), priors: Mapping[str, float] | None = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"exploration share must lie in [0, 1], got {share}")
        self.policy = policy
        self.share = float(share)
        gone = set(removed)
        train_quality = policy.meta.get("train_quality", {})
        self._known = [a for a, w in enumerate(policy.workflows) if w.kind == "single" and not set(w.workers) & gone]
        self._centre = np.array([_logit(train_quality.get(policy.workflows[a].name, 0.5)) for a in self._known])
        self._evals = len(policy.featurizer.eval_names)
        self.prior_scale = float(policy.meta.get("newcomer_prior_scale", DEFAULT_PRIOR_SCALE))
        if not self.prior_scale > 0:
            raise ValueError(f"the policy's newcomer_prior_scale must be positive, got {self.prior_scale}")
        weight_var = feature_var(len(self._known), self._evals, self.prior_scale)
        known = {policy.workflows[a].name: (float(policy.mean_costs[a]), float(train_quality.get(policy.workflows[a].name, 0.5)))
                 for a in self._known}
        priors = dict(priors or {})
        self._allowed = np.array([not (set(w.workers) & gone) for w in policy.workflows])
        votes = [a for a, w in enumerate(policy.workflows) if w.kind == "vote" and self._allowed[a]]
        vote = min(votes, key=lambda a: len(policy.workflows[a].workers)) if votes else None
        panels = [a for a, w in enumerate(policy.workflows)
                  if w.kind == "panel" and self._allowed[a] and w.workers in policy.aggregators]
        panel = max(panels, key=lambda a: (train_quality.get(policy.workflows[a].name, 0.0),
                                           -len(policy.workflows[a].workers))) if panels else None
        self.newcomers = []
        for n, c in costs.items():
            prior = priors.get(n, price_prior(known, float(c)))
            self.newcomers.append(Newcomer(n, (n,), "single", float(c), OnlineHead(weight_var, prior)))
            if panel is not None:
                # The best learned panel (by training quality) with the new worker as one more
                # member: where panels beat any single worker, a strong newcomer helps most there.
                # The panel's fitted aggregator is kept and the newcomer's answer joins it weighed by
                # its own head (aggregate.join). A vote in a fixed seat, which this replaced, gave it
                # one voice whatever it was worth: on MMLU-Pro's dev split the last half of a replay
                # stayed 1.1-2.7 points behind the policy trained with it (mean 2.0, stream seeds
                # 0-7), against 0.4-2.2 (mean 1.1) now.
                base = policy.workflows[panel]
                q = float(train_quality.get(base.name, prior))
                self.newcomers.append(Newcomer(f"{base.name}+{n}", (*base.workers, n), "panel",
                                               float(c) + float(policy.mean_costs[panel]), OnlineHead(weight_var, q)))
            elif vote is not None:
                # The smallest vote with the new worker in the tie-breaking seat and the weakest
                # member out: where panels beat any single worker, a strong newcomer helps most
                # there. It learns its own head; a weak newcomer's vote soon stops being chosen.
                base = policy.workflows[vote]
                members = (n, *base.workers[:-1])
                cost = float(c) + sum(float(policy.mean_costs[policy.names.index(m)]) for m in base.workers[:-1]
                                      if m in policy.names)
                q = float(train_quality.get(base.name, prior))
                self.newcomers.append(Newcomer(f"{base.name}+{n}", members, "vote", cost, OnlineHead(weight_var, q)))
        if not self._allowed.any() and not self.newcomers:
            raise ValueError("every workflow of the policy uses a removed worker, and there is no other")
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # a router applies rewards on its loop and in a loading thread

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.newcomers]

    def reliability(self, worker: str, F: np.ndarray) -> np.ndarray:
        """A new worker's predicted chance of being right, per row of newcomer inputs ``F``."""
        single = next(n for n in self.newcomers if n.kind == "single" and n.workers == (worker,))
        return single.head.quality(F)

    def panel_probabilities(self, members: tuple[str, ...], prompts: Sequence[str], eval_names: Sequence[str | None],
                            answers: np.ndarray, lengths: np.ndarray | None = None,
                            quality: np.ndarray | None = None) -> tuple[list[list[str]], np.ndarray]:
        """The known panel's own candidates and probabilities (its fitted aggregator's)."""
        agg = self.policy.aggregators[members]
        rel = self.policy.member_reliability(members, prompts, eval_names, quality) if agg.use_reliability else None
        return agg.probabilities(answers, lengths if agg.use_lengths else None, prompts, eval_names, rel)

    def features(self, prompts: Sequence[str], eval_names: Sequence[str | None], quality: np.ndarray) -> np.ndarray:
        """Newcomer-head inputs [n, d] from the policy's predicted ``quality`` [n, A] of the rows."""
        transfer = _logit(quality[:, self._known]) - self._centre[None, :]
        X = self.policy.featurizer.transform(prompts, eval_names)
        evals = X[:, X.shape[1] - self._evals:].toarray() if self._evals else np.zeros((len(prompts), 0))
        return np.hstack([transfer, evals])

    def shares(self, F: np.ndarray, values: np.ndarray, quality: np.ndarray,
               cost_weight: float) -> tuple[np.ndarray, np.ndarray]:
        """For rows with newcomer inputs ``F``, the policy's ``values`` [n, A] (that rank its
        workflows) and its predicted ``quality`` [n, A] (that the newcomers compete with): the
        policy's greedy workflow per row, and the probability of each choice [n, 1 + K] (column 0:
        that workflow, then each newcomer)."""
        masked = np.where(self._allowed[None, :], values, -np.inf)
        greedy = masked.argmax(1)
        rows = np.arange(len(greedy))
        v = quality[rows, greedy] - cost_weight * self.policy.mean_costs[greedy] / self.policy.cost_scale
        probs = np.zeros((len(greedy), 1 + len(self.newcomers)))
        if not self.newcomers:
            probs[:, 0] = 1.0
            return greedy, probs
        priced = np.array([cost_weight * n.cost / self.policy.cost_scale for n in self.newcomers])
        optimistic = np.stack([n.head.upper(F, OPTIMISM) for n in self.newcomers], axis=1) - priced[None, :]
        competitive = np.stack([n.head.upper(F) for n in self.newcomers], axis=1) - priced[None, :] > v[:, None]
        probs[:, 1:] = np.where(competitive, self.share, 0.0)
        best = optimistic.argmax(1)
        wins = optimistic[rows, best] > v
        probs[rows[wins], 1 + best[wins]] = 0.0
        probs[rows[wins], 1 + best[wins]] = np.maximum(1.0 - probs[wins, 1:].sum(1), self.share)
        total = probs[:, 1:].sum(1)
        if not self._allowed.any():  # only newcomers are left
            probs[:, 1:] /= np.maximum(total, 1e-12)[:, None]
        else:
            over = total > 1
            probs[over, 1:] /= total[over, None]
        probs[:, 0] = np.clip(1.0 - probs[:, 1:].sum(1), 0.0, 1.0)
        return greedy, probs

    def choose(self, prompt: str, eval_name: str | None = None, *, cost_weight: float | None = None,
               epsilon: float = 0.0, rng: np.random.Generator | None = None) -> Choice:
        """One choice and its propensity. ``epsilon`` is the policy's own exploration: within the
        policy's share, that share of choices is uniform over its servable workflows."""
        W = self.policy.cost_weight if cost_weight is None else cost_weight
        q = self.policy.quality([prompt], [eval_name])
        F = self.features([prompt], [eval_name], q)
        greedy, probs = self.shares(F, self.policy.values([prompt], [eval_name], W, quality=q), q, W)
        rng = rng or np.random.default_rng()
        pick = int(rng.choice(probs.shape[1], p=probs[0] / probs[0].sum()))
        if pick == 0:
            allowed = np.flatnonzero(self._allowed)
            a = int(greedy[0])
            if epsilon > 0 and rng.random() < epsilon:
                a = int(rng.choice(allowed))
            within = (1 - epsilon) * (a == int(greedy[0])) + epsilon / len(allowed)
            w = self.policy.workflows[a]
            return Choice(w.name, list(w.workers), float(probs[0, 0] * within), w.kind)
        n = self.newcomers[pick - 1]
        return Choice(n.name, list(n.workers), float(probs[0, pick]), n.kind)

    def update(self, prompt: str, eval_name: str | None, action: str, reward: float, key: str,
               features: np.ndarray | None = None) -> bool:
        """Learn from the reward (quality in [0, 1]) of one episode; False when the action is not
        a newcomer or the episode (``key``) was already applied."""
        target = next((n for n in self.newcomers if n.name == action), None)
        if target is None:
            return False
        if features is None:
            features = self.features([prompt], [eval_name], self.policy.quality([prompt], [eval_name]))
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            target.head.update(features[0], outcome_of(reward, key))
        return True


def _logit(p):
    p = np.clip(np.asarray(p, dtype=float), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))
