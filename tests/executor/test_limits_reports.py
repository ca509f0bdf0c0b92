"""Limits reports (`baton.limits.<provider>`) that no replica could have sent are not believed."""

from __future__ import annotations

import json
from types import SimpleNamespace

from baton_executor.limits import TTL_S, WorkerLimits
from baton_executor.sharing import ShareExchange

NOW = 1_800_000_000.0


def exchange() -> ShareExchange:
    service = SimpleNamespace(publisher=lambda *a, **k: None, kafka=None)
    x = ShareExchange(service, "openai", {"gpt": WorkerLimits(600, None, 8, 0.05)}, backlog=lambda: 0)
    x.total_partitions = 8
    return x


def report(**changes) -> bytes:
    d = {"member": "replica-2", "partitions": 4, "busy": True, "busy_since": NOW - 1, "in_flight": {"gpt": 3},
         "at": NOW - 0.2}
    return json.dumps(d | changes).encode()


def test_a_replicas_own_report_is_kept_and_a_forged_one_is_not():
    x = exchange()
    x._take(report(), now=NOW)
    assert x.table["replica-2"]["partitions"] == 4
    for forged in (
        report(member="ghost", partitions=100_000, at=9e15),  # the forged report that zeroed every replica
        report(member="ghost", at=NOW + TTL_S + 1),  # never goes stale
        report(member="ghost", partitions=9),  # more partitions than the topic has
        report(member="ghost", in_flight={"gpt": 10_000}),  # more calls in flight than the worker allows
        report(member="ghost", partitions=-1),
        report(member="ghost", busy_since=NOW + 5),
        report(member="g" * 200),
        b'{"member": "ghost", "partitions": "many"}',
    ):
        x._take(forged, now=NOW)
    assert set(x.table) == {"replica-2"}
    x._take(json.dumps({"member": "replica-2", "left": True}).encode(), now=NOW)
    assert x.table == {}
