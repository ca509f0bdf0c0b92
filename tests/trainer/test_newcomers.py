"""A worker the fitted policy has never seen: served at once, explored, learned online, removable."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import numpy as np
import pytest
from scipy.special import ndtri
from trainer_synth import ACCURACY, make_rows, topic_of, write_csv

from baton.v1 import common_pb2, requests_pb2, rewards_pb2
from baton_eval import replay
from baton_platform.config import load_config
from baton_policy.aggregate import join
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.matrix import from_rows, without
from baton_policy.newcomers import PRIOR_SCALES, Newcomers, OnlineHead, feature_var, log_evidence, outcome_of
from baton_policy.templates import single
from baton_router.conductor.policy_backend import PolicyConductor

NEW = "bio-expert"


def test_the_online_head_learns_a_feature_dependent_rate():
    head = OnlineHead(np.array([1.0, 1.0]), prior_quality=0.5)
    rng = np.random.default_rng(0)
    rows = {0: np.array([1.0, 0.0]), 1: np.array([0.0, 1.0])}
    truth = {0: 0.9, 1: 0.2}
    for _ in range(800):
        k = int(rng.integers(2))
        head.update(rows[k], bool(rng.random() < truth[k]))
    got = head.quality(np.stack([rows[0], rows[1]]))
    assert abs(got[0] - 0.9) < 0.08 and abs(got[1] - 0.2) < 0.08, got


def test_a_newcomer_takes_a_query_where_its_optimistic_quality_beats_the_policys_choice(synthetic):
    """Its score ~ N(0.3, 0.2^2): quality 0.62 at the mean, 0.69 one sd up, 0.76 two sd up."""
    _, test, policy = synthetic
    newcomers = Newcomers(policy, {NEW: 1.0}, share=0.1)
    head = newcomers.newcomers[0].head
    head.mean[:] = 0.0
    head.mean[-1] = 0.3
    head.cov[:] = 0.0
    head.cov[-1, -1] = 0.2**2
    F = newcomers.features(test.prompts[:4], test.eval_names[:4], policy.quality(test.prompts[:4], test.eval_names[:4]))
    values = np.full((4, len(policy.workflows)), -1.0)
    values[:, 0] = [0.5, 0.65, 0.72, 0.8]
    greedy, probs = newcomers.shares(F, values, values, 0.0)  # at W=0 and full trust, values are qualities
    # 0.65 is above its mean quality, yet unsure as it is, it takes the query (Thompson sampling would
    # send it a third of them), and its reward settles the question. 0.72 is within its upper
    # bound: the exploration share. 0.8 is beyond it: nothing.
    assert probs[:, 1].tolist() == pytest.approx([1.0, 1.0, 0.1, 0.0])
    assert np.allclose(probs.sum(1), 1.0) and (greedy == 0).all()


def test_a_newcomer_competes_with_what_the_policy_predicts_of_its_choice_not_its_ranking_value(synthetic):
    """Trust 0 makes every workflow's value its training mean (a ranking that ignores the query),
    here 0.95: the newcomer, sure of 0.6, must still win the queries where the head of the
    policy's choice predicts less than that, and only those."""
    _, test, policy = synthetic
    shrunk = dataclasses.replace(policy, trust={"cost_weights": [0.0], "trust": [0.0]},
                                 prior_quality=np.full(len(policy.workflows), 0.95))
    newcomers = Newcomers(shrunk, {NEW: 1.0}, share=0.1)
    head = newcomers.newcomers[0].head
    head.mean[:] = 0.0
    head.mean[-1] = ndtri(0.6)
    head.cov[:] = 0.0
    prompts, evals = test.prompts[:200], test.eval_names[:200]
    q = shrunk.quality(prompts, evals)
    values = shrunk.values(prompts, evals, 0.0, quality=q)
    assert np.allclose(values, 0.95), "the ranking values ignore the query"
    greedy, probs = newcomers.shares(newcomers.features(prompts, evals, q), values, q, 0.0)
    predicted = q[np.arange(len(greedy)), greedy]
    assert (predicted < 0.59).any() and (predicted > 0.61).any()
    assert (probs[predicted < 0.59, 1] == 1.0).all() and (probs[predicted > 0.61, 1] == 0.0).all()
    rng = np.random.default_rng(0)
    chosen = [newcomers.choose(p, e, rng=rng).workflow for p, e in zip(prompts, evals)]
    assert [c == NEW for c in chosen] == (predicted < 0.6).tolist()


