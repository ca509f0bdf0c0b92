"""Every gate decision leaves a record in the policy store, beside the versions and never among them:
train-fast's publish and refusal, and a rollback; a passing gate without --publish decides nothing."""

from __future__ import annotations

import random
import uuid
from argparse import Namespace

import pytest

from baton_policy import decisions
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.templates import single
from baton_trainer import train_fast
from baton_trainer.logged import Logged
from baton_trainer.store import PolicyStore

MODELS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]  # the default workers


def logged(n: int = 400, seed: int = 0) -> list[Logged]:
    """Uniform logging over the three models; math questions suit the first, history the second."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic, action = rng.choice(["math", "history"]), rng.choice(MODELS)
        good = MODELS[0] if topic == "math" else MODELS[1]
        prompt = f"{topic} question {i} about {'integrals' if topic == 'math' else 'empires'}"
        out.append(Logged(Episode(prompt, action, float(action == good), 1 / 3), "uniform", f"req-{i}"))
    return out


@pytest.fixture(params=["local", "memory"])
def store_root(request, tmp_path) -> str:
    """A store on a local disk and one behind an fsspec URL (each test its own memory:// folder)."""
    return str(tmp_path / "store") if request.param == "local" else f"memory://decisions-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def announced(monkeypatch) -> list:
    """What the trainer would have announced on baton.policy (no broker here)."""
    sent: list = []
    monkeypatch.setattr(train_fast, "announce_sync", lambda kafka, message: sent.append(message))
    monkeypatch.setattr(train_fast, "read_episodes", lambda root, feedback=None: logged())
    return sent


def run(config, store: str, version: str, *extra: str) -> dict:
    return train_fast.train_fast(train_fast.parse_args(
        ["--config", str(config), "--episodes", "unused", "--store", store, "--version", version, "--quiet", *extra]))


def test_a_publish_and_a_refusal_each_leave_a_decision_and_no_publish_leaves_none(write_config, store_root,
                                                                                   announced):
    config = write_config()
    dry = run(config, store_root, "v0")
    assert (dry["published"], dry["reason"], decisions.read(store_root, "baton")) == (False, "--publish not given", [])
    first = run(config, store_root, "v1", "--publish")
    assert first["published"] and first["gate"]["lower"] > 0 and [m.version for m in announced] == ["v1"]
    # The same episodes give the same policy: no better than the one serving, so the gate says no.
    second = run(config, store_root, "v2", "--publish")
    assert not second["published"] and second["reason"] == "the gate said no" and len(announced) == 1
    published, refused = decisions.read(store_root, "baton")
    assert (published["kind"], published["version"], published["previous"]) == ("published", "v1", "uniform")
    assert (refused["kind"], refused["version"], refused["previous"]) == ("refused", "v2", "v1")
    assert published["gate"] == first["gate"] and refused["gate"] == second["gate"]
    assert published["unix_ms"] <= refused["unix_ms"] and "lower bound" in refused["reason"]
    assert second["decision"].startswith(f"{store_root}/baton/_decisions/")
    assert [v["version"] for v in PolicyStore(store_root).versions("baton")] == ["v1"], "decisions are no version"


def test_a_rollback_leaves_a_decision(write_config, store_root, announced, tmp_path):
    store = PolicyStore(store_root)
    policy = Policy.fit_logged([x.episode for x in logged(200)], [single(m) for m in MODELS])
    for t, version in enumerate(("v1", "v2")):
        store.put("baton", version, policy.save(tmp_path / version), {
            "version": version, "uri": store.uri("baton", version), "published_unix_ms": t})
    out = train_fast.rollback(Namespace(config=str(write_config()), store=store_root, name="baton", to=None))
    assert out["rolled_back"] and [(m.version, m.rollback) for m in announced] == [("v1", True)]
    (rolled,) = decisions.read(store_root, "baton")
    assert (rolled["kind"], rolled["version"], rolled["previous"], rolled["gate"]) == ("rollback", "v1", "v2", None)
    assert [v["version"] for v in store.versions("baton")] == ["v1", "v2"]


def test_decisions_read_back_newest_last_and_a_version_cannot_take_their_folder(store_root, tmp_path):
    for t, kind in enumerate(("published", "refused", "rollback")):
        decisions.record(store_root, "baton", decisions.decision(kind, f"v{t}", "v", unix_ms=1_000 + t))
    assert [d["kind"] for d in decisions.read(store_root, "baton")] == ["published", "refused", "rollback"]
    assert [d["version"] for d in decisions.read(store_root, "baton", limit=2)] == ["v1", "v2"]
    assert decisions.read(store_root, "other") == []
    with pytest.raises(ValueError, match="one of"):
        decisions.decision("maybe", "v9", "v")
    saved = Policy.fit_logged([x.episode for x in logged(60)], [single(m) for m in MODELS]).save(tmp_path / "p")
    with pytest.raises(ValueError, match="cannot start with '_'"):
        PolicyStore(store_root).put("baton", decisions.FOLDER, saved, {"published_unix_ms": 0})
