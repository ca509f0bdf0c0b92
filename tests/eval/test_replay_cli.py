from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from testbed import MMLU_PRO
from trainer_synth import make_rows, write_csv

from baton_eval import replay
from baton_policy.matrix import group_key, load_matrix
from baton_trainer import split
from baton_trainer.split import split_indices

# ---------------------------------------------------------------- split


def test_split_is_grouped_deterministic_and_complete(tmp_path):
    header, rows = make_rows(300, seed=2)
    # Repeat some questions under new sample ids: a question must stay on one side.
    for i in range(0, 60, 3):
        dup = dict(rows[i])
        dup["sample_id"] = f"dup{i}"
        dup["prompt"] = "  " + rows[i]["prompt"].upper() + " "
        rows.append(dup)
    src = write_csv(tmp_path / "all.csv", header, rows)
    assert split.main(["--in", str(src), "--train", str(tmp_path / "a.csv"), "--test", str(tmp_path / "b.csv"),
                       "--test-share", "0.3", "--seed", "4"]) == 0
    a = list(csv.DictReader(open(tmp_path / "a.csv")))
    b = list(csv.DictReader(open(tmp_path / "b.csv")))
    ids_a, ids_b = {r["sample_id"] for r in a}, {r["sample_id"] for r in b}
    assert not ids_a & ids_b
    assert ids_a | ids_b == {r["sample_id"] for r in rows}
    assert not {group_key(r["prompt"]) for r in a} & {group_key(r["prompt"]) for r in b}
    assert abs(len(b) / len(rows) - 0.3) < 0.02
    again = split_indices([r["prompt"] for r in rows], 0.3, 4)
    assert sorted(r["sample_id"] for r in b) == sorted(rows[i]["sample_id"] for i in again[1])
    other = split_indices([r["prompt"] for r in rows], 0.3, 5)
    assert other[1] != again[1]
    # Row order does not matter.
    shuffled = list(reversed(rows))
    tr, te = split_indices([r["prompt"] for r in shuffled], 0.3, 4)
    assert {shuffled[i]["sample_id"] for i in te} == ids_b


def test_split_rejects_bad_share():
    with pytest.raises(ValueError):
        split_indices(["a", "b"], 1.5)


# ---------------------------------------------------------------- replay CLI


@pytest.fixture(scope="module")
def synthetic_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    header, rows = make_rows(900, seed=3)
    return write_csv(d / "train.csv", header, rows[:600]), write_csv(d / "test.csv", header, rows[600:])


