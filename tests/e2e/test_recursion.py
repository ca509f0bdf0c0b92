"""The conductor named as a worker, with every service its own process on a real Kafka broker.

The static conductor's plan hands its second step to the conductor; the inner call writes a
corrective workflow (the configured inner plan) whose one step, on a local OpenAI-compatible
server that echoes what it was sent, must see the workflow so far. Its answer becomes the answer.
"""

from __future__ import annotations

import openai
import pytest
from testbed import default_config_data, episode_of, episodes, first_question, running_stack, wait_for

from baton_tools.standins.server import run_standin


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    # Context managers stop the stand-in and the stack even when starting either one fails.
    with run_standin("openai", mode="subprocess") as standin_url:
        data = default_config_data()
        data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                                "base_url": standin_url})
        data["conductor"]["plan"] = {"workers": ["gemini-flash", "llama-70b", "conductor"],
                                     "subtasks": ["Solve it.", "Solve it another way.", "Check the answer."],
                                     "access": [[], [], [0]]}
        data["conductor"]["inner_plan"] = {"workers": ["local-llm"], "subtasks": ["Correct the answer if needed."],
                                           "access": [[]]}
        data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
        with running_stack(data, tmp_path_factory.mktemp("recursion"), kafka_bootstrap) as st:
            yield st


def test_a_conductor_step_runs_a_corrective_workflow_that_sees_the_workflow_so_far(stack):
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    row = first_question()
    raw = client.chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": row["prompt"]}])
    completion = raw.parse()
    answer = completion.choices[0].message.content
    # The corrective step saw its instruction and the workflow so far as the conductor step could
    # read it: step 1's answer (the sim worker's recorded one), never step 2's.
    assert answer.startswith("[local-model] saw:") and "Correct the answer if needed." in answer
    assert f"The answer is ({row['gemini-1.5-flash-002|answer']})." in answer
    assert "Solve it another way." not in answer
    info = completion.model_extra["baton"]
    conductor_step = info["steps"][2]
    assert conductor_step["worker"] == "conductor"
    assert [s["worker"] for s in conductor_step["inner_plan"]["steps"]] == ["local-llm"]
    assert info["calls"] == 3, "two steps, plus the one call of the corrective workflow"
    request_id = raw.headers["x-baton-request-id"]

    ep = wait_for(lambda: episode_of(stack.dataset_dir, request_id), 20)
    assert ep is not None and ep["answer"] == answer
    assert [s["worker"] for s in ep["steps"]] == ["gemini-flash", "llama-70b", "conductor"]
    # Only the user's request is an episode: the inner workflow lives inside its conductor step.
    assert not any(r["request_id"].startswith(request_id + ":") for r in episodes(stack.dataset_dir))


def test_the_demo_shows_each_plan_and_the_conductors_correction(stack):
    from baton_tools.demo import run_demo

    lines = []
    summary = run_demo(stack.base_url, stack.config, count=2, out=lines.append)
    text = "\n".join(lines)
    assert summary["questions"] == 2 and summary["calls"] == 6
    assert "1. gemini-flash: \"Solve it.\" (reads nothing)" in text
    assert "3. conductor: \"Check the answer.\" (reads 1)" in text
    assert "the conductor corrected it with:\n        1. local-llm: \"Correct the answer if needed.\"" in text
    assert text.count("    step 3: conductor") == 2
