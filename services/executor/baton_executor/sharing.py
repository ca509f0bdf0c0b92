"""The table of executor replicas that `limits.allocate` splits a provider's limits over.

Every replica publishes a small report (its partitions of the tasks topic, whether it has a
backlog, its calls in flight) to `baton.limits.<provider>`, a one-partition compacted topic keyed by
replica, every `INTERVAL_S` and at once when it becomes busy or its partitions change; it reads the
whole topic, keeps the newest report per replica, and re-applies its allocation to every worker's
limits after each report. With no table (the topic missing, the broker away for long), a replica
keeps its share of the partitions, which is safe at any replica count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from baton_platform import topics
from baton_platform.kafka import client_options

from baton_executor.limits import Allocation, Member, WorkerLimits, allocate, partition_slots

log = logging.getLogger(__name__)

INTERVAL_S = 0.25


class ShareExchange:
    def __init__(self, service, provider: str, limits: dict[str, WorkerLimits], backlog: Callable[[], int],
                 in_flight: Callable[[], int], on_share: Callable[[float], None] = lambda s: None) -> None:
        self.service = service
        self.topic = topics.limits_topic(provider)
        self.limits = limits
        self.member = uuid.uuid4().hex
        self._backlog = backlog
        self._in_flight = in_flight
        self._on_share = on_share
        self.table: dict[str, Member] = {}
        self.partitions: set[int] = set()
        self.total_partitions = 0
        self._busy_since = 0.0
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None

    # -- this replica ----------------------------------------------------------------------------

    async def assigned(self, partitions: set[int], total: int) -> None:
        """The consumer group gave this replica `partitions` of `total`: apply the base share now
        (safe whatever the others do), then let the next report and table refine it."""
        self.partitions, self.total_partitions = set(partitions), total
        share = len(partitions) / total if total else 0.0
        for lim in self.limits.values():
            await lim.set_share(share, partition_slots(lim.concurrency, total, partitions))
        self._on_share(share)
        self._wake.set()

    def report(self, now: float) -> Member:
        busy = self._backlog() > 0
        if busy and not self._busy_since:
            self._busy_since = now
            self._wake.set()
        elif not busy:
            self._busy_since = 0.0
        return Member(self.member, len(self.partitions), busy, self._busy_since, self._in_flight(), now)

    async def apply(self, now: float) -> None:
        members = [m for k, m in self.table.items() if k != self.member] + [self.report(now)]
        for lim in self.limits.values():
            a: Allocation | None = allocate(self.member, members, lim.concurrency, now)
            if a is None:
                continue  # this replica owns no partitions, or the table is not read yet: keep the base share
            await lim.set_share(a.share, a.slots)
            self._on_share(a.share)

    # -- the topic -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._publish_loop()), asyncio.create_task(self._read_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            # Leaving: the others take this replica's share at once instead of after TTL_S.
            await self.service.broker.publish(json.dumps({"member": self.member, "left": True}).encode(),
                                              self.topic, key=self.member.encode())

    async def _publish_loop(self) -> None:
        while True:
            now = time.time()
            m = self.report(now)
            body = {"member": m.member, "partitions": m.partitions, "busy": m.busy, "busy_since": m.busy_since,
                    "in_flight": m.in_flight, "at": m.at}
            try:
                await self.service.broker.publish(json.dumps(body).encode(), self.topic, key=self.member.encode())
                await self.apply(now)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the base share stays in force; try again next tick
                log.debug("limits report not published: %s", e)
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), INTERVAL_S)

    async def _read_loop(self) -> None:
        while True:
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a broker restart: read the table again
                log.warning("limits table unreadable (%s); retrying", e)
                self.table.clear()
                await asyncio.sleep(1.0)

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                    **client_options(self.service.config.kafka))
        await consumer.start()
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            while True:
                batch = await consumer.getmany(tp, timeout_ms=500)
                for r in batch.get(tp, []):
                    self._take(r.value)
        finally:
            await consumer.stop()

    def _take(self, value: bytes | None) -> None:
        try:
            d = json.loads(value or b"{}")
            if d.get("left"):
                self.table.pop(d["member"], None)
                return
            self.table[d["member"]] = Member(d["member"], int(d["partitions"]), bool(d["busy"]),
                                             float(d["busy_since"]), int(d["in_flight"]), float(d["at"]))
        except (ValueError, KeyError, TypeError):
            log.debug("ignoring a malformed limits report")
