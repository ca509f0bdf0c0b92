"""Tenant spend that outlives any gateway replica: a ledger on the compacted topic baton.spend.

The replica that owns a partition of baton.responses counts the cost of the final responses it reads
there, per tenant, together with the offset it has counted through. It publishes each total that
changed (key `<tenant>/<partition>`, a small JSON record) every `FLUSH_S`, and at once when it stops.
Every replica reads the whole topic (baton_gateway.table), so each knows what every tenant has spent
on every partition, before it started too: a restart or a rollout of the gateways forgets nothing.
Of two totals of one key, the one counted through the later offset wins, so a response read again
after a crash or a rebalance is never counted twice. A crash forgets at most the spend of its last
`FLUSH_S` whose offsets were already committed.

Records are checked as they are read (the topic is on the bus): a key that is not a known tenant and
a partition, or a value that is not a finite, non-negative total, is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass

from baton_gateway.table import TopicTable
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.consumer import Publisher

log = logging.getLogger(__name__)

FLUSH_S = 1.0


@dataclass(frozen=True)
class Total:
    """A tenant's spend on one partition of baton.responses, counted through `through` (an offset)."""

    cost_usd: float
    through: int


class SpendLedger:
    def __init__(self, tenants: set[str], kafka: KafkaConfig | None = None, out: Publisher | None = None) -> None:
        self._tenants = tenants
        self._out = out
        self._totals: dict[tuple[str, int], Total] = {}
        self._by_tenant: dict[str, float] = {}
        self._changed: set[tuple[str, int]] = set()
        self.table = TopicTable(kafka, topics.SPEND, self._take) if kafka is not None else None
        self._task: asyncio.Task | None = None
        self._caught_up = kafka is None

    async def caught_up(self) -> bool:
        """Whether this replica has read the ledger as it stood when it started (once true, stays true):
        until then it would admit a tenant's requests against an incomplete spend."""
        if not self._caught_up and self.table is not None:
            self._caught_up = await self.table.catch_up(timeout_s=0.5)
        return self._caught_up

    def spent(self, tenant: str) -> float:
        """What the tenant has spent, all partitions and all replicas together."""
        return self._by_tenant.get(tenant, 0.0)

    def count(self, tenant: str, partition: int, offset: int, cost_usd: float) -> None:
        """A final response at `offset` of `partition`, read by the partition's owner."""
        if tenant not in self._tenants or not math.isfinite(cost_usd) or cost_usd < 0:
            return
        key = (tenant, partition)
        now = self._totals.get(key)
        if now is not None and offset <= now.through:
            return  # read again after a crash or a rebalance: counted already
        self._set(key, Total((now.cost_usd if now else 0.0) + cost_usd, offset))
        self._changed.add(key)

    def _set(self, key: tuple[str, int], total: Total) -> None:
        before = self._totals.get(key)
        self._totals[key] = total
        self._by_tenant[key[0]] = self._by_tenant.get(key[0], 0.0) + total.cost_usd - (before.cost_usd if before else 0.0)

    def _take(self, key: str, value: bytes | None) -> None:
        tenant, _, partition = key.rpartition("/")
        if tenant not in self._tenants or not partition.isdigit() or value is None:
            return
        try:
            record = json.loads(value)
            total = Total(float(record["cost_usd"]), int(record["through"]))
        except (ValueError, KeyError, TypeError):
            log.warning("baton.spend: a record of %s is not a spend total; skipped", key[:80])
            return
        if not math.isfinite(total.cost_usd) or total.cost_usd < 0:
            return
        now = self._totals.get((tenant, int(partition)))
        if now is None or total.through > now.through:
            self._set((tenant, int(partition)), total)

    async def flush(self) -> None:
        """Publish every total that changed since the last flush."""
        changed, self._changed = self._changed, set()
        if self._out is None or not changed:
            return
        sends = []
        for tenant, partition in changed:
            total = self._totals[(tenant, partition)]
            record = {"tenant": tenant, "partition": partition, "cost_usd": total.cost_usd, "through": total.through,
                      "at_unix_ms": int(time.time() * 1000)}
            sends.append(self._out.send(json.dumps(record).encode(), key=f"{tenant}/{partition}"))
        results = await asyncio.gather(*sends, return_exceptions=True)
        for key, result in zip(changed, results, strict=True):
            if isinstance(result, BaseException):
                self._changed.add(key)  # the broker is away: sent with the next flush

    async def start(self) -> None:
        if self.table is not None:
            await self.table.start()
        self._task = asyncio.create_task(self._flush_every(), name="spend ledger")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 5.0)
        if self.table is not None:
            await self.table.stop()

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()