def test_fractional_rewards_become_outcomes_every_replica_agrees_on():
    keys = [f"req-{i}" for i in range(20_000)]
    first = [outcome_of(0.3, k) for k in keys]
    assert first == [outcome_of(0.3, k) for k in keys]
    assert abs(np.mean(first) - 0.3) < 0.01
    assert outcome_of(1.0, "x") and not outcome_of(0.0, "x")


def test_the_evidence_is_the_sum_of_the_online_heads_own_predictions():
    """The batched evidence runs the same update as OnlineHead: every outcome scored by the
    head's predictive probability before it learns it."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 3))
    y = rng.random((60, 2)) < 0.6
    var = np.array([[0.5, 0.5, 0.5], [0.05, 0.05, 0.05]])
    heads = [OnlineHead(var[0], 0.6), OnlineHead(var[1], 0.3)]
    got = log_evidence(X, y, heads)
    assert all(h.updates == 0 for h in heads) and heads[0].mean[-1] == OnlineHead(var[0], 0.6).mean[-1]
    for h in range(2):
        head, total = OnlineHead(var[h], [0.6, 0.3][h]), 0.0
        for x, outcome in zip(X, y[:, h]):
            p = head.quality(x[None, :])[0]
            total += np.log(p if outcome else 1 - p)
            head.update(x, bool(outcome))
        assert got[h] == pytest.approx(total, rel=1e-9)


@pytest.fixture(scope="module")
def synthetic():
    header, rows = make_rows(1500, seed=7)
    matrix = from_rows(header, rows)
    train, test = matrix.subset(range(900)), matrix.subset(range(900, 1500))
    return train, test, Policy.fit_matrix(without(train, [NEW]), cost_weight=0.0)


def stream(newcomers: Newcomers, test, rounds: int, seed: int = 0) -> list[tuple[str, str]]:
    """Route test rows in turn, teaching the newcomers their outcomes; returns (topic, action)."""
    rng = np.random.default_rng(seed)
    col = {m: j for j, m in enumerate(test.models)}
    out = []
    for t in range(rounds):
        i = t % len(test)
        choice = newcomers.choose(test.prompts[i], test.eval_names[i], rng=rng)
        if NEW in choice.workers:
            newcomers.update(test.prompts[i], test.eval_names[i], choice.workflow, float(test.scores[i, col[NEW]]),
                             test.sample_ids[i])
        out.append((topic_of(test.prompts[i]), choice.workflow))
    return out


def test_a_new_worker_gets_traffic_at_once_and_learns_where_it_is_best(synthetic):
    train, test, policy = synthetic
    newcomers = Newcomers(policy, {NEW: 1.0}, share=0.1)
    assert newcomers.names == [NEW], "no vote variant: the synthetic policy has no vote workflow"
    routed = stream(newcomers, test, 600)
    first = [a for _, a in routed[:100]]
    assert first.count(NEW) >= 5, "the new worker is tried within the first 100 queries"
    late = routed[400:]
    bio = [a for t, a in late if t == "biology"]
    other = [a for t, a in late if t != "biology"]
    assert bio.count(NEW) / len(bio) > 0.8, "it took the queries it is best at"
    assert other.count(NEW) / len(other) < 0.2, "and few of the others"
    assert ACCURACY[NEW]["biology"] > max(ACCURACY[m]["biology"] for m in ACCURACY if m != NEW)


def test_the_prior_scale_is_the_one_the_known_workers_outcomes_support(synthetic, tmp_path):
    """Topic experts' chances move far from query to query: the widest prior. The same outcomes
    dealt to random queries move with nothing the heads read: the narrowest."""
    train, _, policy = synthetic
    assert policy.meta["newcomer_prior_scale"] == max(PRIOR_SCALES)
    rng = np.random.default_rng(0)
    hidden = without(train, [NEW])
    shuffled = dataclasses.replace(hidden, scores=np.stack([rng.permutation(c) for c in hidden.scores.T], axis=1))
    flat = Policy.fit_matrix(shuffled, cost_weight=0.0)
    assert flat.meta["newcomer_prior_scale"] == min(PRIOR_SCALES)
    # A newcomer's head takes the scale of the policy it joins, saved and loaded.
    head = Newcomers(Policy.load(flat.save(tmp_path / "p")), {NEW: 1.0}).newcomers[0].head
    singles = sum(w.kind == "single" for w in flat.workflows)
    expected = feature_var(singles, len(flat.featurizer.eval_names), min(PRIOR_SCALES))
    assert np.allclose(np.diag(head.cov)[:-1], expected)


def test_shares_are_probabilities_and_propensities_are_logged(synthetic):
    _, test, policy = synthetic
    newcomers = Newcomers(policy, {NEW: 1.0}, share=0.25)
    q = policy.quality(test.prompts[:50], test.eval_names[:50])
    F = newcomers.features(test.prompts[:50], test.eval_names[:50], q)
    greedy, probs = newcomers.shares(F, policy.values([], None, quality=q), q, 0.0)
    assert np.allclose(probs.sum(1), 1.0) and (probs >= 0).all()
    assert (probs[:, 1] >= 0.25 - 1e-12).all(), "an untried worker gets at least the exploration share"
    choice = newcomers.choose(test.prompts[0], test.eval_names[0], epsilon=0.1, rng=np.random.default_rng(3))
    assert 0 < choice.propensity <= 1


def test_a_removed_worker_gets_no_traffic_and_rewards_apply_once(synthetic):
    _, test, policy = synthetic
    newcomers = Newcomers(policy, {}, removed=["alg-expert"])
    rng = np.random.default_rng(0)
    picks = {newcomers.choose(p, e, epsilon=0.5, rng=rng).workflow for p, e in zip(test.prompts[:200], test.eval_names[:200])}
    assert picks == {"cheap"}
    learner = Newcomers(policy, {NEW: 1.0})
    assert learner.update(test.prompts[0], None, NEW, 1.0, "r1") and not learner.update(test.prompts[0], None, NEW, 1.0, "r1")
    assert not learner.update(test.prompts[0], None, "cheap", 1.0, "r2"), "known workers are the trainer's business"


def request(text: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="r", messages=[common_pb2.ChatMessage(role="user", content=text)])


def test_the_policy_conductor_serves_a_new_worker_and_learns_from_rewards(write_config, tmp_path):
    """The config's three sim workers; the policy was trained on two of them."""
    known = ["gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]
    rng = random.Random(0)
    episodes = [Episode(f"question {i} about {'stars' if i % 2 else 'cells'}", known[i % 2], float(rng.random() < 0.6), 0.5)
                for i in range(300)]
    policy = Policy.fit_logged(episodes, [single(m) for m in known])
    config = load_config(write_config({"conductor": {"backend": "policy", "policy": {
        "epsilon": 0.0, "new_worker_share": 0.2, "path": str(policy.save(tmp_path / "p")), "version": "v1"}}}))
    conductor = PolicyConductor(config.conductor.policy, config.workers, rng=random.Random(1))
    proposals = [asyncio.run(conductor.propose(request(f"question {i} about cells"))) for i in range(100)]
    new = [p for p in proposals if p.action == "gemini-1.5-pro-002"]
    assert new and {p.plan.workers[0] for p in new} == {"gemini-pro"}
    # Each choice is logged with its exact share.
    newcomers = conductor._current.newcomers
    for i, p in enumerate(proposals):
        q = [f"question {i} about cells"]
        quality = policy.quality(q)
        _, probs = newcomers.shares(newcomers.features(q, [None], quality), policy.values(q, quality=quality), quality, 0.0)
        column = 0 if p.action not in newcomers.names else 1 + newcomers.names.index(p.action)
        assert p.propensity == pytest.approx(probs[0, column])
    # smollm2 (the local model) is also a worker the policy does not know.
    before = conductor._current.newcomers.newcomers[0].head.mean.copy()
    taught = conductor.learn(rewards_pb2.Reward(request_id="e1", action="gemini-1.5-pro-002", query="question 1 about cells",
                                                quality=1.0))
    assert taught and not np.array_equal(before, conductor._current.newcomers.newcomers[0].head.mean)
    assert not conductor.learn(rewards_pb2.Reward(request_id="e1", action="gemini-1.5-pro-002", query="q", quality=1.0))
    # A newer policy loaded later is taught by the rewards already seen.
    conductor.load(str(policy.save(tmp_path / "p2")), "v2")
    assert conductor._current.newcomers.newcomers[0].head.updates == 1


def serving(write_config, tmp_path, policy: Policy, *, without: str, epsilon: float, seed: int) -> PolicyConductor:
    """A policy conductor on the default pool less the worker `without`, serving `policy` as v1."""
    data = json.loads(json.dumps(load_config(write_config()).model_dump(mode="json", exclude_none=True)))
    cfg = load_config(write_config({"workers": [w for w in data["workers"] if w["name"] != without],
                                    "conductor": {"backend": "policy", "policy": {"epsilon": epsilon}}}))
    conductor = PolicyConductor(cfg.conductor.policy, cfg.workers, rng=random.Random(seed))
    conductor.load(str(policy.save(tmp_path / "p")), "v1")
    return conductor


def test_removing_a_worker_from_the_configuration_takes_its_traffic_away(write_config, tmp_path):
    models = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]
    episodes = [Episode(f"question {i}", models[i % 3], 1.0 if i % 3 == 0 else 0.0, 1 / 3) for i in range(300)]
    conductor = serving(write_config, tmp_path, Policy.fit_logged(episodes, [single(m) for m in models]),
                        without="gemini-pro", epsilon=0.3, seed=2)
    chosen = {asyncio.run(conductor.propose(request(f"question {i}"))).plan.workers[0] for i in range(200)}
    assert "gemini-pro" not in chosen and "gemini-flash" in chosen


