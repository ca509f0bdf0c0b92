"""The Batch API end to end with the official `openai` client: every service its own process on a
real Kafka broker, both plan steps on an OpenAI-compatible stand-in that counts the provider calls.
A batch runs to completed with its output and error files; a cancel stops it; a gateway killed
mid-batch loses no line and runs none twice; a 1,000-line batch completes while interactive
requests run beside it (their latency with and without it is printed, not asserted)."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from testbed import two_step_standin_stack, wait_for_episodes

from baton_tools.standins.server import configure_standin, reset_standin, standin_stats

TERMINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    with two_step_standin_stack(kafka_bootstrap, tmp_path_factory.mktemp("batches"), ("Draft.", "Answer.")) as st:
        yield st


@pytest.fixture
def client(stack):
    reset_standin(stack.standin_url)
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)


def jsonl(n: int, prefix: str, model: str = "baton") -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"Question {prefix} {i}?"}]}}).encode() + b"\n"
        for i in range(n))


def submit(client, content: bytes):
    upload = client.files.create(file=("requests.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                 metadata={"job": "test"})


def wait_until(client, batch_id: str, done, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} is {batch.status} with {batch.request_counts}"
        time.sleep(0.3)


def lines_of(client, file_id: str | None) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()] if file_id else []


def provider_calls(stack) -> int:
    return standin_stats(stack.standin_url)["served"]


def test_a_batch_runs_to_completed_with_its_output_and_error_files(stack, client):
    batch = submit(client, jsonl(5, "ok") + jsonl(1, "bad", model="no-such-model"))
    assert (batch.status, batch.request_counts.total, batch.metadata) == ("validating", 6, {"job": "test"})
    batch = wait_until(client, batch.id, lambda b: b.status in TERMINAL)
    assert batch.status == "completed" and batch.completed_at and batch.in_progress_at
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)
    out = lines_of(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in out) == [f"ok-{i}" for i in range(5)]
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"][0]["message"]["content"]
               for o in out)
    assert len({o["response"]["request_id"] for o in out}) == 5
    (err,) = lines_of(client, batch.error_file_id)
    assert (err["custom_id"], err["response"]["status_code"]) == ("bad-0", 404)
    assert err["response"]["body"]["error"]["code"] == "model_not_found"
    assert provider_calls(stack) == 10, "two steps for each answered line, none for the refused one"
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]


def test_a_batch_of_responses_answers_each_line_as_the_responses_api_does(stack, client):
    content = b"".join(json.dumps({
        "custom_id": f"r-{i}", "method": "POST", "url": "/v1/responses",
        "body": {"model": "baton", "input": f"Question r {i}?", "instructions": "Be brief."}}).encode() + b"\n"
        for i in range(3))
    upload = client.files.create(file=("responses.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h")
    batch = wait_until(client, batch.id, lambda b: b.status in TERMINAL)
    assert (batch.status, batch.request_counts.completed) == ("completed", 3)
    for line in lines_of(client, batch.output_file_id):
        body = line["response"]["body"]
        assert body["object"] == "response" and body["status"] == "completed"
        assert body["output"][0]["content"][0]["text"]
        assert client.responses.retrieve(body["id"]).id == body["id"], "stored, as store defaults to true"


def test_a_bad_input_file_is_refused_naming_its_line(client):
    with pytest.raises(openai.BadRequestError) as err:
        submit(client, jsonl(2, "x") + b'{"custom_id": "x-0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n')
    assert "line 3 of the input file repeats custom_id 'x-0'" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nothere", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 24)


def test_a_cancelled_batch_stops_and_keeps_what_it_answered(stack, client):
    configure_standin(stack.standin_url, latency_ms=200)
    batch = submit(client, jsonl(200, "c"))
    wait_until(client, batch.id, lambda b: b.request_counts.completed >= 8)
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = wait_until(client, batch.id, lambda b: b.status in TERMINAL)
    assert batch.status == "cancelled" and batch.cancelling_at and batch.cancelled_at
    out = lines_of(client, batch.output_file_id)
    assert 8 <= len(out) == batch.request_counts.completed < 200
    assert provider_calls(stack) == 2 * len(out), "no line runs after the cancel, or half"


def test_a_gateway_killed_mid_batch_loses_no_line_and_runs_none_twice(stack, client):
    configure_standin(stack.standin_url, latency_ms=100)
    batch = submit(client, jsonl(60, "k"))
    wait_until(client, batch.id, lambda b: b.request_counts.completed >= 10)
    stack.kill("gateway")
    stack.restart("gateway")
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=2, timeout=60)
    batch = wait_until(client, batch.id, lambda b: b.status in TERMINAL)
    assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 60, 0)
    out = lines_of(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"k-{i}" for i in range(60)), "each line once"
    assert provider_calls(stack) == 120, "every line's workflow ran once: two provider calls each"


def interactive(client, n: int) -> list[float]:
    """Latencies (s) of `n` chat requests, four at a time."""
    def one(i):
        started = time.perf_counter()
        client.chat.completions.create(model="baton", messages=[{"role": "user", "content": f"Now {i}?"}])
        return time.perf_counter() - started

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(n)))


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def test_a_1000_line_batch_completes_beside_interactive_traffic(stack, client):
    configure_standin(stack.standin_url, latency_ms=20)
    alone = interactive(client, 100)
    batch = submit(client, jsonl(1000, "big"))
    wait_until(client, batch.id, lambda b: b.status == "in_progress" and b.request_counts.completed >= 20)
    beside = interactive(client, 100)
    running = client.batches.retrieve(batch.id).status
    batch = wait_until(client, batch.id, lambda b: b.status in TERMINAL, timeout=300)
    assert (batch.status, batch.request_counts.completed) == ("completed", 1000)
    assert running == "in_progress", "the interactive requests ran while the batch did"
    # Each line is an episode like any other; waiting for them also leaves the session's shared broker
    # with no backlog for the next suite's reward logger.
    ids = {line["response"]["request_id"] for line in lines_of(client, batch.output_file_id)}
    assert len(ids) == 1000
    logged = wait_for_episodes(stack.dataset_dir, ids, timeout=300, columns=["request_id", "tenant"])
    assert len(logged) == 1000 and {r["tenant"] for r in logged} == {"anonymous"}
    print(f"\ninteractive p50/p99 alone {p(alone, 50):.0f}/{p(alone, 99):.0f} ms, beside the batch "
          f"{p(beside, 50):.0f}/{p(beside, 99):.0f} ms; batch of 1000 lines in "
          f"{batch.completed_at - batch.created_at} s")
