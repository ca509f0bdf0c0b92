"""Idempotency-Key end to end: every service its own process on a real Kafka broker, both plan steps
on an OpenAI-compatible stand-in that counts the provider calls. A repeat with the same key gets the
first request's answer and starts no workflow: after the first finished, while it runs, from many
clients at once, and after the gateway that took the first was killed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import httpx
import openai
import pytest
from aiokafka import AIOKafkaProducer
from testbed import two_step_standin_stack, wait_for

from baton_gateway.auth import ANONYMOUS
from baton_gateway.idempotency import Claim
from baton_platform import topics
from baton_tools.standins.server import configure_standin, reset_standin, standin_requests

QUESTION = [{"role": "user", "content": "Tell me about Paris."}]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    with two_step_standin_stack(kafka_bootstrap, tmp_path_factory.mktemp("idempotency"), ("Draft.", "Answer.")) as st:
        yield st


@pytest.fixture
def client(stack):
    reset_standin(stack.standin_url)
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)


def provider_calls(stack) -> int:
    return len(standin_requests(stack.standin_url))


def test_a_repeat_gets_the_first_answer_and_a_different_body_a_409(stack, client):
    headers = {"Idempotency-Key": "order-1"}
    first = client.chat.completions.with_raw_response.create(model="baton", messages=QUESTION, extra_headers=headers)
    assert provider_calls(stack) == 2
    again = client.chat.completions.with_raw_response.create(model="baton", messages=QUESTION, extra_headers=headers)
    assert again.headers["x-baton-request-id"] == first.headers["x-baton-request-id"]
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert provider_calls(stack) == 2, "the repeat ran no workflow"

    with pytest.raises(openai.ConflictError) as err:
        client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "Other."}],
                                       extra_headers=headers)
    assert err.value.code == "idempotency_key_reused"
    other = client.chat.completions.with_raw_response.create(model="baton", messages=QUESTION,
                                                             extra_headers={"Idempotency-Key": "order-2"})
    assert other.headers["x-baton-request-id"] != first.headers["x-baton-request-id"]
    assert provider_calls(stack) == 4


def test_clients_racing_with_one_key_run_one_workflow_streamed_or_not(stack, client):
    configure_standin(stack.standin_url, latency_ms=500)
    headers = {"Idempotency-Key": "race-1"}

    def ask(_):
        r = client.chat.completions.with_raw_response.create(model="baton", messages=QUESTION, extra_headers=headers)
        return r.headers["x-baton-request-id"], r.parse().choices[0].message.content

    with ThreadPoolExecutor(6) as pool:
        answers = set(pool.map(ask, range(6)))
    assert len(answers) == 1, answers
    assert provider_calls(stack) == 2

    stream_headers = {"Idempotency-Key": "race-2"}

    def streamed(_):
        chunks = client.chat.completions.create(model="baton", messages=QUESTION, stream=True,
                                                extra_headers=stream_headers)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with ThreadPoolExecutor(3) as pool:
        texts = set(pool.map(streamed, range(3)))
    assert len(texts) == 1 and texts.pop(), "every client streamed the one answer"
    assert provider_calls(stack) == 4


def test_a_retry_after_the_gateway_died_mid_request_joins_the_workflow(stack, client):
    configure_standin(stack.standin_url, latency_ms=3000)
    headers = {"Idempotency-Key": "crash-1"}
    outcome: dict = {}

    def first():
        try:
            client.chat.completions.create(model="baton", messages=QUESTION, extra_headers=headers)
        except openai.APIConnectionError as e:
            outcome["error"] = e

    t = threading.Thread(target=first)
    t.start()
    assert wait_for(lambda: provider_calls(stack) >= 1, 20, 0.1), "the first request reached a provider"
    stack.kill("gateway")
    t.join(30)
    assert "error" in outcome, "the client saw its connection drop"
    stack.restart("gateway")
    retry = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60,
                          http_client=httpx.Client(trust_env=False))
    r = retry.chat.completions.create(model="baton", messages=QUESTION, extra_headers=headers)
    assert r.choices[0].message.content
    assert provider_calls(stack) == 2, "the retry ran no second workflow"


def test_a_key_whose_request_was_never_queued_is_run_once_by_its_repeat(stack, kafka_bootstrap):
    """A gateway that died between claiming a key and queueing its request left only the claim."""
    body = json.dumps({"model": "baton", "messages": QUESTION}).encode()
    claim = Claim("never-queued-1", hashlib.sha256(b"/v1/chat/completions\0" + body).hexdigest(), 0,
                  int(time.time() * 1000) - 5000, int(time.time() * 1000) + 60_000)
    slot = hashlib.sha256(f"{ANONYMOUS}\0orphan-1".encode()).hexdigest()

    async def write_claim():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topics.IDEMPOTENCY, json.dumps(asdict(claim)).encode(), key=slot.encode())
        finally:
            await producer.stop()

    reset_standin(stack.standin_url)
    asyncio.run(write_claim())
    r = httpx.post(stack.base_url + "/chat/completions", content=body, timeout=60,
                   headers={"content-type": "application/json", "Idempotency-Key": "orphan-1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-baton-request-id"] == "never-queued-1" and r.json()["choices"][0]["message"]["content"]
    again = httpx.post(stack.base_url + "/chat/completions", content=body, timeout=60,
                       headers={"content-type": "application/json", "Idempotency-Key": "orphan-1"})
    assert again.headers["x-baton-request-id"] == "never-queued-1"
    assert provider_calls(stack) == 2, "one workflow for the claim and both its repeats"


def test_the_responses_api_honours_keys_too(stack, client):
    headers = {"Idempotency-Key": "resp-1"}
    first = client.responses.create(model="baton", input="Tell me about Paris.", extra_headers=headers)
    again = client.responses.create(model="baton", input="Tell me about Paris.", extra_headers=headers)
    assert (again.id, again.output_text) == (first.id, first.output_text)
    assert provider_calls(stack) == 2
