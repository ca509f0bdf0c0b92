"""Held-out groups: whole subjects on one side of a split, and the fast policy's gain over the test
side's best single model over several seeds."""

from __future__ import annotations

import json

import pytest
from testbed import MMLU_PRO

from baton_eval.heldout import held_out_split
from baton_eval.heldout import main as heldout_main
from baton_policy.matrix import from_rows, group_key, read_rows
from baton_trainer.split import split_indices

MODELS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002"]


@pytest.fixture(scope="module")
def matrix():
    header, rows = read_rows(MMLU_PRO)
    return from_rows(header, rows[::6], models=MODELS)


def test_a_split_by_eval_name_keeps_each_subject_on_one_side_and_varies_with_the_seed(matrix):
    sides = []
    for seed in (0, 1):
        train, test = split_indices(matrix.prompts, 0.3, seed, list(matrix.eval_names))
        held = {matrix.eval_names[i] for i in test}
        assert held and not held & {matrix.eval_names[i] for i in train}
        assert 0.25 <= len(test) / len(matrix) <= 0.5
        sides.append(held)
    assert sides[0] != sides[1]
    with pytest.raises(ValueError, match="two groups"):
        split_indices(["a", "b"], 0.3, 0, ["g", "g"])


def test_the_test_side_shares_no_question_with_the_training_side(matrix):
    train, test = held_out_split(matrix, "eval_name", 0, 0.3)
    assert not {group_key(p) for p in train.prompts} & {group_key(p) for p in test.prompts}
    assert set(train.eval_names).isdisjoint(test.eval_names)


@pytest.mark.slow
def test_heldout_reports_each_seeds_gain_over_the_test_sides_best_single_and_the_spread(capsys):
    code = heldout_main(["--in", str(MMLU_PRO), "--models", ",".join(MODELS), "--by", "eval_name", "--seeds", "2"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["seed"] for s in result["splits"]] == [0, 1]
    for s in result["splits"]:
        assert s["best_single"] in MODELS and s["test_groups"]
        assert s["gain_points"] == pytest.approx(100 * (s["policy_accuracy"] - s["best_single_accuracy"]), abs=0.02)
    gains = [s["gain_points"] for s in result["splits"]]
    assert result["gain_points_min"] == min(gains) and result["gain_points_sd"] >= 0
    assert heldout_main(["--in", str(MMLU_PRO), "--seeds", "0"]) == 2


def test_heldout_scores_the_routers_estimate_as_one_call_to_its_first_worker(capsys):
    import numpy as np

    from baton_eval.heldout import held_out_split
    from baton_policy.evidence import Evidence

    code = heldout_main(["--in", str(MMLU_PRO), "--models", ",".join(MODELS), "--by", "question", "--seeds", "1",
                         "--router", "estimate"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    split = result["splits"][0]
    assert result["router"] == "estimate" and split["calls_per_query"] == 1.0
    # The same figure by hand: the estimate fitted on the training side, each test question's first worker.
    header, rows = read_rows(MMLU_PRO)
    train, test = held_out_split(from_rows(header, rows, models=MODELS), "question", 0, 0.3)
    pick = Evidence.fit(train, seed=0).chances(test.prompts).argmax(1)
    want = test.scores[np.arange(len(test)), pick].mean()
    assert split["policy_accuracy"] == pytest.approx(want, abs=1e-4)
