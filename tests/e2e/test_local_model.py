"""The default pool's real model: SmolLM2-135M-Instruct served by vLLM's CPU build, started and stopped
with the stack, answers the questions the sim workers' matrix does not hold (their `fallback`).

Needs the vLLM environment and the converted model (`make test` runs tools/vllm/setup.sh first; the
launcher runs it too, so the test also works alone, after a long first install)."""

from __future__ import annotations

import csv
import sys
import time

import openai
import pytest
from testbed import MMLU_PRO, default_config_data, running_stack, wait_for_episodes

from baton_tools.procs import free_port, group_alive, port_open

pytestmark = pytest.mark.timeout(1500)

LOCAL = "smollm2"


def test_a_question_the_matrix_lacks_is_answered_by_the_real_model(kafka_bootstrap, tmp_path):
    port = free_port()
    data = default_config_data(local_model_port=port)
    assert all(w.get("fallback") == LOCAL for w in data["workers"] if w.get("sim"))
    # One step on a sim worker: the matrix question stays there, the free one falls back to the model.
    data["conductor"]["plan"] = {"workers": ["gemini-flash"], "subtasks": ["Answer the question."], "access": [[]]}
    data["kafka"] = {"partitions": 2, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["reward_logger"] = {"flush_interval_s": 0.5}
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        known = next(csv.DictReader(f))

    started = time.monotonic()
    with running_stack(data, tmp_path / "run", kafka_bootstrap, start_timeout=300) as stack:
        print(f"stack with the vLLM server ready in {time.monotonic() - started:.0f} s")
        model_server = next(s for s in stack.services if s.name == f"model-{LOCAL}")
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=600)
        free = client.chat.completions.create(model="baton", messages=[
            {"role": "user", "content": "What is the capital of France?"}])
        matrix = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": known["prompt"]}])
        rows = wait_for_episodes(stack.dataset_dir, {free.model_extra["baton"]["request_id"],
                                                     matrix.model_extra["baton"]["request_id"]}, columns=["steps"])

    answer = free.choices[0].message.content
    info = free.model_extra["baton"]
    print("answer:", answer, "| steps:", info["steps"])
    # The plan named the sim worker; the step ran, on its second attempt, on the real model. The router
    # sent the one-step plan straight to the sim executor, which handed the failed step to the synthesizer
    # for the fallback (router.direct_single_step).
    assert info["plan"]["steps"][0]["worker"] == "gemini-flash"
    executor_log = (stack.run_dir / "logs" / "executor-sim-0.log").read_text().splitlines()
    assert any(info["request_id"] in line and "goes to the synthesizer for the fallback" in line
               for line in executor_log), "the step did not go through the sim executor's hand-over"
    (step,) = info["steps"]
    assert (step["worker"], step["attempt"], step["model"]) == (LOCAL, 2, "smollm2-135m-instruct")
    assert step["output_tokens"] > 0 and "error" not in step
    assert "Paris" in answer and "cannot answer" not in answer
    # A question the matrix holds is still the sim worker's, first time.
    (sim_step,) = matrix.model_extra["baton"]["steps"]
    assert (sim_step["worker"], sim_step["attempt"]) == ("gemini-flash", 1)
    # The episode records who answered.
    by_id = {r["request_id"]: r for r in rows}
    recorded = by_id[info["request_id"]]["steps"][0]
    assert (recorded["worker"], recorded["attempt"]) == (LOCAL, 2)
    # Stopping the stack stopped the model server and every process it started.
    assert not group_alive(model_server.pid)
    assert not port_open(port)
