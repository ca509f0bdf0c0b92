"""The one way services build their Kafka broker, security settings included (trace context travels in
headers that baton_platform.consumer writes and reads)."""

from __future__ import annotations

import logging
import os
import ssl

from faststream.kafka import KafkaBroker
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

from baton_platform.config import KafkaConfig


def servers(bootstrap: str) -> list[str]:
    """`host:port,host:port` as the list Kafka clients take: aiokafka reads a string as one address,
    so a cluster's comma-separated bootstrap list would not connect."""
    return [s.strip() for s in bootstrap.split(",") if s.strip()]


def _ssl_context(cfg: KafkaConfig) -> ssl.SSLContext | None:
    """TLS to the brokers (SSL, SASL_SSL): their CA, and this service's client certificate when set
    (mutual TLS, where the certificate's name is the service's Kafka principal)."""
    if cfg.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=str(cfg.ssl_cafile) if cfg.ssl_cafile else None)
    if cfg.ssl_certfile:
        context.load_cert_chain(str(cfg.ssl_certfile), str(cfg.ssl_keyfile) if cfg.ssl_keyfile else None)
    return context


def _sasl_credentials(cfg: KafkaConfig) -> tuple[str, str]:
    password = os.environ.get(cfg.sasl_password_env or "", "")
    if not (cfg.sasl_username and password):
        raise ValueError(
            "kafka: SASL needs sasl_username and a password in the variable named by sasl_password_env"
        )
    return cfg.sasl_username, password


def _security(cfg: KafkaConfig) -> BaseSecurity | None:
    if cfg.security_protocol == "PLAINTEXT":
        return None
    context = _ssl_context(cfg)
    if cfg.security_protocol == "SSL":
        return BaseSecurity(ssl_context=context, use_ssl=True)
    username, password = _sasl_credentials(cfg)
    kind = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}[
        cfg.sasl_mechanism or "PLAIN"
    ]
    return kind(username=username, password=password, ssl_context=context,
                use_ssl=cfg.security_protocol == "SASL_SSL")


# The largest record a producer sends (the producer's max_request_size, the broker's default
# message.max.bytes). A record over it can never be sent: `Publisher.send` refuses it before the producer
# does, and the gateway refuses a request whose workflow records would not fit (a task carries the
# conversation again, with the plan and earlier outputs).
MAX_RECORD_BYTES = 1_048_576
# Room in a record for what goes with its value: key, headers and the record's own framing.
RECORD_OVERHEAD_BYTES = 8_192


def make_broker(cfg: KafkaConfig, *, client_id: str) -> KafkaBroker:
    return KafkaBroker(
        servers(cfg.bootstrap_servers),
        client_id=client_id,
        security=_security(cfg),
        linger_ms=cfg.linger_ms,
        max_request_size=MAX_RECORD_BYTES,
        # Idempotent producer: a retried send never writes a record twice.
        enable_idempotence=True,
        acks="all",
        allow_auto_create_topics=False,
        # Handlers take the raw body and decode it themselves (baton_platform.consumer): no dependency
        # injection or pydantic casting per record.
        apply_types=False,
        # Per-message processing logs go to DEBUG; warnings and errors still surface, through the
        # service's own log handler (FastStream's default logger writes coloured text to stdout).
        logger=logging.getLogger("faststream.kafka"),
        log_level=logging.DEBUG,
    )


def consumer_options(cfg: KafkaConfig) -> dict:
    """Subscriber settings every service shares."""
    return {
        "session_timeout_ms": cfg.session_timeout_ms,
        "heartbeat_interval_ms": cfg.heartbeat_interval_ms,
        "auto_offset_reset": "earliest",
    }


def client_options(cfg: KafkaConfig) -> dict:
    """Connection settings for plain aiokafka clients (admin, probes), matching make_broker's."""
    options: dict = {"bootstrap_servers": servers(cfg.bootstrap_servers), "security_protocol": cfg.security_protocol}
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _ssl_context(cfg)
    if cfg.security_protocol.startswith("SASL"):
        username, password = _sasl_credentials(cfg)
        options.update(sasl_mechanism=cfg.sasl_mechanism or "PLAIN", sasl_plain_username=username,
                       sasl_plain_password=password)
    return options