@pytest.mark.parametrize("twins", [False, True], ids=["singles", "with-a-panel"])
def test_replay_of_a_new_workers_first_day(tmp_path, twins):
    """With the twins known, the policy has a learned panel, and the newcomer a seat in it too."""
    header, rows = make_rows(1500, seed=11, twins=twins)
    train = write_csv(tmp_path / "train.csv", header, rows[:900])
    test = write_csv(tmp_path / "test.csv", header, rows[900:])
    out = tmp_path / "report"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert replay.main(["--train", str(train), "--test", str(test), "--new-worker", NEW, "--json", "--quiet",
                            "--report", str(out)]) == 0
    result = json.loads(buf.getvalue())
    assert result["new_worker"] == NEW and len(result["new_worker_share_over_time"]) == 10
    assert (out / "new_worker.png").stat().st_size > 10_000
    assert [a["workers"][-1] for a in result["actions"].values()] == [NEW] * (1 + twins)
    never, trained_with = result["without_new_worker"], result["with_new_worker_from_start"]
    if not twins:
        assert result["accuracy"] > never["accuracy"] + 0.05
        assert result["last_half"]["accuracy"] >= trained_with["last_half"]["accuracy"] - 0.03
    else:
        # Two actions to explore on a 600-query stream: the panel (useless here but for algebra)
        # is tried and learned, and the last half still gains on the policy that never sees it.
        assert result["actions"][f"panel-3+{NEW}"]["updates"] > 0
        assert result["last_half"]["accuracy"] > never["last_half"]["accuracy"] + 0.03


