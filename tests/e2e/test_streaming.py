"""Token streaming end to end: every service its own process on a real Kafka broker, the last step on
an OpenAI-compatible stand-in that streams slowly, read with the official OpenAI client.

No assertion here is about speed: they compare when chunks arrived relative to each other.
"""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from testbed import default_config_data, episode_of, first_question, running_stack, wait_for

from baton_tools.standins.server import configure_standin, reset_standin, run_standin

# The stand-in splits an answer into up to 32 chunks; this delay between them makes its stream last
# seconds, long against the workflow's steps before it.
CHUNK_DELAY_MS = 150


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    with run_standin("openai", mode="subprocess", chunk_delay_ms=CHUNK_DELAY_MS) as standin_url:
        data = default_config_data()
        data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                                "base_url": standin_url, "fallback": "gemini-pro"})
        data["conductor"]["plan"] = {"workers": ["gemini-flash", "local-llm"],
                                     "subtasks": ["Solve it.", "Check the first draft and answer."],
                                     "access": [[], [0]]}
        data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
        with running_stack(data, tmp_path_factory.mktemp("streaming"), kafka_bootstrap) as st:
            st.standin_url = standin_url
            yield st


@pytest.fixture
def client(stack):
    yield openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    reset_standin(stack.standin_url)


def ask(client, **kwargs):
    return client.chat.completions.create(model="baton", messages=[{"role": "user", "content": first_question()["prompt"]}],
                                          **kwargs)


def timed_chunks(stream):
    """Every chunk with the moment it arrived."""
    return [(time.monotonic(), chunk) for chunk in stream]


def content_of(chunks) -> list[str]:
    return [c.choices[0].delta.content for _, c in chunks if c.choices and c.choices[0].delta.content]


def test_the_last_steps_tokens_arrive_as_the_provider_produces_them(stack, client):
    whole = ask(client).choices[0].message.content  # also warms every service's connections up
    started = time.monotonic()
    chunks = timed_chunks(ask(client, stream=True, stream_options={"include_usage": True}))
    ended = time.monotonic()
    content = [(t, c) for t, c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 10, f"{len(content)} content chunks"
    # The acceptance criterion, as an ordering: the first token came in the first half of the request.
    first_at = content[0][0] - started
    assert first_at < (ended - started) / 2, (first_at, ended - started)
    streamed = "".join(content_of(chunks))
    assert streamed == whole, "the same answer as without streaming"
    assert streamed.startswith("[local-model] saw:") and "Check the first draft and answer." in streamed
    # include_usage: the finish reason, then one last chunk with no choices and the workflow's usage.
    finish = [c.choices[0].finish_reason for _, c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    last = chunks[-1][1]
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens > 0
    assert all(c.usage is None for _, c in chunks[:-1])


def test_a_provider_call_retried_mid_stream_still_streams_the_answer_once(stack, client):
    configure_standin(stack.standin_url, fail_first=1, fail_mid_stream=True)
    chunks = timed_chunks(ask(client, stream=True))
    streamed = "".join(content_of(chunks))
    assert streamed == ask(client).choices[0].message.content, "no text twice, none missing"
    assert all(c.usage is None for _, c in chunks), "no usage chunk unless asked for"


def test_a_fallback_that_changes_a_streamed_answer_ends_the_stream_with_an_error(stack, client):
    # Every call of the last step breaks half way: its worker's fallback (a sim worker) answers,
    # which is not what the client already got.
    configure_standin(stack.standin_url, fail_first=100, fail_mid_stream=True)
    received = []
    with pytest.raises(openai.APIError) as err:
        for chunk in ask(client, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert err.value.code == "stream_diverged", err.value
    assert received and "".join(received).startswith("[local-model] saw:"), "part of the first call went out"


def metric(stack, name: str) -> float:
    text = httpx.get(stack.gateway_metrics_url).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_client_that_leaves_mid_stream_leaves_the_workflow_and_its_episode_whole(stack, client):
    body = {"model": "baton", "stream": True, "messages": [{"role": "user", "content": first_question()["prompt"]}]}
    gone_before = metric(stack, 'baton_gateway_requests_total{status="499"}')
    with httpx.stream("POST", stack.base_url + "/chat/completions", json=body, timeout=60) as r:
        request_id = r.headers["x-baton-request-id"]
        for line in r.iter_lines():
            if line.startswith("data:") and '"content": "[local-model]' in line:
                break  # the first token: hang up
    assert wait_for(lambda: metric(stack, 'baton_gateway_requests_total{status="499"}') == gone_before + 1, 20)
    assert wait_for(lambda: metric(stack, "baton_gateway_waiting") == 0, 20), "the gateway forgot the request"

    ep = wait_for(lambda: episode_of(stack.dataset_dir, request_id), 30)
    assert ep is not None, "the workflow went on and its episode reached the dataset"
    assert ep["answer"].startswith("[local-model] saw:") and [s["worker"] for s in ep["steps"]] == [
        "gemini-flash", "local-llm"]
    assert ask(client).choices[0].message.content.startswith("[local-model] saw:"), "the gateway still serves"
