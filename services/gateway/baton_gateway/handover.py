"""Replies for requests that were waiting when the gateway group rebalanced, read without the group.

A partition given to another replica: its new owner drops these replies (it waits on none of them).
A partition that stayed: the group consumer may restart from its end, past a reply sent during the
rebalance. So this replica reads those partitions itself, from shortly before the oldest of the
requests was asked, until none of them waits or the request timeout has passed. Replies read twice
are dropped by `Replies.deliver`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from baton.v1 import responses_pb2
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.kafka import client_options, seek_to_time
from baton_platform.messages import PoisonMessage, decode

log = logging.getLogger(__name__)

# Replies carry the producing service's clock: start this much before the oldest request was asked.
CLOCK_SKEW_MS = 30_000


class Handover:
    def __init__(self, kafka: KafkaConfig, is_waiting: Callable[[str], bool],
                 handle: Callable[[responses_pb2.Response], Awaitable[None]], limit_s: float) -> None:
        self._kafka, self._is_waiting, self._handle, self._limit_s = kafka, is_waiting, handle, limit_s
        self._tasks: set[asyncio.Task] = set()

    def start(self, waiting: dict[str, tuple[int, int]]) -> None:
        """Read the replies of `waiting` (request id: reply partition, asked at unix ms)."""
        partitions = sorted({p for p, _ in waiting.values()})
        log.info("reading baton.responses partitions %s again for %d waiting request(s)", partitions, len(waiting))
        task = asyncio.create_task(self._read(partitions, set(waiting), min(at for _, at in waiting.values())))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self, partitions: list[int], ids: set[str], since_ms: int) -> None:
        deadline = time.monotonic() + self._limit_s
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **client_options(self._kafka))
        try:
            await consumer.start()
            parts = [TopicPartition(topics.RESPONSES, p) for p in partitions]
            await seek_to_time(consumer, parts, since_ms - CLOCK_SKEW_MS)
            while any(self._is_waiting(r) for r in ids) and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        try:
                            response = decode(responses_pb2.Response, record.value or b"")
                        except PoisonMessage:
                            continue  # the partition's owner dead-letters it
                        await self._handle(response)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading baton.responses partitions %s again failed", partitions)
        finally:
            await consumer.stop()
