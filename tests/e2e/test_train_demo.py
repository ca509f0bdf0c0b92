"""`make train-demo` end to end (its own broker and services): explore, train, gate, roll out, fresh traffic."""

from __future__ import annotations

from baton_tools.train_demo import run_train_demo


def test_the_train_demo_learns_a_policy_that_does_better_on_fresh_questions(tmp_path):
    lines = []
    report = run_train_demo(tmp_path / "train-demo", n_train=500, n_fresh=100, out=lines.append)
    assert report["published"], report["gate"]
    assert report["gate"]["lower"] > 0
    assert report["after"]["accuracy"] > report["before"]["accuracy"]
    assert (tmp_path / "train-demo" / "train_demo.png").stat().st_size > 0
    assert any(line.startswith("3/4 rollout: the router serves") for line in lines)
