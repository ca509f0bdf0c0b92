"""Learned answer aggregation for a panel of workers.

Given the answers a panel returned for one query, pick the final answer with a conditional logit
over the candidate answers: each candidate gets a score from linear features and the softmax
over one query's candidates is fitted to the reference answer. Features describe only what the
panel produced for this query (who voted for the candidate, how long each voter's output was),
the prompt's option list and eval name, and optionally each member's predicted chance of being
right on this prompt (from the policy's text model); nothing about workers outside the panel is
used, so the same features are available at serving time after the panel has answered.

Discriminative weights matter because panel members are strongly correlated: a plain or
accuracy-weighted vote over-counts models that err together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

LETTERS = "ABCDEFGHIJ"
_OPTION = re.compile(r"(?:^|\n)\s*\(?([A-J])[.)]\s+(.*)")


def parse_options(prompt: str) -> dict[str, str]:
    """Option letter -> option text for prompts that list options as ``A. ...`` lines."""
    found: dict[str, str] = {}
    for m in _OPTION.finditer(prompt):
        found.setdefault(m.group(1), m.group(2).strip())
    return found


def plurality(answers: Sequence[str]) -> str:
    """Most frequent non-empty answer; ties go to the answer given by the earliest panel member."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for pos, a in enumerate(answers):
        if a:
            counts[a] = counts.get(a, 0) + 1
            first.setdefault(a, pos)
    if not counts:
        return ""
    return max(counts, key=lambda a: (counts[a], -first[a]))


@dataclass
class _Batch:
    feats: np.ndarray  # [n, C, d]
    mask: np.ndarray  # [n, C] bool
    candidates: list[list[str]]


