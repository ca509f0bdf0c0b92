"""Admission control: past `gateway.max_waiting` a replica sheds new requests at once with 429 and a
Retry-After, instead of queueing them until their deadline."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from faststream.kafka import TestKafkaBroker
from testbed import gateway_metrics

import baton_gateway.main as gateway
from baton_gateway.admission import Admission
from baton_gateway.api import ApiError
from baton_gateway.replies import Replies
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_under_the_limit_everything_is_admitted():
    Admission(3).admit(2)


def test_at_the_limit_the_retry_after_is_the_time_the_backlog_takes_to_drain():
    clock = Clock()
    admission = Admission(100, window_s=10, clock=clock)
    for _ in range(50):  # 5 answers a second over the last 10 s
        admission.answered()
    with pytest.raises(ApiError) as shed:
        admission.admit(119)  # 20 above the limit, at 5/s: 4 s
    assert shed.value.status == 429 and shed.value.code == "overloaded"
    assert shed.value.headers == {"retry-after": "4"}
    clock.now = 11  # no answer for a whole window: nothing to estimate from
    with pytest.raises(ApiError) as shed:
        admission.admit(100)
    assert shed.value.headers == {"retry-after": "1"}


def test_the_retry_after_is_capped():
    clock = Clock()
    admission = Admission(1, window_s=10, clock=clock)
    admission.answered()  # 0.1/s
    with pytest.raises(ApiError) as shed:
        admission.admit(1000)
    assert shed.value.headers == {"retry-after": "60"}


class AssignedReplies(Replies):
    """The in-memory broker assigns no partitions; this replica owns partition 0 of baton.responses."""

    def __init__(self) -> None:
        super().__init__()
        self._partitions = [0]


async def test_a_full_replica_sheds_the_next_request_at_once_and_counts_it(write_config, monkeypatch):
    monkeypatch.setattr(gateway, "Replies", AssignedReplies)
    config = load_config(write_config({"gateway": {"request_timeout_s": 3, "auth": "none", "max_waiting": 2}}))
    app = gateway.create_app(config, tracer_provider=setup_tracing("t", set_global=False))
    body = {"model": "baton", "messages": [{"role": "user", "content": "Q?"}]}
    async with TestKafkaBroker(app.state.service.broker), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        # Nobody answers: two requests hold both places until their deadline.
        held = [asyncio.create_task(client.post("/v1/chat/completions", json=body, timeout=30)) for _ in range(2)]
        while True:
            metrics = await gateway_metrics(app)
            if "baton_gateway_waiting 2.0" in metrics:
                break
            await asyncio.sleep(0.05)
        shed = await client.post("/v1/chat/completions", json=body, timeout=30)
        assert not any(t.done() for t in held)  # refused at once, not queued behind them
        assert shed.status_code == 429, shed.text
        assert shed.json()["error"]["code"] == "overloaded"
        assert shed.headers["retry-after"] == "1"
        assert "baton_gateway_shed_total 1.0" in await gateway_metrics(app)
        assert [r.status_code for r in await asyncio.gather(*held)] == [504, 504]
        # Their places are free again.
        assert "baton_gateway_waiting 0.0" in await gateway_metrics(app)
