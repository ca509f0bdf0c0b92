"""The gate, the policy store and the policy conductor, on synthetic logged traffic."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import load_config
from baton_policy import artefact_digest, verified_copy
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.templates import single
from baton_router.conductor.policy_backend import PolicyConductor, plan_for
from baton_trainer.gate import compare, greedy, uniform
from baton_trainer.store import PolicyStore

MODELS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]


def logged_traffic(n: int, seed: int) -> list[Episode]:
    """A uniform logging policy over three models; math questions suit the first, history the second."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = rng.choice(["math", "history"])
        prompt = f"{topic} question number {i} about {'integrals' if topic == 'math' else 'empires'}"
        action = rng.choice(MODELS)
        good = {"math": MODELS[0], "history": MODELS[1]}[topic]
        reward = 1.0 if action == good else float(rng.random() < 0.2)
        out.append(Episode(prompt, action, reward, 1 / 3))
    return out


def test_the_gate_publishes_a_better_policy_and_refuses_a_worse_one():
    train, held = logged_traffic(600, 1), logged_traffic(300, 2)
    learned = Policy.fit_logged(train, [single(m) for m in MODELS])
    better = compare(held, greedy(learned), uniform(3))
    assert better.publish and better.lower > 0 and better.candidate > better.current
    worse = compare(held, uniform(3), greedy(learned))
    assert not worse.publish and worse.difference < 0
    with pytest.raises(ValueError, match="held-back"):
        compare([], uniform(3), uniform(3))


def test_the_doubly_robust_gate_is_unbiased_whatever_the_reward_model_and_tighter_with_a_good_one():
    """Two workers logged uniformly; the right one is right 80% of the time, the other 20%. The
    candidate always takes the right one (true value 0.8), the current policy is uniform (0.5)."""
    actions = ["good", "bad"]
    candidate = lambda episodes, names: np.tile([1.0, 0.0], (len(episodes), 1))  # noqa: E731
    truth = np.tile([0.8, 0.2], (150, 1))
    wrong = np.tile([0.0, 1.0], (150, 1))
    estimates: dict[str, list[float]] = {"ips": [], "wrong": [], "truth": []}
    rng = np.random.default_rng(0)
    for _ in range(400):
        logged = [Episode(f"q{i}", a, float(rng.random() < (0.8 if a == "good" else 0.2)), 0.5)
                  for i, a in enumerate(rng.choice(actions, 150))]
        for name, predicted in (("ips", None), ("wrong", wrong), ("truth", truth)):
            r = compare(logged, candidate, uniform(2), actions=actions, predicted=predicted)
            estimates[name].append(r.difference)
    mean = {k: float(np.mean(v)) for k, v in estimates.items()}
    sd = {k: float(np.std(v)) for k, v in estimates.items()}
    for name in estimates:  # the true difference is 0.8 - 0.5; the standard error of 400 means is < 0.005
        assert abs(mean[name] - 0.3) < 0.015, (name, mean)
    assert sd["truth"] < 0.75 * sd["ips"], sd
    with pytest.raises(ValueError, match="action names"):
        compare(logged, candidate, uniform(2), predicted=truth)


def test_the_store_keeps_versions_in_order_and_refuses_overwrites(tmp_path):
    store = PolicyStore(str(tmp_path / "store"))
    policy = Policy.fit_logged(logged_traffic(200, 3), [single(m) for m in MODELS])
    for v, t in (("v1", 1), ("v2", 2)):
        saved = policy.save(tmp_path / f"src-{v}")
        store.put("baton", v, saved, {"version": v, "uri": store.uri("baton", v), "published_unix_ms": t})
    assert [m["version"] for m in store.versions("baton")] == ["v1", "v2"]
    # Each version's manifest records the digest of its files, which a router checks its copy against.
    for m in store.versions("baton"):
        stored = Path(m["uri"])
        assert m["digest"] == artefact_digest(stored) and verified_copy(m["uri"], m["digest"], store.root) != stored
    with pytest.raises(FileExistsError):
        store.put("baton", "v1", policy.save(tmp_path / "again"), {"version": "v1", "published_unix_ms": 3})


def request(text: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="r", messages=[common_pb2.ChatMessage(role="user", content=text)])


def test_the_policy_conductor_logs_uniform_choices_then_serves_a_loaded_policy(write_config, tmp_path):
    config = load_config(write_config({"conductor": {"backend": "policy", "policy": {"epsilon": 0.0}}}))
    conductor = PolicyConductor(config.conductor.policy, config.workers, rng=random.Random(0))
    first = [asyncio.run(conductor.propose(request("math question about integrals"))) for _ in range(30)]
    assert {p.propensity for p in first} == {1 / 3} and {p.policy_version for p in first} == {"uniform"}
    assert len({p.plan.workers[0] for p in first}) == 3, "the logging policy tries every worker"
    assert {p.action for p in first} == set(MODELS), "actions are named by model, as a learned policy names them"
    policy = Policy.fit_logged(logged_traffic(900, 4), [single(m) for m in MODELS])
    conductor.load(str(policy.save(tmp_path / "p")), "v1")
    math = asyncio.run(conductor.propose(request("math question number 7 about integrals")))
    history = asyncio.run(conductor.propose(request("history question number 8 about empires")))
    assert (math.plan.workers, history.plan.workers) == (["gemini-pro"], ["gemini-flash"])
    assert math.policy_version == "v1" and math.propensity == 1.0 and math.action == MODELS[0]


def test_a_panel_choice_becomes_parallel_steps_and_a_combining_step():
    plan = plan_for(["a", "b", "c"])
    assert plan.workers == ["a", "b", "c", "a"] and plan.access == [[], [], [], "all"]
    assert plan_for(["a"]).workers == ["a"]


def test_a_policy_naming_unconfigured_models_is_refused(write_config, tmp_path):
    config = load_config(write_config({"conductor": {"backend": "policy"}}))
    policy = Policy.fit_logged([Episode("q", "gpt-9", 1.0, 1.0)], [single("gpt-9")])
    with pytest.raises(ValueError, match="gpt-9"):
        PolicyConductor(config.conductor.policy, config.workers).load(str(policy.save(tmp_path / "p")), "bad")