class PanelAggregator:
    """Conditional-logit aggregator for a fixed, ordered panel of workers."""

    def __init__(
        self,
        members: Sequence[str],
        letters: bool,
        eval_names: Sequence[str] = (),
        use_lengths: bool = True,
        l2: float = 3e-3,
        use_reliability: bool = False,
    ):
        self.members = list(members)
        self.letters = bool(letters)
        self.eval_names = list(eval_names)
        self.use_lengths = bool(use_lengths)
        self.use_reliability = bool(use_reliability)
        self.l2 = float(l2)
        self.len_mean = np.zeros(len(self.members))
        self.len_std = np.ones(len(self.members))
        self.weights: np.ndarray | None = None

    # ------------------------------------------------------------------ features

    @property
    def n_candidates(self) -> int:
        return len(LETTERS) if self.letters else len(self.members)

    def _dim(self) -> int:
        k, e = len(self.members), len(self.eval_names)
        d = k + 4  # votes, count, share, is-top, share*is-top
        if self.use_lengths:
            d += 2 * k
        if self.letters:
            d += len(LETTERS) + 2  # letter identity, option-length z, is-longest option
        d += e * k + e  # eval x voter, eval x share
        if self.use_reliability:
            d += k + 1  # voter x predicted log-odds of being right, and their sum
        return d

    def _features(
        self,
        answers: np.ndarray,  # [n, k] str
        lengths: np.ndarray | None,  # [n, k] float (raw output chars) or None
        prompts: Sequence[str],
        eval_names: Sequence[str | None],
        reliability: np.ndarray | None = None,  # [n, k] predicted P(member right | query)
    ) -> _Batch:
        n, k = answers.shape
        if self.use_reliability:
            if reliability is None:
                raise ValueError("this aggregator needs per-member reliability predictions")
            r = np.clip(np.asarray(reliability, dtype=float), 0.02, 0.98)
            logit = np.log(r / (1 - r))
        C, d = self.n_candidates, self._dim()
        feats = np.zeros((n, C, d), dtype=np.float64)
        mask = np.zeros((n, C), dtype=bool)
        eval_index = {name: j for j, name in enumerate(self.eval_names)}
        z = None
        if self.use_lengths:
            raw = np.log1p(np.nan_to_num(lengths, nan=0.0)) if lengths is not None else np.zeros((n, k))
            z = (raw - self.len_mean) / self.len_std
        all_candidates: list[list[str]] = []
        for i in range(n):
            row = [str(a) if a is not None else "" for a in answers[i]]
            if self.letters:
                options = parse_options(prompts[i])
                cands = list(LETTERS)
                valid = [c in options or c in row for c in cands]
                if not any(valid):
                    valid = [True] * len(cands)
            else:
                cands = []
                for a in row:
                    if a and a not in cands:
                        cands.append(a)
                valid = [True] * len(cands)
            all_candidates.append(cands)
            votes = np.array([[1.0 if a == c else 0.0 for a in row] for c in cands]).reshape(len(cands), k)
            answered = max(sum(1 for a in row if a), 1)
            count = votes.sum(1)
            top = (count == count.max()) & (count > 0) if len(cands) else count
            share = count / answered
            col = 0
            f = feats[i, : len(cands)]
            f[:, col : col + k] = votes
            col += k
            f[:, col] = count
            f[:, col + 1] = share
            f[:, col + 2] = top
            f[:, col + 3] = share * top
            col += 4
            if self.use_lengths:
                assert z is not None  # lengths were given (use_lengths)
                f[:, col : col + k] = votes * z[i]
                f[:, col + k : col + 2 * k] = votes * z[i] ** 2
                col += 2 * k
            if self.letters:
                f[:, col : col + len(LETTERS)] = np.eye(len(LETTERS))
                col += len(LETTERS)
                options = parse_options(prompts[i])
                if options:
                    lens = np.array([np.log1p(len(options.get(c, ""))) for c in cands])
                    present = np.array([c in options for c in cands])
                    mu, sd = lens[present].mean(), lens[present].std() + 1e-6
                    f[:, col] = np.where(present, (lens - mu) / sd, 0.0)
                    f[:, col + 1] = present & (lens == lens[present].max())
                col += 2
            name = eval_names[i]
            j = eval_index.get(name) if name else None
            e = len(self.eval_names)
            if j is not None:
                f[:, col + j * k : col + (j + 1) * k] = votes
                f[:, col + e * k + j] = share
            col += e * k + e
            if self.use_reliability:
                f[:, col : col + k] = votes * logit[i]
                f[:, col + k] = (votes * logit[i]).sum(1)
            mask[i, : len(cands)] = valid
        return _Batch(feats, mask, all_candidates)

    # ------------------------------------------------------------------ fit / predict

    def fit(
        self,
        answers: np.ndarray,
        lengths: np.ndarray | None,
        prompts: Sequence[str],
        eval_names: Sequence[str | None],
        reference: Sequence[str],
        reliability: np.ndarray | None = None,
    ) -> PanelAggregator:
        if self.use_lengths and lengths is not None:
            raw = np.log1p(np.nan_to_num(lengths, nan=0.0))
            self.len_mean = raw.mean(0)
            self.len_std = raw.std(0) + 1e-6
        elif lengths is None:
            self.use_lengths = False
        if reliability is None:
            self.use_reliability = False
        batch = self._features(answers, lengths, prompts, eval_names, reliability)
        target = np.full(len(reference), -1)
        for i, ref in enumerate(reference):
            if ref in batch.candidates[i]:
                c = batch.candidates[i].index(ref)
                if batch.mask[i, c]:
                    target[i] = c
        keep = target >= 0
        F, M, y = batch.feats[keep], batch.mask[keep], target[keep]
        n, _, d = F.shape
        if n == 0:
            self.weights = np.zeros(d)
            self.weights[len(self.members) + 1] = 1.0  # fall back to the vote share
            return self
        rows = np.arange(n)
        l2 = self.l2

        def loss_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
            s = np.where(M, F @ w, -1e30)
            s = s - s.max(1, keepdims=True)
            e = np.exp(s)
            Z = e.sum(1)
            p = e / Z[:, None]
            loss = -(s[rows, y] - np.log(Z)).mean() + l2 * w @ w
            grad = (np.einsum("nc,ncd->d", p, F) - F[rows, y].sum(0)) / n + 2 * l2 * w
            return float(loss), grad

        w0 = np.zeros(d)
        w0[len(self.members) + 1] = 1.0  # start from a plain vote
        res = minimize(loss_grad, w0, jac=True, method="L-BFGS-B", options={"maxiter": 400})
        self.weights = res.x
        return self

    def probabilities(
        self,
        answers: np.ndarray,
        lengths: np.ndarray | None,
        prompts: Sequence[str],
        eval_names: Sequence[str | None],
        reliability: np.ndarray | None = None,
    ) -> tuple[list[list[str]], np.ndarray]:
        """Each row's candidate answers, and the probability of each being right [n, C] (0 past a
        row's candidates and where a candidate is not valid; a row without any is all 0)."""
        if self.weights is None:
            raise RuntimeError("aggregator is not fitted")
        batch = self._features(answers, lengths, prompts, eval_names, reliability)
        scores = np.where(batch.mask, batch.feats @ self.weights, -np.inf)
        top = scores.max(1, keepdims=True)
        e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
        total = e.sum(1, keepdims=True)
        return batch.candidates, np.divide(e, total, out=np.zeros_like(e), where=total > 0)

    def predict(
        self,
        answers: np.ndarray,
        lengths: np.ndarray | None,
        prompts: Sequence[str],
        eval_names: Sequence[str | None],
        reliability: np.ndarray | None = None,
    ) -> list[str]:
        return most_likely(*self.probabilities(answers, lengths, prompts, eval_names, reliability))

    # ------------------------------------------------------------------ persistence

    def config(self) -> dict:
        return {
            "members": self.members,
            "letters": self.letters,
            "eval_names": self.eval_names,
            "use_lengths": self.use_lengths,
            "l2": self.l2,
            "use_reliability": self.use_reliability,
        }

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        assert self.weights is not None
        return {
            f"{prefix}weights": self.weights,
            f"{prefix}len_mean": self.len_mean,
            f"{prefix}len_std": self.len_std,
        }

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray], prefix: str) -> PanelAggregator:
        obj = cls(
            config["members"],
            config["letters"],
            config["eval_names"],
            config["use_lengths"],
            config["l2"],
            config.get("use_reliability", False),
        )
        obj.weights = np.asarray(arrays[f"{prefix}weights"], dtype=float)
        obj.len_mean = np.asarray(arrays[f"{prefix}len_mean"], dtype=float)
        obj.len_std = np.asarray(arrays[f"{prefix}len_std"], dtype=float)
        return obj


