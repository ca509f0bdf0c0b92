"""The router's estimate of each worker's chance to answer a question right, for the LLM conductor's prompt.

A small conductor guessing from capability cards cannot know that this algebra question is one the
cheap worker gets right and the strong one does not; an outcome matrix can. `Evidence` holds what the
fast policy learns from one: a head per worker predicting its chance to be right from the question's
text and group (its `eval_name`, e.g. the MMLU-Pro subject), shrunk towards the worker's mean as far as
cross-validation trusts it (`Policy.values` at cost weight 0). A served request seldom names its group,
so a classifier over the same text features guesses it when it is missing, and the guessed group
counts as far as the classifier is sure of it (`Evidence.chances`): a question from a subject the
estimate never saw should not be routed as if it were from the nearest one it knows.

The conductor's prompt shows the estimate (`baton_conductor.prompt.evidence_note`), so the model plans
with evidence rather than from cards alone. The trainer shows out-of-fold estimates on its training
questions (`out_of_fold`), so the conductor learns from estimates as good as those it will be served.

Persistence is a directory: `evidence.json`, the fast policy's own directory (`policy/`) and
`groups.npz` (the classifier's weights, loaded with `allow_pickle=False`); nothing executable is stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

from .fastpolicy import Policy, grouped_folds
from .matrix import OutcomeMatrix
from .templates import single

FORMAT = "baton-evidence"
VERSION = 1


@dataclasses.dataclass
class GroupGuess:
    """A linear classifier from a policy's text features (the group one-hot left blank) to a group."""

    groups: list[str]
    coef: np.ndarray  # [groups, dim] float32
    intercept: np.ndarray  # [groups]

    @classmethod
    def fit(cls, policy: Policy, prompts: Sequence[str], groups: Sequence[str], C: float = 10.0) -> GroupGuess | None:
        known = sorted({g for g in groups if g})
        if len(known) < 2:
            return None
        rows = [i for i, g in enumerate(groups) if g]
        X = policy.featurizer.transform([prompts[i] for i in rows], None)
        clf = LogisticRegression(C=C, max_iter=3000).fit(X, [groups[i] for i in rows])
        coef, intercept = clf.coef_, clf.intercept_
        if len(clf.classes_) == 2:  # one row of weights for two classes: the first class scores 0
            coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
        return cls(list(clf.classes_), coef.astype(np.float32), intercept.astype(np.float64))

    def guess(self, policy: Policy, prompts: Sequence[str]) -> tuple[list[str], np.ndarray]:
        """Each prompt's likeliest group and the classifier's probability for it."""
        scores = np.asarray(policy.featurizer.transform(prompts, None) @ self.coef.T + self.intercept)
        scores = np.exp(scores - scores.max(1, keepdims=True))
        probs = scores / scores.sum(1, keepdims=True)
        return [self.groups[j] for j in probs.argmax(1)], probs.max(1)


@dataclasses.dataclass
class Evidence:
    """Each worker's estimated chance of a right answer, for any question."""

    policy: Policy
    guess: GroupGuess | None

    @property
    def workers(self) -> list[str]:
        return [w.workers[0] for w in self.policy.workflows]

    @classmethod
    def fit(cls, matrix: OutcomeMatrix, *, seed: int = 0) -> Evidence:
        """Fit on a full-information matrix whose columns are the workers (a pool matrix)."""
        policy = Policy.fit_matrix(matrix, [single(m) for m in matrix.models], cost_weight=0.0, seed=seed)
        return cls(policy, GroupGuess.fit(policy, matrix.prompts, matrix.eval_names))

    def chances(self, prompts: Sequence[str], groups: Sequence[str | None] | None = None) -> np.ndarray:
        """[n, workers] chances in [0, 1], in `workers` order.

        A missing group is guessed from the text, and the guess is only as good as the classifier's
        confidence: a question from a group it never saw still gets its nearest known group, whose
        best worker is often not this question's. So a guessed row's chances are the expectation over
        whether the guess is right: the guessed group's heads weighted by the classifier's
        probability for it, the heads with no group by the rest."""
        given: list[str | None] = list(groups) if groups is not None else [None] * len(prompts)
        values = self.policy.values(prompts, given, cost_weight=0.0)
        missing = [i for i, g in enumerate(given) if not g]
        if missing and self.guess is not None:
            asked = [prompts[i] for i in missing]
            guessed, confidence = self.guess.guess(self.policy, asked)
            sure = confidence[:, None]
            values[missing] = sure * self.policy.values(asked, guessed, cost_weight=0.0) + (1 - sure) * values[missing]
        return np.clip(values, 0.0, 1.0)

    def chance_of(self, prompt: str, group: str | None = None) -> dict[str, float]:
        """One question's chances by worker name."""
        return dict(zip(self.workers, self.chances([prompt], [group])[0].tolist(), strict=True))

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.policy.save(out / "policy")
        if self.guess is not None:
            np.savez(out / "groups.npz", coef=self.guess.coef, intercept=self.guess.intercept,
                     groups=np.asarray(self.guess.groups, dtype=str))
        (out / "evidence.json").write_text(json.dumps(
            {"format": FORMAT, "version": VERSION, "workers": self.workers, "guesses_group": self.guess is not None},
            indent=2) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | Path) -> Evidence:
        src = Path(path)
        try:
            meta = json.loads((src / "evidence.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{src} holds no evidence.json: not a directory `baton-trainer warm-start --evidence` "
                             "wrote") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"{src} does not hold {FORMAT} version {VERSION}")
        policy = Policy.load(src / "policy")
        guess = None
        if meta.get("guesses_group"):
            with np.load(src / "groups.npz", allow_pickle=False) as z:
                guess = GroupGuess([str(g) for g in z["groups"]], z["coef"], z["intercept"])
        return cls(policy, guess)


def out_of_fold(matrix: OutcomeMatrix, *, folds: int = 5, seed: int = 0, hide_groups: bool = True) -> np.ndarray:
    """Every row's chances [n, workers] from evidence fitted without the row's fold (questions grouped), so a
    trainer shows its conductor estimates as good as those served on new questions. With `hide_groups` the
    estimate guesses each row's group from its text, as a served request that names none is estimated."""
    fold_of = grouped_folds(matrix.prompts, folds, seed)
    out = np.zeros(matrix.scores.shape)
    for f in np.unique(fold_of):
        held, rest = np.flatnonzero(fold_of == f), np.flatnonzero(fold_of != f)
        evidence = Evidence.fit(matrix.subset(rest), seed=seed)
        prompts = [matrix.prompts[i] for i in held]
        out[held] = evidence.chances(prompts, None if hide_groups else [matrix.eval_names[i] for i in held])
    return out
