"""The whole suite on a secured bus, as a platform team runs it: a broker with SASL_SSL (SCRAM-SHA-512),
Kafka's StandardAuthorizer and the suite's ACL table, every service its own process connecting as its
own identity (`make up SECURE=1` starts the same). That every request is answered, streamed or not, and
graded into an episode shows the table grants each service what it needs; the ACL tests of
tests/platform show it grants nothing more."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import openai
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from testbed import default_config_data, first_question, running_stack, wait_for_episodes

from baton_platform import acls, topics


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data = default_config_data()
    data["conductor"]["plan"] = {"workers": ["gemini-flash", "gemini-pro"],
                                 "subtasks": ["Solve it.", "Check the draft and answer."], "access": [[], [0]]}
    data["kafka"] = {"partitions": 2, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    with running_stack(data, tmp_path_factory.mktemp("secured"), None, secure=True) as st:
        yield st


def test_every_service_connects_as_itself_and_a_request_is_answered(stack):
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    row = first_question()
    raw = client.chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": row["prompt"]}])
    assert raw.parse().choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="baton", stream=True, messages=[{"role": "user", "content": row["prompt"] + " "}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    request_id = raw.headers["x-baton-request-id"]
    assert wait_for_episodes(stack.dataset_dir, {request_id}, timeout=60), "no episode logged"
    users = {}
    for svc in stack.services:
        env = stack._env(svc)
        users[svc.name] = env["BATON_KAFKA__SASL_USERNAME"]
        assert env["BATON_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
        log = Path(svc.log).read_text()
        assert not re.search(r"AuthorizationFailed|not authorized|SaslAuthenticationFailed", log), svc.name
    assert users["gateway"] == acls.identity("gateway")
    assert users["executor-sim-0"] == acls.identity("executor-sim")
    assert len(set(users.values())) == len(users)


def test_the_gateways_credentials_cannot_steer_the_running_suite(stack):
    """What a compromised gateway pod holds, used against the running secured suite: a forged policy
    version, a forged limits report and a task for a provider are each refused by the broker, and the
    suite answers on; a conversation too large for its workflow's records is refused with 413 before
    anything is queued."""
    gateway = stack.kafka.security.client_options(acls.identity("gateway"), stack.bootstrap_servers)

    async def refused(topic: str) -> bool:
        producer = AIOKafkaProducer(**gateway, acks="all", enable_idempotence=True, request_timeout_ms=10000)
        try:
            await producer.start()
            await asyncio.wait_for(producer.send_and_wait(topic, b'{"member":"ghost","partitions":100000}'), 20)
        except TopicAuthorizationFailedError:
            return True
        finally:
            await producer.stop()
        return False

    for topic in (topics.POLICY, topics.limits_topic("sim"), topics.tasks_topic("sim")):
        assert asyncio.run(refused(topic)), f"the gateway's user could write {topic}"
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "x " * 180_000}])
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
    answer = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": first_question()["prompt"]}])
    assert answer.choices[0].message.content, "the suite answers on"
