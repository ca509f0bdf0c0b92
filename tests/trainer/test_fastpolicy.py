from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from trainer_synth import ACCURACY, make_rows, topic_of

from baton_policy.aggregate import PanelAggregator, join, parse_options, plurality
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.matrix import from_rows
from baton_policy.templates import Workflow, candidate_workflows, evaluate_workflows, single


@pytest.fixture(scope="module")
def data():
    header, rows = make_rows(900, seed=1)
    train = from_rows(header, rows[:600])
    test = from_rows(header, rows[600:])
    return train, test


@pytest.fixture(scope="module")
def singles_policy(data):
    train, _ = data
    return Policy.fit_matrix(train, [single(m) for m in train.models])


def _accuracy(policy, matrix, cost_weight=0.0):
    outcomes = evaluate_workflows(matrix, policy.workflows, policy.aggregators)
    pick = policy.values(matrix.prompts, matrix.eval_names, cost_weight).argmax(1)
    rows = np.arange(len(matrix))
    return outcomes.scores[rows, pick].mean(), outcomes.costs[rows, pick].mean(), pick


def test_matrix_learning_beats_random_and_best_single(data, singles_policy):
    _, test = data
    acc, _, pick = _accuracy(singles_policy, test)
    random_acc = test.scores.mean()  # expected accuracy of a uniformly random choice
    best_single = test.scores.mean(0).max()
    assert acc > random_acc + 0.2
    assert acc > best_single + 0.1
    # It learned the topic structure: algebra questions go to the algebra expert.
    chosen = Counter((topic_of(p), singles_policy.names[a]) for p, a in zip(test.prompts, pick, strict=True))
    assert chosen[("algebra", "alg-expert")] > 0.9 * sum(v for (t, _), v in chosen.items() if t == "algebra")


def test_cost_weight_moves_traffic_to_the_cheap_model(data, singles_policy):
    _, test = data
    acc0, cost0, _ = _accuracy(singles_policy, test, 0.0)
    acc_hi, cost_hi, pick = _accuracy(singles_policy, test, 5.0)
    assert cost_hi < cost0
    assert Counter(singles_policy.names[a] for a in pick).most_common(1)[0][0] == "cheap"
    assert acc_hi <= acc0


def test_choose_reports_propensities(singles_policy):
    prompt = "Question x: solve the equation for the variable?"
    greedy = singles_policy.choose(prompt, "synthetic")
    assert greedy.workflow == "alg-expert" and greedy.propensity == 1.0 and greedy.workers == ["alg-expert"]
    rng = np.random.default_rng(0)
    picks = [singles_policy.choose(prompt, "synthetic", epsilon=0.3, rng=rng) for _ in range(1500)]
    props = {c.workflow: c.propensity for c in picks}
    assert props["alg-expert"] == pytest.approx(0.7 + 0.1)
    assert props["cheap"] == pytest.approx(0.1)
    share = sum(c.workflow == "alg-expert" for c in picks) / len(picks)
    assert share == pytest.approx(0.8, abs=0.04)


def test_logged_ips_learning_from_a_skewed_logger(data):
    train, test = data
    rng = np.random.default_rng(7)
    models = train.models
    # The logging policy prefers "cheap" (70%) and splits the rest; rewards are the logged outcomes.
    probs = np.array([0.15, 0.15, 0.70])
    episodes = []
    for i in range(len(train)):
        a = rng.choice(3, p=probs)
        episodes.append(Episode(train.prompts[i], models[a], float(train.scores[i, a]), float(probs[a]), train.eval_names[i]))
    policy = Policy.fit_logged(episodes, models)
    acc, _, _ = _accuracy(policy, test)
    assert acc > test.scores.mean() + 0.15
    assert acc > test.scores.mean(0).max() + 0.05
    # Tuples are accepted as well as Episode objects.
    as_tuples = [(e.prompt, e.action, e.reward, e.propensity, e.eval_name) for e in episodes[:50]]
    assert Policy.fit_logged(as_tuples, models).names == models


def test_logged_learning_rejects_bad_input(data):
    train, _ = data
    with pytest.raises(ValueError, match="propensities"):
        Policy.fit_logged([("q", "cheap", 1.0, 0.0)], train.models)
    with pytest.raises(ValueError, match="not among the workflows"):
        Policy.fit_logged([("q", "nobody", 1.0, 0.5)], train.models)


