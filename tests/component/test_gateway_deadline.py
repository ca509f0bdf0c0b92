"""The gateway answers by its deadline even when the broker is slow to take the request."""

from __future__ import annotations

import asyncio
import time

import httpx
from faststream.kafka import TestKafkaBroker

import baton_gateway.main as gateway
from baton_gateway.replies import Replies
from baton_platform.config import load_config
from baton_platform.consumer import Publisher
from baton_platform.telemetry import setup_tracing


class AssignedReplies(Replies):
    """The in-memory broker assigns no partitions; this replica owns partition 0 of baton.responses."""

    def __init__(self) -> None:
        super().__init__()
        self._partitions = [0]


async def test_a_broker_slow_to_take_the_request_does_not_push_the_answer_past_the_deadline(write_config, monkeypatch):
    monkeypatch.setattr(gateway, "Replies", AssignedReplies)
    app = gateway.create_app(load_config(write_config({"gateway": {"request_timeout_s": 1, "auth": "none"}})),
                             tracer_provider=setup_tracing("t", set_global=False))
    broker = app.state.service.broker
    async with TestKafkaBroker(broker):
        send = Publisher.send

        async def slow_send(*args, **kwargs):
            await asyncio.sleep(4)  # a broker restarting: the send waits for it
            return await send(*args, **kwargs)

        monkeypatch.setattr(Publisher, "send", slow_send)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            started = time.monotonic()
            r = await client.post("/v1/chat/completions",
                                  json={"model": "baton", "messages": [{"role": "user", "content": "Q?"}]}, timeout=30)
            elapsed = time.monotonic() - started
    assert r.status_code in (503, 504), r.text
    assert elapsed < 3, f"answered after {elapsed:.1f} s, past the 1 s deadline"