@pytest.fixture(scope="module")
def twins():
    """With the twins known as well, the policy learns a 3-panel."""
    header, rows = make_rows(1500, seed=5, twins=True)
    matrix = from_rows(header, rows)
    train, test = matrix.subset(range(900)), without(matrix.subset(range(900, 1500)), [NEW])
    return rows, test, Policy.fit_matrix(without(train, [NEW]), cost_weight=0.0, folds=2)


def test_a_new_worker_joins_the_policys_best_learned_panel_weighed_by_its_own_head(twins):
    """The newcomer gets a seat in the panel, and its answer counts as much as its single head says
    it is right: on biology, where it is right 95% of the time, a trained head makes the panel
    answer as it does; untrained, the panel's own answer stands."""
    rows, test, policy = twins
    panel = max((w for w in policy.workflows if w.kind == "panel"), key=lambda w: policy.meta["train_quality"][w.name])
    newcomers = Newcomers(policy, {NEW: 1.0})
    joined = newcomers.newcomers[1]
    assert (joined.name, joined.kind, joined.workers) == (f"{panel.name}+{NEW}", "panel", (*panel.workers, NEW))
    assert joined.cost == pytest.approx(1.0 + policy.mean_costs[policy.names.index(panel.name)])

    bio = [i for i, p in enumerate(test.prompts) if topic_of(p) == "biology"]
    cols = [test.models.index(m) for m in panel.workers]
    candidates, probs = newcomers.panel_probabilities(panel.workers, [test.prompts[i] for i in bio],
                                                      [test.eval_names[i] for i in bio], test.answer_columns("t")[bio][:, cols])
    new_answers = [r[f"{NEW}|answer"] for r in rows[900:]]
    reference = [r["answer"] for r in rows[900:]]

    def accuracy(p_right: float) -> float:
        answers = [join(c, p, new_answers[i], p_right) for c, p, i in zip(candidates, probs, bio, strict=True)]
        return float(np.mean([a == reference[i] for a, i in zip(answers, bio, strict=True)]))

    panel_alone = float(np.mean([c[int(np.argmax(p[:len(c)]))] == reference[i] for c, p, i in zip(candidates, probs, bio, strict=True)]))
    assert accuracy(0.95) > ACCURACY[NEW]["biology"] - 0.05 > panel_alone + 0.3
    assert accuracy(0.26) == pytest.approx(panel_alone, abs=0.03)