def most_likely(candidates: Sequence[Sequence[str]], probs: np.ndarray) -> list[str]:
    """Each row's most likely candidate (:meth:`PanelAggregator.probabilities`); "" for a row without any."""
    return [c[int(np.argmax(probs[i, : len(c)]))] if c and probs[i].any() else "" for i, c in enumerate(candidates)]


def join(candidates: Sequence[str], probs: np.ndarray, answer: str, p_right: float) -> str:
    """A fitted panel's answer once one more worker, which the aggregator never saw, has answered
    too (naive Bayes): that worker is right with probability ``p_right`` and otherwise gives any
    of the other candidates alike; ``probs`` are the panel's own (:meth:`PanelAggregator.probabilities`).
    The worker's answer gains ``log(p_right * (m - 1) / (1 - p_right))`` over the rest, ``m``
    being the number of candidates (with its answer when the panel did not give it), and never
    loses: an estimate below chance is likelier the head's error than a worker that avoids the truth.
    An answer no member gave starts as likely as the panel's least likely one."""
    p = np.asarray(probs, dtype=float)[: len(candidates)]
    scores = {c: float(np.log(p[j])) for j, c in enumerate(candidates) if p[j] > 0}
    if answer:
        q = float(np.clip(p_right, 0.02, 0.98))
        m = len(scores) + (answer not in scores)
        if m > 1:
            scores[answer] = scores.get(answer, min(scores.values(), default=0.0)) + max(0.0, float(np.log(q * (m - 1) / (1 - q))))
        else:
            scores[answer] = 0.0
    return max(scores, key=lambda c: scores[c]) if scores else ""


def is_letter_task(answers: np.ndarray) -> bool:
    values = {a for a in answers.ravel() if a}
    return bool(values) and all(len(a) == 1 and a in LETTERS for a in values)
