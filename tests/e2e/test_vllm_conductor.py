"""The router plans on vLLM's engine in process (the CPU build, SmolLM2-135M), every service its own
process on a real broker: questions through the official client are planned by vLLM under the plan
grammar, every plan is valid (none is replaced by the fallback plan), log-probs reach the episodes, and
LoRA versions the trainer publishes roll out to the router live, a bad one is refused while the served
one stays, and a rollback works.

The router runs from the vLLM environment (tools/vllm/setup.sh), as `baton up` starts it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from testbed import MMLU_PRO, default_config_data, running_stack, wait_for_episodes

from baton_tools.stack import Stack

pytestmark = pytest.mark.timeout(2400)

BASE = "smollm2-135m-instruct"
MAX_RANK = 16


def trainer(*args: str, config: Path, bootstrap: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "baton_trainer", *args, "--config", str(config),
                           "--bootstrap-servers", bootstrap], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def structure(info: dict) -> list[tuple[str, object]]:
    """A served plan's workers and what each step reads."""
    return [(s["worker"], s["access"]) for s in info["plan"]["steps"]]


def router_metric(stack: Stack, line_start: str) -> float:
    router = next(s for s in stack.services if s.name == "router")
    text = urllib.request.urlopen(f"http://127.0.0.1:{router.port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def test_the_router_plans_on_vllm_and_serves_published_lora_versions(kafka_bootstrap, tmp_path):
    from baton_eval.gpu_check import build_adapter, model_shape
    from baton_router.conductor.vllm_backend import default_model

    data = default_config_data()
    # Instructions of at most 40 characters: the longest plan the schema allows fits in max_tokens.
    # No worked example, as the shipped config: the router refuses a plan that copies it, which no grammar
    # can rule out.
    data["conductor"] = {"backend": "vllm", "max_steps": 3, "max_subtask_chars": 40, "plan": data["conductor"]["plan"],
                         "prompt_example": False,
                         # Greedy, so that a version's effect on the plans shows.
                         "vllm": {"constraint": "grammar", "temperature": 0.0, "max_tokens": 192,
                                  "max_model_len": 2048, "max_loras": 2, "max_lora_rank": MAX_RANK}}
    data["kafka"] = {"partitions": 2, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["reward_logger"] = {"flush_interval_s": 0.5}
    # Planning shares two cores with the engine's start and whatever else runs: minutes, not seconds.
    data["gateway"] = {**data.get("gateway", {}), "request_timeout_s": 900}
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        questions = [r["prompt"] for _, r in zip(range(3), csv.DictReader(f))]
    shape = model_shape(default_model())
    for name, seed, rank in (("v1", 2, 8), ("v2", 3, 2 * MAX_RANK), ("v3", 4, 8)):
        build_adapter(tmp_path / "adapters" / name, default_model(), shape, seed, rank=rank, scale=0.5)
    store = tmp_path / "store"

    with running_stack(data, tmp_path / "run", kafka_bootstrap, start_timeout=300) as stack:
        cfg = stack.config_file
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=960)

        def plan(question: str, model: str = "baton") -> dict:
            reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
            assert reply.choices[0].message.content
            return reply.model_extra["baton"]

        base = [plan(q) for q in questions]
        rows = wait_for_episodes(stack.dataset_dir, {info["request_id"] for info in base}, columns=[
            "plan_backend", "plan_fallback", "plan_invalid_reason", "plan_token_logprobs"])

        published = trainer("publish-lora", "--adapter", str(tmp_path / "adapters" / "v1"), "--store", str(store),
                            "--version", "v1", config=cfg, bootstrap=kafka_bootstrap)
        assert published["kind"] == "lora"
        deadline = time.monotonic() + 300
        while (first := plan(questions[0]))["plan"]["policy_version"] != "v1":
            assert time.monotonic() < deadline, f"the router still plans with {first['plan']['policy_version']}"
            time.sleep(2)
        on_v1 = [first, *(plan(q) for q in questions[1:])]

        # v2's rank is above the engine's limit: the router reports it and keeps planning with v1.
        trainer("publish-lora", "--adapter", str(tmp_path / "adapters" / "v2"), "--store", str(store),
                "--version", "v2", config=cfg, bootstrap=kafka_bootstrap)
        deadline = time.monotonic() + 120
        while router_metric(stack, 'baton_policies_failed_total{kind="lora"}') < 1:
            assert time.monotonic() < deadline, "the refused adapter was never reported"
            time.sleep(1)
        after_v2 = plan(questions[0])

        trainer("publish-lora", "--adapter", str(tmp_path / "adapters" / "v3"), "--store", str(store),
                "--version", "v3", config=cfg, bootstrap=kafka_bootstrap)
        deadline = time.monotonic() + 300
        while plan(questions[1])["plan"]["policy_version"] != "v3":
            assert time.monotonic() < deadline, "v3 was not served"
            time.sleep(2)
        rolled = trainer("rollback", "--store", str(store), "--to", "v1", config=cfg, bootstrap=kafka_bootstrap)
        assert rolled["rolled_back"] is True
        deadline = time.monotonic() + 120
        while (back := plan(questions[0]))["plan"]["policy_version"] != "v1":
            assert time.monotonic() < deadline, "the rollback to v1 was not served"
            time.sleep(2)
        # A client may ask for a version by name, whatever the default is.
        named = plan(questions[0], model="v3")

    print("plans:", json.dumps([[(s["worker"], s["instruction"][:50], s["access"]) for s in i["plan"]["steps"]]
                                for i in base + on_v1]))
    assert all(info["plan"]["backend"] == "vllm" for info in base + on_v1)
    written = [r for r in rows if r["plan_backend"] == "vllm"]
    assert len(written) == len(questions)
    # Under the plan grammar a plan the router refuses is a defect: the grammar says every rule a plan
    # must keep (known workers, equal list lengths, earlier-only access, the step bound).
    assert [r["plan_invalid_reason"] for r in written if r["plan_fallback"]] == []
    served = [*base, *on_v1, after_v2, back, named]
    assert [i["plan"]["steps"] for i in served if i["plan"]["fallback"]] == []
    assert {i["plan"]["policy_version"] for i in base} == {BASE}
    assert {i["plan"]["policy_version"] for i in on_v1} == {"v1"}
    assert [i["plan"]["steps"] for i in on_v1] != [i["plan"]["steps"] for i in base], "the adapter changed plans"
    assert after_v2["plan"]["policy_version"] == "v1"
    # The same workers and reads as v1 wrote; the instructions a random adapter writes sit on near-tied
    # logits, whose greedy choice a reload of the adapter into another slot may flip.
    assert structure(back) == structure(on_v1[0])
    assert named["plan"]["policy_version"] == "v3"
    assert all(r["plan_token_logprobs"] and max(r["plan_token_logprobs"]) <= 0 for r in written)
