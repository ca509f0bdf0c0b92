"""The table of executor replicas that `limits.allocate` splits a provider's limits over.

Every replica publishes a small report (its partitions of the tasks topic, whether it has a
backlog, its calls in flight) to `baton.limits.<provider>`, a one-partition compacted topic keyed by
replica, every `INTERVAL_S` and at once when it becomes busy or its partitions change; it reads the
whole topic, keeps the newest report per replica, and re-applies its allocation to every worker's
limits after each report. With no table (the topic missing, the broker away for long, or not yet
read to its end), a replica keeps its share of the partitions, which is safe at any replica count.
Reports carry the sender's wall clock: replicas' clocks must agree to well within `TTL_S` (NTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from baton_executor.limits import TTL_S, Allocation, Member, WorkerLimits, allocate, partition_slots
from baton_platform import topics
from baton_platform.kafka import client_options

log = logging.getLogger(__name__)

INTERVAL_S = 0.25


class ShareExchange:
    def __init__(self, service, provider: str, limits: dict[str, WorkerLimits], backlog: Callable[[], int],
                 on_share: Callable[[float], None] = lambda s: None) -> None:
        self.service = service
        self.topic = topics.limits_topic(provider)
        self.limits = limits
        self.member = uuid.uuid4().hex
        self._reports = service.publisher(self.topic, None, "Each executor replica's load report, keyed by replica.")
        self._backlog = backlog
        self._on_share = on_share
        # The newest report of every other replica, trusted only once the topic has been read to
        # its end since this replica (re)started reading it: a half-read table looks like fewer
        # replicas, and would hand this one more than its share.
        self.table: dict[str, dict] = {}
        self.synced = False
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
        for lim in list(self.limits.values()):  # a worker may be added meanwhile (see add)
            await lim.set_share(share, partition_slots(lim.concurrency, total, partitions))
        self._on_share(share)
        self._wake.set()

    async def add(self, name: str, lim: WorkerLimits) -> None:
        """A worker added to the configuration while this replica runs: its limits start at this
        replica's share of the partitions, as every worker's do, until the next allocation."""
        total = self.total_partitions
        await lim.set_share(len(self.partitions) / total if total else 0.0,
                            partition_slots(lim.concurrency, total, self.partitions))
        self.limits[name] = lim
        self._wake.set()

    def report(self, now: float) -> dict:
        busy = self._backlog() > 0
        if busy and not self._busy_since:
            self._busy_since = now
            self._wake.set()
        elif not busy:
            self._busy_since = 0.0
        # Calls in flight per worker: each worker has its own concurrency limit.
        return {"member": self.member, "partitions": len(self.partitions), "busy": busy,
                "busy_since": self._busy_since, "in_flight": {k: v.slots.used for k, v in self.limits.items()},
                "at": now}

    async def apply(self, now: float, mine: dict) -> None:
        if not self.synced:
            return  # keep the base share until the whole table is known
        reports = [d for k, d in self.table.items() if k != self.member] + [mine]
        for name, lim in list(self.limits.items()):
            members = [Member(d["member"], d["partitions"], d["busy"], d["busy_since"], d["in_flight"].get(name, 0),
                              d["at"]) for d in reports]
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
            await self._reports.send(json.dumps({"member": self.member, "left": True}).encode(), key=self.member)

    async def _publish_loop(self) -> None:
        while True:
            now = time.time()
            mine = self.report(now)
            try:
                await self._reports.send(json.dumps(mine).encode(), key=self.member)
                await self.apply(now, mine)
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
                self.synced = False
                self.table.clear()
                await asyncio.sleep(1.0)

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                    **client_options(self.service.kafka))
        await consumer.start()
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            while True:
                batch = await consumer.getmany(tp, timeout_ms=500)
                for r in batch.get(tp, []):
                    self._take(r.value)
                if not self.synced and await consumer.position(tp) >= end:
                    self.synced = True
        finally:
            self.synced = False
            await consumer.stop()

    def _take(self, value: bytes | None, now: float | None = None) -> None:
        """Keep a report, or drop one no replica could have sent: the topic is written by every replica,
        and a forged report (a thousand partitions, calls in flight past the limit, a clock hours ahead
        so that it never goes stale) would otherwise take every replica's slots away, for good on a
        compacted topic."""
        try:
            d = json.loads(value or b"{}")
            if d.get("left"):
                self.table.pop(str(d["member"]), None)
                return
            report: dict[str, Any] = {"member": str(d["member"]), "partitions": int(d["partitions"]), "busy": bool(d["busy"]),
                      "busy_since": float(d["busy_since"]),
                      "in_flight": {str(k): int(v) for k, v in dict(d["in_flight"]).items()}, "at": float(d["at"])}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.debug("ignoring a malformed limits report")
            return
        problem = self._implausible(report, time.time() if now is None else now)
        if problem:
            log.warning("ignoring a limits report from %r: %s", report["member"][:64], problem)
            return
        self.table[report["member"]] = report

    def _implausible(self, r: dict, now: float) -> str | None:
        if len(r["member"]) > 64:
            return "member name too long"
        if r["at"] > now + TTL_S:
            return "sent from the future: a report must go stale when its replica stops"
        if not 0 <= r["busy_since"] <= r["at"]:
            return "busy since a time outside the report"
        if r["partitions"] < 0 or (self.total_partitions and r["partitions"] > self.total_partitions):
            return f"{r['partitions']} partitions of {self.total_partitions}"
        for name, calls in r["in_flight"].items():
            lim = self.limits.get(name)
            if calls < 0 or (lim is not None and calls > lim.concurrency):
                return f"{calls} calls in flight on {name}"
        return None