def test_the_policy_sees_a_requests_tools_and_training_reads_what_serving_saw(write_config, tmp_path):
    from baton.v1 import responses_pb2
    from baton_platform.dataset import Reward, episode_row
    from baton_workflow import policy_query

    # Tool requests are served well by one worker, plain ones by another: only the markers tell them apart.
    models = ["gemini-1.5-pro-002", "gemini-1.5-flash-002"]
    episodes = []
    for i in range(400):
        tools = ["get_weather"] if i % 2 else []
        action = models[i % 4 // 2]
        good = (action == models[0]) == bool(tools)
        episodes.append(Episode(policy_query(f"what is the weather like, case {i}", tools), action, float(good), 0.5))
    conductor = serving(write_config, tmp_path, Policy.fit_logged(episodes, [single(m) for m in models]),
                        without="llama-70b", epsilon=0.0, seed=0)
    with_tools = request("what is the weather like, case 9999")
    with_tools.answer.tools.add(name="get_weather")
    assert asyncio.run(conductor.propose(with_tools)).action == models[0]
    assert asyncio.run(conductor.propose(request("what is the weather like, case 9999"))).action == models[1]
    # The episode records the same text, and the trainer reads it from there.
    response = responses_pb2.Response(request_id="r1")
    response.episode.request.CopyFrom(with_tools)
    row = episode_row(response, Reward(None, None, None, None, ""), 0, 0)
    assert row["policy_query"] == policy_query("what is the weather like, case 9999", ["get_weather"])


def test_a_new_workers_replay_can_vary_the_streams_order_with_the_fitted_policies_kept():
    """--stream-seed reorders the stream and redraws its choices; --seed alone refits the policies."""
    from baton_eval.newworker import run_new_worker

    header, rows = make_rows(1500, seed=11)
    matrix = from_rows(header, rows)
    train, test = matrix.subset(range(900)), matrix.subset(range(900, 1500))

    def replayed(**seeds):
        return run_new_worker(train, test, NEW, folds=2, singles_only=True, **seeds)

    base, base_series = replayed(seed=0)
    reordered, reordered_series = replayed(seed=0, stream_seed=1)
    refitted, _ = replayed(seed=1, stream_seed=0)
    assert (base["seed"], base["stream_seed"], reordered["stream_seed"]) == (0, 0, 1)
    # The same fitted references, met in another order.
    for ref in ("with", "absent"):
        assert not np.array_equal(base_series[ref], reordered_series[ref])
        assert sorted(base_series[ref]) == sorted(reordered_series[ref])
    assert reordered["without_new_worker"]["accuracy"] == base["without_new_worker"]["accuracy"]
    assert reordered["with_new_worker_from_start"]["accuracy"] == base["with_new_worker_from_start"]["accuracy"]
    # Fitted with seed 1 (the stream seed above), the policy that never sees the worker routes
    # otherwise: so the equal references above show that the stream seed did not refit them.
    assert refitted["without_new_worker"]["accuracy"] != base["without_new_worker"]["accuracy"]
