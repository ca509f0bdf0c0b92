"""`make train-demo` end to end (its own broker and services): explore, train, gate, roll out, fresh traffic."""

from __future__ import annotations

from baton_tools.train_demo import run_train_demo


def test_the_train_demo_learns_a_policy_that_beats_uniform_routing_on_the_same_fresh_questions(tmp_path):
    lines = []
    report = run_train_demo(tmp_path / "train-demo", n_train=500, n_fresh=100, out=lines.append)
    print("\n".join(lines))
    assert report["published"], report["gate"]
    assert report["gate"]["lower"] > 0
    # Uniform routing's accuracy on the fresh questions is computed from the matrix: true only if
    # the sim workers answer as it records, which the fresh answers themselves show.
    agree = report["matrix_agreement"]
    assert agree["one_worker_answers"] > 0 and agree["agreeing"] == agree["one_worker_answers"], agree
    # Both on the same fresh questions. A policy that learned nothing routes about as uniform routing
    # does and beats it about half the time; the second line fails it in all but 1 run in 1,000.
    assert report["after"]["accuracy"] > report["before"]["accuracy"]
    assert report["p_uniform_as_good"] < 1e-3, report
    assert (tmp_path / "train-demo" / "train_demo.png").stat().st_size > 0
    assert any(line.startswith("3/4 rollout: the router serves") for line in lines)
