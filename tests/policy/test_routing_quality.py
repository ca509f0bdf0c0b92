"""Trust in the fast policy's text heads (winner's-curse shrinkage), tuned by grouped CV."""

from __future__ import annotations

import json

import numpy as np

from baton_policy.fastpolicy import Policy, grouped_folds, tune_trust
from baton_policy.matrix import from_rows
from baton_policy.templates import single


def test_grouped_folds_keep_a_question_on_one_side():
    prompts = [f"question {i % 40}" for i in range(200)] + ["  QUESTION 3 "]  # same question, other spacing/case
    fold_of = grouped_folds(prompts, 3, seed=0)
    assert set(fold_of) == {0, 1, 2}
    for q in range(40):
        assert len({fold_of[i] for i in range(200) if i % 40 == q}) == 1
    assert fold_of[-1] == fold_of[3]


def _case(informative: bool, n: int = 3000, A: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    means = np.full(A, 0.5)
    means[0] = 0.7  # one action is clearly best on average
    p = np.clip(means + rng.normal(0, 0.25, (n, A)), 0.02, 0.98)
    scores = (rng.random((n, A)) < p).astype(float)
    noise = rng.normal(0, 0.15, (n, A))
    # Informative heads see each query's true success probabilities; uninformative ones see the
    # action means plus noise, so their argmax chases noise.
    quality = np.clip(p + 0.05 * noise if informative else means + noise, 0, 1)
    return quality, scores, np.ones((n, A)), np.arange(n) % 3


def test_tune_trust_shrinks_noisy_heads_and_keeps_informative_ones():
    q, s, c, folds = _case(informative=False)
    assert tune_trust(q, s, c, folds, 1.0, cost_weights=[0.0])[0] < 1.0
    q, s, c, folds = _case(informative=True)
    assert tune_trust(q, s, c, folds, 1.0, cost_weights=[0.0])[0] == 1.0


def _noise_matrix(n: int = 600, seed: int = 0):
    # Text carries no information about who is right: model "a" is simply better everywhere.
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(300)]
    header = ["sample_id", "eval_name", "prompt", "a", "b", "c"]
    rows = []
    for i in range(n):
        prompt = " ".join(rng.choice(words, 12)) + f" q{i}"
        rows.append({"sample_id": str(i), "eval_name": "", "prompt": prompt,
                     "a": str(int(rng.random() < 0.75)), "b": str(int(rng.random() < 0.55)), "c": str(int(rng.random() < 0.55))})
    return from_rows(header, rows)


def test_fit_matrix_stores_trust_and_it_survives_save_load(tmp_path):
    train, test = _noise_matrix(900, seed=1), _noise_matrix(300, seed=2)
    policy = Policy.fit_matrix(train, [single(m) for m in train.models])
    assert policy.trust is not None and policy.prior_quality is not None
    assert len(policy.trust["trust"]) == len(policy.trust["cost_weights"])
    assert all(0.0 <= t <= 1.0 for t in policy.trust["trust"])
    # With uninformative text the tuned policy must not do worse than always taking "a".
    pick = policy.values(test.prompts, test.eval_names, 0.0).argmax(1)
    rows = np.arange(len(test))
    assert test.scores[rows, pick].mean() >= test.scores[:, 0].mean() - 0.02
    out = policy.save(tmp_path / "pol")
    assert "trust" in json.loads((out / "policy.json").read_text())
    loaded = Policy.load(out)
    assert loaded.trust == policy.trust
    np.testing.assert_allclose(loaded.values(test.prompts[:40]), policy.values(test.prompts[:40]), rtol=1e-5)


def test_policy_without_trust_uses_plain_heads(tmp_path):
    train = _noise_matrix(300, seed=3)
    plain = Policy.fit_matrix(train, [single(m) for m in train.models], tune_trust_folds=0)
    assert plain.trust is None and plain.trust_at(0.0) == 1.0
    tuned = Policy.fit_matrix(train, [single(m) for m in train.models])
    # Same heads; only the value transform differs, and quality() is never shrunk.
    np.testing.assert_allclose(plain.quality(train.prompts[:20]), tuned.quality(train.prompts[:20]), atol=1e-4)
    # A policy directory written before trust existed (no "trust" key, no prior array) still loads.
    out = plain.save(tmp_path / "old")
    cfg = json.loads((out / "policy.json").read_text())
    assert "trust" not in cfg
    assert Policy.load(out).trust_at(0.3) == 1.0
