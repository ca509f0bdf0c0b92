"""A topic every gateway replica reads whole, from its beginning, into a table of its own: stored
responses (baton_gateway.stored) and idempotency keys (baton_gateway.idempotency). Any replica can
then answer for what another wrote, including what was written before the replica started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from baton_platform.config import KafkaConfig
from baton_platform.kafka import client_options, partition_ids

log = logging.getLogger(__name__)

CATCH_UP_S = 5.0  # how long a lookup waits for this replica to read what other replicas wrote


class TopicTable:
    def __init__(self, kafka: KafkaConfig, topic: str, take: Callable[[str, bytes | None], None]) -> None:
        self._kafka, self.topic, self._take = kafka, topic, take
        self._positions: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._read_loop(), name=f"table {self.topic}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def catch_up(self, timeout_s: float = CATCH_UP_S) -> bool:
        """Wait (bounded) until this replica has read every record written before now; False when
        it could not (the reader is starting, or the broker is away)."""
        deadline = time.monotonic() + timeout_s
        while self._consumer is None:  # the reader is starting, or reconnecting after a broker restart
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        try:
            ends = await self._consumer.end_offsets(list(self._positions))
        except Exception:  # noqa: BLE001 - the reader restarts; the caller goes on with what it has
            return False
        while any(self._positions.get(tp, 0) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def _read_loop(self) -> None:
        while True:
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a broker restart: read on from where this replica was
                log.warning("%s unreadable (%s); retrying", self.topic, e)
                await asyncio.sleep(1.0)

    async def _read(self) -> None:
        options = client_options(self._kafka)
        parts = [TopicPartition(self.topic, p) for p in await partition_ids(options, self.topic)]
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **options)
        await consumer.start()
        try:
            consumer.assign(parts)
            for tp in parts:
                if tp in self._positions:
                    consumer.seek(tp, self._positions[tp])
                else:
                    await consumer.seek_to_beginning(tp)
                    self._positions[tp] = await consumer.position(tp)
            self._consumer = consumer
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for r in records:
                        self._take(r.key.decode("utf-8", "replace") if r.key else "", r.value)
                for tp in parts:  # an empty fetch moves a partition on too (past compacted gaps)
                    self._positions[tp] = await consumer.position(tp)
        finally:
            self._consumer = None
            await consumer.stop()
