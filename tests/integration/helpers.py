"""Small aiokafka helpers for driving one service's handlers on the real broker."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry.sdk.trace import TracerProvider

from baton_tools.kafka import acreate_topics
from baton_platform import topics
from baton_platform.kafka import partition_ids
from baton_platform.config import load_config


async def ensure_topics(bootstrap: str, partitions: int = 4) -> None:
    counts, configs = topics.topic_plan(partitions, ["sim"])
    await acreate_topics(bootstrap, counts, config=configs)


def config_for(write_config, bootstrap: str, **sections):
    path = write_config({"kafka": {"bootstrap_servers": bootstrap, "partitions": 4, "session_timeout_ms": 6000,
                                   "heartbeat_interval_ms": 1000}, **sections})
    return load_config(path)


class Tap:
    """Reads a topic from its current end, keeping what arrives."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.bootstrap = bootstrap
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="latest")
        self.records = []

    async def __aenter__(self) -> "Tap":
        await self.consumer.start()
        from aiokafka import TopicPartition

        parts = await partition_ids({"bootstrap_servers": self.bootstrap}, self.topic)
        tps = [TopicPartition(self.topic, p) for p in parts]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, so nothing published after this is missed
            await self.consumer.position(tp)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.consumer.stop()

    async def wait(self, predicate, count: int = 1, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matched = [r for r in self.records if predicate(r)]
            if len(matched) >= count:
                return matched
            batch = await self.consumer.getmany(timeout_ms=300)
            for recs in batch.values():
                self.records.extend(recs)
        return [r for r in self.records if predicate(r)]


async def publish(bootstrap: str, topic: str, key: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


def tracer() -> TracerProvider:
    return TracerProvider()


async def settle(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)
