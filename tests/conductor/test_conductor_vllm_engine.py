"""The 'vllm' conductor on vLLM's real engine, the CPU build, with SmolLM2-135M (the default model):
plans decoded under the plan grammar all parse, log-probs come back, and LoRA policy versions are
loaded, picked, refused and rolled back as the router does it when the trainer publishes them.

vLLM lives in its own environment (tools/vllm/setup.sh; `make test` builds it first), so the engine
runs in a child process of that environment's python (vllm_engine_probe.py), which reports what it
saw; the assertions are here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from baton_tools.model_servers import ENGINE_ENV, ensure_vllm

pytestmark = pytest.mark.timeout(1800)

PROBE = Path(__file__).with_name("vllm_engine_probe.py")


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    install = ensure_vllm(lambda *_: None)
    workdir = tmp_path_factory.mktemp("vllm-probe")
    out = workdir / "result.json"
    done = subprocess.run([str(install.python), str(PROBE), str(workdir), str(out)], env={**os.environ, **ENGINE_ENV},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-4000:]
    result = json.loads(out.read_text())
    print(json.dumps({k: v for k, v in result.items() if k != "greedy"}, indent=1)[:3000])
    return result


def test_the_default_model_is_the_converted_smollm2_run_eagerly_on_cpu(probed):
    assert Path(probed["model"]).name == "smollm2-135m-instruct"
    args = probed["engine_args"]
    assert args["enforce_eager"] is True
    assert args["structured_outputs_config"] == {"backend": "xgrammar", "disable_any_whitespace": True}


def test_every_sampled_plan_parses_and_carries_its_log_probs(probed):
    sampled = probed["sampled"]
    assert all("error" not in s for s in sampled), [s.get("error") for s in sampled]
    assert all(s["valid"] for s in sampled), "the grammar also enforces equal lengths and earlier-only access"
    for s in sampled:
        assert s["tokens"] > 10 and s["max_logprob"] <= 0
        # At temperature 1 the plan's log-propensity is the sum of its tokens' log-probs, in log space:
        # no underflow to the 0.0 a probability would give for a long plan.
        assert s["log_propensity"] == pytest.approx(s["logprob_sum"])
        assert s["propensity"] == pytest.approx(math.exp(s["log_propensity"]), abs=1e-300)
        assert s["version"] == "smollm2-135m-instruct"


def test_lora_versions_are_served_refused_named_and_rolled_back(probed):
    greedy = probed["greedy"]
    plans = {k: [p["plan"] for p in v] for k, v in greedy.items()}
    versions = {k: {p["version"] for p in v} for k, v in greedy.items()}
    assert versions["base"] == {"smollm2-135m-instruct"}
    # An adapter whose B is zero changes nothing: the engine applied it and the plans are the base's.
    assert versions["v0"] == {"v0"} and plans["v0"] == plans["base"]
    # A trained (here: random) adapter is what plans next, and its plans differ.
    assert versions["v1"] == {"v1"} and plans["v1"] != plans["base"]
    # An adapter the engine cannot take is refused, and the version served stays v1.
    assert probed["v2_refused"] and "v2" in probed["v2_refused"]
    assert probed["default_after_v2"] == "v1" and versions["after_v2"] == {"v1"} and plans["after_v2"] == plans["v1"]
    # A request may name a version; a rollback serves the earlier one again.
    assert versions["by_name_v0"] == {"v0"} and plans["by_name_v0"] == plans["base"]
    assert versions["rolled_back"] == {"v0"} and plans["rolled_back"] == plans["base"]
    # Greedy decoding: the plan is certain, log 1 = 0.
    assert all(p["log_propensity"] == 0.0 for p in greedy["v1"])
