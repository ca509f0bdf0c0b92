"""Packaged sentence embeddings in the fast policy's query features, and the artefact versions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from baton_policy.embeddings import EMBEDDERS, load_embedder
from baton_policy.fastpolicy import FORMAT_VERSION, Policy
from baton_policy.matrix import from_rows
from baton_policy.templates import single

NAME = "wordllama-l2_supercat-256"

ANIMALS = ["cat", "dog", "horse", "cow", "sheep", "goat", "rabbit", "lion", "tiger", "wolf"]
VEHICLES = ["car", "truck", "bus", "train", "bicycle", "airplane", "boat", "tram", "scooter", "tractor"]
# Words never seen in training: only a representation that knows what they mean can route them.
NEW_ANIMALS = ["kitten", "puppy", "pony", "donkey", "fox"]
NEW_VEHICLES = ["van", "motorcycle", "taxi", "ship", "minibus"]
FRAMES = ["tell me about the {}", "describe a {} in detail", "what is a {} like", "facts about the {} please"]


def _matrix(words_a, words_b, n: int, seed: int):
    """Model "zoo" is right on animal questions, "garage" on vehicle questions (90% each)."""
    rng = np.random.default_rng(seed)
    header = ["sample_id", "eval_name", "prompt", "zoo", "garage"]
    rows = []
    for i in range(n):
        animal = i % 2 == 0
        word = rng.choice(words_a if animal else words_b)
        hit = rng.random() < 0.9
        zoo, garage = (hit, not hit) if animal else (not hit, hit)
        prompt = rng.choice(FRAMES).format(word)
        rows.append({"sample_id": str(i), "eval_name": "", "prompt": prompt, "zoo": str(int(zoo)), "garage": str(int(garage))})
    return from_rows(header, rows)


def test_embeddings_are_unit_vectors_and_place_paraphrases_closer():
    embed = load_embedder(NAME)
    v = embed(["What is the capital of France?", "Which city is France's capital?", "Integrate x squared dx", ""])
    assert v.shape == (4, EMBEDDERS[NAME][1]) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]
    np.testing.assert_array_equal(embed(["Which city is France's capital?"])[0], v[1])
    assert embed([]).shape == (0, EMBEDDERS[NAME][1])


def test_unknown_embedding_is_refused():
    with pytest.raises(ValueError, match="unknown query embedding"):
        load_embedder("no-such-embedding")


def test_embedding_routes_questions_whose_words_training_never_saw():
    train = _matrix(ANIMALS, VEHICLES, 800, seed=0)
    test = _matrix(NEW_ANIMALS, NEW_VEHICLES, 400, seed=1)
    flows = [single(m) for m in train.models]
    rows = np.arange(len(test))

    def accuracy(policy: Policy) -> float:
        pick = policy.values(test.prompts, test.eval_names, 0.0).argmax(1)
        return float(test.scores[rows, pick].mean())

    plain = accuracy(Policy.fit_matrix(train, flows))
    embedded = accuracy(Policy.fit_matrix(train, flows, embedding=NAME))
    # Each model alone scores 0.5 here; the n-grams of unseen words carry nothing.
    assert plain < 0.6
    assert embedded > 0.7


def test_embedding_policy_survives_save_and_load(tmp_path):
    train = _matrix(ANIMALS, VEHICLES, 300, seed=2)
    policy = Policy.fit_matrix(train, [single(m) for m in train.models], embedding=NAME)
    out = policy.save(tmp_path / "pol")
    config = json.loads((out / "policy.json").read_text())
    assert config["version"] == FORMAT_VERSION
    assert config["featurizer"]["embedding"] == NAME
    loaded = Policy.load(out)
    assert loaded.featurizer.dim == policy.featurizer.dim
    probe = ["describe a kitten in detail", "what is a van like"]
    np.testing.assert_allclose(loaded.values(probe), policy.values(probe), rtol=1e-5)
    assert loaded.choose(probe[0]).workflow == policy.choose(probe[0]).workflow


def test_version_1_policies_load_and_unknown_versions_are_refused(tmp_path):
    train = _matrix(ANIMALS, VEHICLES, 200, seed=3)
    policy = Policy.fit_matrix(train, [single(m) for m in train.models])
    out = policy.save(tmp_path / "pol")
    path = out / "policy.json"
    config = json.loads(path.read_text())
    # A version-1 directory: same fields, no embedding keys in the featurizer config.
    config["version"] = 1
    for key in ("embedding", "embedding_scale"):
        config["featurizer"].pop(key)
    path.write_text(json.dumps(config))
    old = Policy.load(out)
    assert old.featurizer.embedding is None
    np.testing.assert_allclose(old.values(train.prompts[:10]), policy.values(train.prompts[:10]), rtol=1e-5)
    config["version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="retrain"):
        Policy.load(out)


def test_logged_feedback_with_an_embedding_generalises_to_unseen_words():
    # Uniform logging over the two models: half the episodes show each model's reward.
    train = _matrix(ANIMALS, VEHICLES, 1200, seed=4)
    rng = np.random.default_rng(5)
    episodes = []
    for i, prompt in enumerate(train.prompts):
        a = int(rng.integers(2))
        episodes.append((prompt, train.models[a], float(train.scores[i, a]), 0.5))
    policy = Policy.fit_logged(episodes, train.models, embedding=NAME)
    assert policy.featurizer.embedding == NAME
    test = _matrix(NEW_ANIMALS, NEW_VEHICLES, 200, seed=6)
    pick = policy.values(test.prompts, test.eval_names).argmax(1)
    assert test.scores[np.arange(len(test)), pick].mean() > 0.7
