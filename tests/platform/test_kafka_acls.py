"""Least privilege on a real secured broker: SASL_SSL with SCRAM users and mutual TLS, Kafka's
StandardAuthorizer, and the suite's ACL table (`baton_platform.acls`) applied by `admin`. The
internet-facing gateway's identity may send requests and read answers, and is refused what an attacker
holding its credentials would want: publishing a policy, queueing provider tasks, forging limit reports.
Every identity of the table is checked the same way for what it may and may not write."""

from __future__ import annotations

import asyncio
import os
import uuid
from unittest import mock

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
)
from testbed import default_config_data

from baton_platform import acls, admin, topics
from baton_tools.kafka import LocalKafka
from baton_tools.kafka_security import ADMIN, PASSWORD_ENV, BusSecurity, wait_until_granted


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A secured broker whose topics and ACLs `baton-topics --acls` created, connecting as `admin` the way
    a service's config connects (SASL_SSL, SCRAM, the password in an environment variable)."""
    folder = tmp_path_factory.mktemp("secured-kafka")
    data = default_config_data()
    providers = sorted({w["provider"] for w in data["workers"]})
    security = BusSecurity.create(folder / "pki", list(acls.table(providers)))
    with LocalKafka(data_dir=folder / "broker", security=security) as broker:
        env = security.client_env(ADMIN, broker.bootstrap_servers)
        data["kafka"] = {"bootstrap_servers": broker.bootstrap_servers, "partitions": 2,
                         "security_protocol": "SASL_SSL", "sasl_mechanism": env["BATON_KAFKA__SASL_MECHANISM"],
                         "sasl_username": ADMIN, "sasl_password_env": PASSWORD_ENV, "ssl_cafile": str(security.ca_file)}
        (folder / "baton.yaml").write_text(yaml.safe_dump(data))
        with mock.patch.dict(os.environ, {PASSWORD_ENV: env[PASSWORD_ENV]}):
            os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
            assert admin.main(["--config", str(folder / "baton.yaml"), "--acls"]) == 0
        asyncio.run(wait_until_granted(_options(broker, acls.identity("gateway"), False), topics.REQUESTS))
        broker.providers = providers
        yield broker


def _options(broker: LocalKafka, identity: str, mutual_tls: bool) -> dict:
    bootstrap = broker.tls_bootstrap_servers if mutual_tls else broker.bootstrap_servers
    return broker.security.client_options(identity, bootstrap, mutual_tls=mutual_tls)


async def _send(options: dict, topic: str) -> None:
    producer = AIOKafkaProducer(**options, acks="all", enable_idempotence=True, request_timeout_ms=10000)
    try:
        await producer.start()
        await asyncio.wait_for(producer.send_and_wait(topic, b"probe", key=b"k"), 20)
    finally:
        await producer.stop()


async def _refused(options: dict, topic: str) -> bool:
    try:
        await _send(options, topic)
    except TopicAuthorizationFailedError:
        return True
    except ClusterAuthorizationFailedError:  # an identity that may write nothing gets no producer id
        return True
    return False


@pytest.mark.parametrize("mutual_tls", [False, True], ids=["scram", "mtls"])
def test_gateway_identity_cannot_write_what_it_must_not(secured, mutual_tls):
    gateway = _options(secured, acls.identity("gateway"), mutual_tls)
    asyncio.run(_send(gateway, topics.REQUESTS))  # its own job works...
    for forbidden in (topics.POLICY, topics.tasks_topic("sim"), topics.limits_topic("sim"),
                      topics.RESPONSES, topics.WORKFLOW, topics.REWARDS):
        assert asyncio.run(_refused(gateway, forbidden)), f"the gateway could write {forbidden}"


def test_every_identity_writes_exactly_its_topics(secured):
    """Each identity can write each topic its row names and no other topic of the suite."""
    counts, _ = topics.topic_plan(2, secured.providers)
    for identity, access in acls.table(secured.providers).items():
        options = _options(secured, identity, mutual_tls=False)
        refused = {topic for topic in counts if asyncio.run(_refused(options, topic))}
        assert refused == set(counts) - set(access.write), identity


def test_an_unknown_user_is_refused_and_the_consumer_group_is_checked(secured):
    stranger = dict(_options(secured, acls.identity("gateway"), mutual_tls=False), sasl_plain_password="wrong")
    with pytest.raises(KafkaError):
        asyncio.run(_send(stranger, topics.REQUESTS))

    async def join(group: str) -> None:
        consumer = AIOKafkaConsumer(topics.RESPONSES, group_id=group, **_options(
            secured, acls.identity("gateway"), mutual_tls=False), consumer_timeout_ms=1000)
        try:
            await consumer.start()
            await asyncio.wait_for(consumer.getmany(timeout_ms=2000), 30)
        finally:
            await consumer.stop()

    asyncio.run(join(topics.GROUP_GATEWAY))  # its own group...
    with pytest.raises(GroupAuthorizationFailedError):  # ...but not the router's
        asyncio.run(join(topics.GROUP_ROUTER + "-" + uuid.uuid4().hex[:6]))
