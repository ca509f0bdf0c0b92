"""Replies for requests this replica still waits on, read from partitions a rebalance gave to another.

The group's new owner of such a partition drops those replies (it waits on none of them), so this
replica reads the partitions itself, without the group, from shortly before its oldest request there
was asked, until no request waits on them or the request timeout has passed. Replies read twice (by
the group consumer before the rebalance and here) are dropped by `Replies.deliver`.
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
from baton_platform.kafka import client_options
from baton_platform.messages import PoisonMessage, decode

log = logging.getLogger(__name__)

# Replies carry the producing service's clock: start this much before the oldest request was asked.
CLOCK_SKEW_MS = 30_000


class Handover:
    def __init__(self, kafka: KafkaConfig, oldest_on: Callable[[set[int]], int | None],
                 handle: Callable[[responses_pb2.Response], Awaitable[None]], limit_s: float) -> None:
        self._kafka, self._oldest_on, self._handle, self._limit_s = kafka, oldest_on, handle, limit_s
        self._tasks: set[asyncio.Task] = set()

    def start(self, partitions: set[int]) -> None:
        log.info("reading replies on baton.responses partitions %s, now another replica's", sorted(partitions))
        task = asyncio.create_task(self._read(partitions))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self, partitions: set[int]) -> None:
        deadline = time.monotonic() + self._limit_s
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **client_options(self._kafka))
        try:
            await consumer.start()
            parts = [TopicPartition(topics.RESPONSES, p) for p in sorted(partitions)]
            consumer.assign(parts)
            oldest = self._oldest_on(partitions)
            if oldest is None:
                return
            starts = await consumer.offsets_for_times({tp: max(oldest - CLOCK_SKEW_MS, 0) for tp in parts})
            for tp in parts:
                if starts.get(tp) is None:
                    await consumer.seek_to_end(tp)  # nothing since: the replies are yet to come
                else:
                    consumer.seek(tp, starts[tp].offset)
            while self._oldest_on(partitions) is not None and time.monotonic() < deadline:
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
            log.exception("reading handed-over reply partitions %s failed", sorted(partitions))
        finally:
            await consumer.stop()
