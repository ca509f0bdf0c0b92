"""`baton eval` reaches each offline evaluation, and the trainer's own command no longer offers them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from baton_trainer.__main__ import main as trainer_main


@pytest.mark.parametrize("mode", ["replay", "heldout", "table"])
def test_baton_eval_runs_each_evaluation(mode):
    out = subprocess.run([sys.executable, "-m", "baton_tools.cli", "eval", mode, "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: baton eval {mode} ")


def test_the_trainer_leaves_evaluation_to_baton_eval(capsys):
    assert trainer_main(["replay", "--help"]) == 2
    assert "replay" not in capsys.readouterr().err.split("{")[1]