def test_replay_main_prints_one_json_object_with_required_keys(synthetic_files, tmp_path, capsys):
    train, test = synthetic_files
    code = replay.main(["--train", str(train), "--test", str(test), "--cost-weight", "0.1", "--json",
                        "--report", str(tmp_path / "rep"), "--save-policy", str(tmp_path / "pol"), "--folds", "3", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1
    result = json.loads(out)
    for key in ("accuracy", "avg_cost", "calls_per_query", "best_single", "oracle", "workflow_shares",
                "cost_source", "escalation", "frontier", "models"):
        assert key in result, key
    for key in ("model", "accuracy", "avg_cost", "calls_per_query"):
        assert key in result["best_single"]
    for key in ("accuracy", "avg_cost", "calls_per_query"):
        assert key in result["oracle"]
    assert "total_cost" in result["cost_source"]
    assert abs(sum(result["workflow_shares"].values()) - 1) < 1e-3
    assert result["oracle"]["accuracy"] >= result["best_single"]["accuracy"]
    # The routed policy beats every single model on this topic-structured data.
    assert result["accuracy"] > result["best_single"]["accuracy"] + 0.05
    assert 1.0 <= result["calls_per_query"]
    ws = [p["cost_weight"] for p in result["frontier"]]
    costs = [p["avg_cost"] for p in sorted(result["frontier"], key=lambda p: p["cost_weight"])]
    assert ws and costs[-1] <= costs[0]
    rep = tmp_path / "rep"
    assert (rep / "cost_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| best single:" in (rep / "report.md").read_text()
    assert (tmp_path / "pol" / "policy.json").is_file()


def test_replay_escalation_beats_random_routing(tmp_path, capsys):
    # Two models, a strong and a cheap one; the strong one is good at algebra only.
    header, rows = make_rows(900, seed=4)
    keep = [h for h in header if not h.startswith("bio-expert")]
    rows = [{k: r[k] for k in keep} for r in rows]
    train = write_csv(tmp_path / "tr.csv", keep, rows[:600])
    test = write_csv(tmp_path / "te.csv", keep, rows[600:])
    assert replay.main(["--train", str(train), "--test", str(test), "--json", "--quiet",
                        "--strong-model", "alg-expert", "--quality-target", "1.0"]) == 0
    esc = json.loads(capsys.readouterr().out)["escalation"]
    assert esc["strong"] == "alg-expert" and esc["alternatives"] == {"cheap": 300}
    # Matching the strong model's own accuracy by random routing needs (nearly) all traffic;
    # sending only the algebra questions (a third) to it is enough.
    assert esc["random_routing_share_needed"] > 0.9
    assert esc["share_needed"] is not None and esc["share_needed"] < 0.45
    curve = {p["share_strong"]: p["accuracy"] for p in esc["curve"]}
    assert curve[0.3] > max(curve[0.0], curve[1.0]) + 0.1


def test_replay_unit_costs_without_cost_columns(tmp_path, capsys):
    header, rows = make_rows(400, seed=9, with_answers=False)
    header = [h for h in header if not h.endswith("|total_cost")]
    rows = [{k: v for k, v in r.items() if k in header} for r in rows]
    train = write_csv(tmp_path / "tr.csv", header, rows[:300])
    test = write_csv(tmp_path / "te.csv", header, rows[300:])
    assert replay.main(["--train", str(train), "--test", str(test), "--json", "--quiet",
                        "--unit-cost", "cheap=0.25"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cost_source"].startswith("unit cost per call")
    assert result["models"]["cheap"]["avg_cost"] == 0.25
    assert result["models"]["alg-expert"]["avg_cost"] == 1.0
    assert result["workflows"] == {}  # no answers, so no panels


def test_replay_with_a_query_embedding_saves_it_in_the_policy(synthetic_files, tmp_path, capsys):
    train, test = synthetic_files
    assert replay.main(["--train", str(train), "--test", str(test), "--json", "--quiet", "--folds", "2",
                        "--embedding", "wordllama-l2_supercat-256", "--save-policy", str(tmp_path / "pol")]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("accuracy", "avg_cost", "calls_per_query", "best_single", "frontier"):
        assert key in result, key
    assert result["accuracy"] > result["best_single"]["accuracy"] + 0.05
    saved = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert saved["featurizer"]["embedding"] == "wordllama-l2_supercat-256"
    with pytest.raises(SystemExit):
        replay.main(["--train", str(train), "--test", str(test), "--embedding", "no-such-embedding"])


def test_replay_reports_bad_input(tmp_path, capsys):
    assert replay.main(["--train", str(tmp_path / "missing.csv"), "--test", str(tmp_path / "x.csv"), "--quiet"]) == 2
    assert "error" in json.loads(capsys.readouterr().out)


def test_replay_refuses_train_and_test_files_that_share_questions(tmp_path, capsys):
    header, rows = make_rows(400, seed=5)
    train = write_csv(tmp_path / "tr.csv", header, rows[:300])
    test = write_csv(tmp_path / "te.csv", header, rows[290:])  # ten questions in both files
    assert replay.main(["--train", str(train), "--test", str(test), "--json", "--quiet"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "share 10 question(s)" in error and "baton_trainer split" in error


# ---------------------------------------------------------------- smoke test on real data


def test_smoke_on_a_slice_of_mmlu_pro(tmp_path, capsys):
    src = MMLU_PRO
    with open(src, newline="", encoding="utf-8") as fh:
        csv.field_size_limit(1 << 30)
        reader = csv.DictReader(fh)
        header = reader.fieldnames
        rows = [r for _, r in zip(range(500), reader, strict=False)]
    sliced = write_csv(tmp_path / "slice.csv", header, rows)
    split.main(["--in", str(sliced), "--train", str(tmp_path / "a.csv"), "--test", str(tmp_path / "b.csv"), "--seed", "0"])
    capsys.readouterr()
    m = load_matrix(tmp_path / "a.csv")
    assert m.has_answers and m.cost_source == "output_chars" and len(m.models) == 28
    assert replay.main(["--train", str(tmp_path / "a.csv"), "--test", str(tmp_path / "b.csv"), "--json", "--quiet",
                        "--folds", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["best_single"]["model"] in m.models
    assert result["oracle"]["accuracy"] >= result["best_single"]["accuracy"]
    assert "output_chars" in result["cost_source"]
    assert any(k.startswith("panel-") for k in result["workflows"])
    panel8 = result["workflows"].get("panel-8")
    assert panel8 is not None and panel8["calls_per_query"] == 8.0
    assert np.isfinite(result["avg_cost"])