def test_logged_costs_enable_cost_tradeoff(data):
    train, test = data
    rng = np.random.default_rng(3)
    costs = {"alg-expert": 1.0, "bio-expert": 1.0, "cheap": 0.1}
    episodes = []
    for i in range(len(train)):
        a = int(rng.integers(3))
        m = train.models[a]
        episodes.append(Episode(train.prompts[i], m, float(train.scores[i, a]), 1 / 3, train.eval_names[i], costs[m]))
    policy = Policy.fit_logged(episodes, train.models, cost_weight=0.0)
    assert policy.mean_costs == pytest.approx([1.0, 1.0, 0.1])
    _, cost0, _ = _accuracy(policy, test, 0.0)
    _, cost_hi, _ = _accuracy(policy, test, 10.0)
    assert cost_hi < 0.5 * cost0


def test_save_load_roundtrip(tmp_path, data):
    train, test = data
    policy = Policy.fit_matrix(train, candidate_workflows(train), cost_weight=0.1, folds=3)
    out = policy.save(tmp_path / "pol")
    assert sorted(p.name for p in out.iterdir()) == ["arrays.npz", "policy.json"]
    config = json.loads((out / "policy.json").read_text())
    assert config["format"] == "baton-fastpolicy" and config["cost_weight"] == 0.1
    with np.load(out / "arrays.npz", allow_pickle=False) as npz:
        assert "value_coef" in npz.files
    loaded = Policy.load(out)
    assert loaded.names == policy.names
    np.testing.assert_allclose(
        loaded.values(test.prompts[:50], test.eval_names[:50]), policy.values(test.prompts[:50], test.eval_names[:50]), rtol=1e-5
    )
    for p, e in zip(test.prompts[:20], test.eval_names[:20], strict=True):
        assert loaded.choose(p, e) == policy.choose(p, e)
    a = evaluate_workflows(test, policy.workflows, policy.aggregators).scores
    b = evaluate_workflows(test, loaded.workflows, loaded.aggregators).scores
    np.testing.assert_array_equal(a, b)


def test_load_rejects_other_directories(tmp_path):
    (tmp_path / "policy.json").write_text(json.dumps({"format": "something-else", "version": 1}))
    with pytest.raises(ValueError):
        Policy.load(tmp_path)


def test_learned_panel_beats_plurality_when_members_err_together():
    header, rows = make_rows(1500, seed=5, twins=True)
    train, test = from_rows(header, rows[:1000]), from_rows(header, rows[1000:])
    workers = ("twin-a", "twin-b", "alg-expert")
    flows = [Workflow("vote", "vote", workers), Workflow("panel", "panel", workers)]
    from baton_policy.templates import fit_aggregators

    aggs = fit_aggregators(train, flows)
    out = evaluate_workflows(test, flows, aggs)
    vote_acc, panel_acc = out.scores.mean(0)
    # The twins agree on every question, so plurality just repeats the twins (50% right).
    assert vote_acc == pytest.approx(test.scores[:, test.models.index("twin-a")].mean())
    assert panel_acc > vote_acc + 0.05
    assert (out.calls == 3).all()


def test_escalate_counts_only_the_calls_it_makes():
    header, rows = make_rows(600, seed=11, twins=True)
    m = from_rows(header, rows)
    flows = [Workflow("panel", "panel", ("twin-a", "twin-b", "alg-expert")),
             Workflow("esc", "escalate", ("twin-a", "twin-b", "alg-expert"), first=2)]
    from baton_policy.templates import fit_aggregators

    out = evaluate_workflows(m, flows, fit_aggregators(m, flows))
    # The twins always agree, so the escalation never calls the third worker.
    assert (out.calls[:, 1] == 2).all()
    assert out.costs[:, 1] == pytest.approx(np.full(len(m), 1.0))
    expected = m.scores[:, m.models.index("twin-a")]
    np.testing.assert_array_equal(out.scores[:, 1], expected)


def test_aggregator_helpers():
    assert parse_options("Q?\nA. one\nB. two\nC) three") == {"A": "one", "B": "two", "C": "three"}
    assert plurality(["B", "A", "A", "B", ""]) == "B"  # tie goes to the earlier member
    assert plurality(["", ""]) == ""
    agg = PanelAggregator(["m1", "m2"], letters=False)
    answers = np.array([["5", "7"], ["5", "5"], ["7", "5"]] * 40, dtype=object)
    refs = ["5"] * 120
    agg.fit(answers, None, ["q"] * 120, [None] * 120, refs)
    assert agg.predict(np.array([["5", "9"]], dtype=object), None, ["q"], [None]) == ["5"]


