"""The router's estimate of each worker's chance (baton_policy.evidence): what it predicts for questions it
never saw, with and without their group, how it is stored, and that the trainer's out-of-fold estimate
never scores a question with a model fitted on it."""

from __future__ import annotations

import numpy as np
import pytest

from baton_policy import evidence as evidence_module
from baton_policy.evidence import Evidence, out_of_fold
from baton_policy.matrix import COST_TOTAL, from_rows

FRUITS = ["apple", "pear", "plum", "cherry", "mango", "lemon", "peach", "grape", "melon", "kiwi", "fig", "lime"]
PLANETS = ["mars", "venus", "saturn", "jupiter", "mercury", "neptune", "uranus", "pluto", "earth", "ceres",
           "eris", "sedna"]
FRAMES = ["Tell me about the {} called {}.", "What is known of the {} named {}?", "Describe the {} {} briefly.",
          "Give three facts on the {} called {}."]
WORKERS = ["orchard", "observatory"]


def matrix(words: dict[str, list[str]], seed: int = 0, hit: float = 0.9):
    """Worker "orchard" is right on fruit questions, "observatory" on planet ones (`hit` of the time)."""
    rng = np.random.default_rng(seed)
    header = ["sample_id", "eval_name", "prompt", *WORKERS, *(f"{w}|{COST_TOTAL}" for w in WORKERS)]
    rows = []
    for group, names in words.items():
        for word in names:
            for frame in FRAMES:
                good = rng.random() < hit
                right = (good, not good) if group == "fruit" else (not good, good)
                rows.append({"sample_id": str(len(rows)), "eval_name": group, "prompt": frame.format(group, word),
                             **{w: str(int(r)) for w, r in zip(WORKERS, right, strict=True)},
                             **{f"{w}|{COST_TOTAL}": "0.001" for w in WORKERS}})
    return from_rows(header, rows)


@pytest.fixture(scope="module")
def fitted() -> Evidence:
    return Evidence.fit(matrix({"fruit": FRUITS[:9], "planet": PLANETS[:9]}))


def test_each_workers_chance_on_unseen_questions_follows_its_group_given_or_guessed(fitted):
    assert fitted.workers == WORKERS
    unseen = [f"Tell me about the fruit called {w}." for w in FRUITS[9:]] + \
             [f"Tell me about the planet called {w}." for w in PLANETS[9:]]
    for groups in (["fruit"] * 3 + ["planet"] * 3, None):  # a served request seldom names its group
        chances = fitted.chances(unseen, groups)
        assert chances.shape == (6, 2) and ((chances >= 0) & (chances <= 1)).all()
        assert list(chances.argmax(1)) == [0, 0, 0, 1, 1, 1], chances
    one = fitted.chance_of(unseen[0])
    assert set(one) == set(WORKERS) and one["orchard"] > one["observatory"]


def test_a_guessed_group_counts_as_far_as_the_classifier_is_sure_of_it(fitted):
    # A question of a group the estimate never saw still gets its nearest known group: routing it as
    # if it surely were from that group is what lost points on held-out subjects.
    clear, vague = "Tell me about the fruit called kiwi.", "Tell me about the thing called zork."
    guessed, confidence = fitted.guess.guess(fitted.policy, [clear, vague])
    assert 0.5 < confidence[1] < confidence[0] <= 1.0, confidence

    def heads(question, group):
        return fitted.policy.values([question], [group], cost_weight=0.0)[0]

    for question, group, sure in zip([clear, vague], guessed, confidence, strict=True):
        expected = sure * heads(question, group) + (1 - sure) * heads(question, None)
        np.testing.assert_allclose(fitted.chances([question])[0], np.clip(expected, 0, 1), rtol=1e-9)
    np.testing.assert_allclose(fitted.chances([vague], ["planet"])[0], np.clip(heads(vague, "planet"), 0, 1))


def test_a_saved_estimate_loads_to_the_same_chances_and_a_wrong_directory_is_a_clear_error(fitted, tmp_path):
    questions = ["Describe the fruit lime briefly.", "Describe the planet eris briefly."]
    loaded = Evidence.load(fitted.save(tmp_path / "evidence"))
    assert loaded.workers == fitted.workers
    np.testing.assert_allclose(loaded.chances(questions), fitted.chances(questions), rtol=1e-6)
    with pytest.raises(ValueError, match="no evidence.json"):
        Evidence.load(tmp_path)


def test_the_out_of_fold_estimate_scores_every_question_with_a_model_that_never_saw_it(monkeypatch):
    data = matrix({"fruit": FRUITS, "planet": PLANETS})
    real_fit = Evidence.fit
    fits: list[set[str]] = []

    def recording_fit(m, **kw):
        fits.append(set(m.prompts))
        return real_fit(m, **kw)

    scored: list[tuple[int, list[str]]] = []
    real_chances = Evidence.chances

    def recording_chances(self, prompts, groups=None):
        scored.append((len(fits) - 1, list(prompts)))
        assert groups is None  # hidden, as a served request's group is
        return real_chances(self, prompts, groups)

    monkeypatch.setattr(evidence_module.Evidence, "fit", staticmethod(recording_fit))
    monkeypatch.setattr(evidence_module.Evidence, "chances", recording_chances)
    chances = out_of_fold(data, folds=4, seed=0)
    assert chances.shape == (len(data), 2) and len(fits) == 4
    assert sorted(p for _, prompts in scored for p in prompts) == sorted(data.prompts)
    for fit, prompts in scored:
        assert not fits[fit] & set(prompts)
    # Fitted on the other folds, the estimate still tells the groups apart.
    right = np.array([0 if g == "fruit" else 1 for g in data.eval_names])
    assert (chances.argmax(1) == right).mean() > 0.9
