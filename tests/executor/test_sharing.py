"""The limits table's bookkeeping: nothing is lent before the whole table is read, and concurrency
room is counted per worker."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from baton_executor.limits import WorkerLimits
from baton_executor.sharing import ShareExchange


def exchange(limits, backlog=0):
    return ShareExchange(SimpleNamespace(publisher=lambda *a: None), "sim", limits, backlog=lambda: backlog)


def other(member, partitions, in_flight, busy=False, at=None):
    return json.dumps({"member": member, "partitions": partitions, "busy": busy, "busy_since": 0.0,
                       "in_flight": in_flight, "at": at or time.time()}).encode()


async def test_a_half_read_table_lends_nothing():
    a = WorkerLimits(rpm=600, tpm=None, concurrency=8, headroom=1.0)
    ex = exchange({"a": a}, backlog=5)
    await ex.assigned({0, 1, 2, 3}, 8)
    assert a.share == 0.5
    now = time.time()
    await ex.apply(now, ex.report(now - 5))  # busy for a while, the other replica not yet read
    assert a.share == 0.5, "alone in a table not read to its end is not alone"
    ex._take(other("b", 4, {"a": 0}))
    ex.synced = True
    await ex.apply(now, ex.report(now))
    assert a.share > 0.9, "b is idle: its share is lent"


async def test_concurrency_room_is_counted_per_worker():
    a = WorkerLimits(rpm=None, tpm=None, concurrency=2, headroom=1.0)
    b = WorkerLimits(rpm=None, tpm=None, concurrency=2, headroom=1.0)
    ex = exchange({"a": a, "b": b})
    await ex.assigned({0, 1, 2, 3}, 8)
    ex._take(other("z", 4, {"a": 0, "b": 2}))  # the other replica fills worker b, not worker a
    ex.synced = True
    now = time.time()
    await ex.apply(now, ex.report(now))
    assert a.slots.size == 1 and b.slots.size == 0