def test_a_worker_the_panel_never_saw_joins_it_by_its_chance_of_being_right():
    """The panel leans 0.6 to A, 0.3 to B (four options). A newcomer saying B moves the answer when
    it is right often enough: B needs log(q * 3 / (1 - q)) > log(0.6 / 0.3), i.e. q > 0.4."""
    candidates, probs = list("ABCD"), np.array([0.6, 0.3, 0.05, 0.05])
    assert join(candidates, probs, "B", 0.35) == "A"
    assert join(candidates, probs, "B", 0.45) == "B"
    assert join(candidates, probs, "A", 0.1) == "A", "a weak newcomer agreeing keeps the panel's answer"
    assert join(candidates, probs, "", 0.9) == "A", "no answer: the panel's own"
    # Free-form answers: one the panel never gave can still win, when the newcomer is trusted enough.
    assert join(["5", "7"], np.array([0.55, 0.45]), "9", 0.3) == "5"
    assert join(["5", "7"], np.array([0.55, 0.45]), "9", 0.98) == "9"
    assert join([], np.zeros(0), "9", 0.5) == "9" and join([], np.zeros(0), "", 0.5) == ""


def test_aggregator_probabilities_agree_with_its_answers(data):
    train, test = data
    panel = next(w for w in candidate_workflows(train) if w.kind == "panel")
    policy = Policy.fit_matrix(train, [panel], folds=2, tune_trust_folds=0)
    agg = policy.aggregators[panel.workers]
    cols = [test.models.index(m) for m in panel.workers]
    args = (test.answer_columns("t")[:, cols], None, test.prompts, test.eval_names)
    candidates, probs = agg.probabilities(*args)
    assert np.allclose(probs.sum(1), 1.0) and (probs >= 0).all()
    assert agg.predict(*args) == [c[int(np.argmax(p[:len(c)]))] for c, p in zip(candidates, probs, strict=True)]


def test_policy_aggregate_serving_helper(data):
    train, _ = data
    flows = candidate_workflows(train)
    policy = Policy.fit_matrix(train, flows, folds=2)
    vote = next(w for w in policy.workflows if w.kind == "vote")
    answers = {w: "C" for w in vote.workers}
    assert policy.aggregate(vote.name, "Q?\nA. a\nB. b\nC. c\nD. d", answers) == "C"
    panel = next(w for w in policy.workflows if w.kind == "panel")
    got = policy.aggregate(panel.name, "Q?\nA. a\nB. b\nC. c\nD. d", {w: "B" for w in panel.workers}, "synthetic")
    assert got == "B"


def test_accuracy_table_is_consistent_with_synthetic_design(data):
    # Guards the generator itself: the per-topic accuracies show up in the matrix.
    train, _ = data
    topics = np.array([topic_of(p) for p in train.prompts])
    j = train.models.index("alg-expert")
    assert train.scores[topics == "algebra", j].mean() == pytest.approx(ACCURACY["alg-expert"]["algebra"], abs=0.08)


def test_panel_reliability_stacking_roundtrip(tmp_path):
    header, rows = make_rows(700, seed=13, twins=True)
    train, test = from_rows(header, rows[:500]), from_rows(header, rows[500:])
    workers = ("twin-a", "twin-b", "alg-expert", "bio-expert")
    flows = [single(m) for m in train.models] + [Workflow("panel", "panel", workers)]
    policy = Policy.fit_matrix(train, flows, folds=3, panel_reliability=True)
    agg = policy.aggregators[workers]
    assert agg.use_reliability
    rel = policy.reliability(test.prompts, test.eval_names)
    assert rel.shape == (len(test), len(train.models))
    out = evaluate_workflows(test, policy.workflows, policy.aggregators, rel)
    panel_acc = out.scores[:, -1].mean()
    # Knowing which expert fits the topic lets the panel beat every member on its own.
    assert panel_acc > test.scores[:, [test.models.index(w) for w in workers]].mean(0).max() + 0.05
    loaded = Policy.load(policy.save(tmp_path / "p"))
    again = evaluate_workflows(test, loaded.workflows, loaded.aggregators, loaded.reliability(test.prompts, test.eval_names))
    np.testing.assert_array_equal(out.scores, again.scores)
    with pytest.raises(ValueError, match="reliability"):
        evaluate_workflows(test, policy.workflows, policy.aggregators)