async def partition_ids(options: dict, topic: str) -> list[int]:
    """The partitions of `topic`, asked of the cluster (a plain consumer only knows topics it reads)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        (desc,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if desc.get("error_code"):
        raise ValueError(f"topic {topic} cannot be described (error code {desc['error_code']})")
    return sorted(p["partition"] for p in desc["partitions"])


async def seek_to_time(probe, parts: list, since_ms: int) -> dict:
    """Assign `parts` to the started, group-less consumer `probe` and position each at its first
    record published since `since_ms` (by record timestamp), or at its end when there is none.
    Returns the end offsets, looked up first: a record published after that lookup is at or past
    them, and one published before it is found by the time lookup that follows."""
    probe.assign(parts)
    ends = await probe.end_offsets(parts)
    starts = await probe.offsets_for_times({tp: max(since_ms, 0) for tp in parts})
    for tp in parts:
        found = starts.get(tp)
        probe.seek(tp, found.offset if found is not None else ends[tp])
    return ends


async def read_since(probe, parts: list, since_ms: int):
    """Every record of `parts` published since `since_ms` (by record timestamp), up to the end
    offsets each partition had when the read began, as an async iterator. `probe` is a started,
    group-less consumer; the caller bounds the whole read with a timeout.

    Used after a crash or rebalance to learn what was already published, so work is not done twice.
    """
    ends = await seek_to_time(probe, parts, since_ms)
    remaining = {tp for tp in parts if await probe.position(tp) < ends[tp]}
    while remaining:
        batch = await probe.getmany(*remaining, timeout_ms=1000)
        for records in batch.values():
            for record in records:
                yield record
        for tp in list(remaining):
            if await probe.position(tp) >= ends[tp]:
                remaining.discard(tp)


def _metadata_v10():
    """Kafka's Metadata request and response at version 10, the first to carry topic ids (KIP-516),
    which aiokafka's own Metadata request (up to version 5) does not ask for."""
    from io import BytesIO

    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import (
        AbstractType,
        Boolean,
        CompactArray,
        CompactString,
        Int16,
        Int32,
        Schema,
        TaggedFields,
    )

    class Uuid(AbstractType[bytes]):
        @classmethod
        def encode(cls, value: bytes) -> bytes:
            return value

        @classmethod
        def decode(cls, data: BytesIO) -> bytes:
            return data.read(16)

    class MetadataResponse_v10(Response):
        API_KEY = 3
        API_VERSION = 10
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("brokers", CompactArray(("node_id", Int32), ("host", CompactString("utf-8")), ("port", Int32),
                                     ("rack", CompactString("utf-8")), ("tags", TaggedFields))),
            ("cluster_id", CompactString("utf-8")),
            ("controller_id", Int32),
            ("topics", CompactArray(
                ("error_code", Int16), ("name", CompactString("utf-8")), ("topic_id", Uuid), ("is_internal", Boolean),
                ("partitions", CompactArray(
                    ("error_code", Int16), ("partition_index", Int32), ("leader_id", Int32), ("leader_epoch", Int32),
                    ("replica_nodes", CompactArray(Int32)), ("isr_nodes", CompactArray(Int32)),
                    ("offline_replicas", CompactArray(Int32)), ("tags", TaggedFields))),
                ("topic_authorized_operations", Int32), ("tags", TaggedFields))),
            ("cluster_authorized_operations", Int32),
            ("tags", TaggedFields),
        )

    class MetadataRequest_v10(RequestStruct):
        FLEXIBLE_VERSION = True
        API_KEY = 3
        API_VERSION = 10
        RESPONSE_TYPE = MetadataResponse_v10
        SCHEMA = Schema(
            ("topics", CompactArray(("topic_id", Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields))),
            ("allow_auto_topic_creation", Boolean),
            ("include_cluster_authorized_operations", Boolean),
            ("include_topic_authorized_operations", Boolean),
            ("tags", TaggedFields),
        )

    class TopicIdsRequest(Request[MetadataRequest_v10]):
        API_KEY = 3

        def __init__(self, topic: str) -> None:
            self.topic = topic

        def build(self, request_struct_class: type[MetadataRequest_v10]) -> MetadataRequest_v10:
            return request_struct_class([(bytes(16), self.topic, {})], False, False, False, {})

    return TopicIdsRequest


async def topic_incarnation(options: dict, topic: str) -> str:
    """Which incarnation of `topic` this is: its cluster's id and the topic's id, as `cluster/topic`.
    A topic deleted and created again, or the same name on another cluster, counts its offsets from 0
    again, so files named by offsets alone would collide with the earlier incarnation's. A broker
    older than topic ids (Kafka 2.8) gives the cluster id alone."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        try:
            response = await admin._send_request(_metadata_v10()(topic))
        except NotImplementedError:  # no Metadata v10 on this broker
            return (await admin.describe_cluster())["cluster_id"]
    finally:
        await admin.close()
    (found,) = [t for t in response.topics if t[1] == topic]
    if found[0]:
        raise ValueError(f"topic {topic} cannot be described (error code {found[0]})")
    return f"{response.cluster_id}/{found[2].hex()}"
