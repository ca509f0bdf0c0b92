"""How the 'transformers' conductor gathers concurrent requests into batches, with the model's
`generate` replaced by a function that records each batch (the real model is exercised in
test_conductor_transformers.py)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from types import SimpleNamespace

import pytest
from testbed import default_config_data, pool

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import BatonConfig
from baton_router.conductor import ConductorOutputError
from baton_router.conductor.transformers_backend import Sample, TransformersConductor

PLAN = '{"model_id": [0, 1], "subtasks": ["Answer.", "Check."], "access_list": [[], [0]]}'


def conductor(**settings) -> TransformersConductor:
    data = default_config_data()
    data["conductor"] = {"backend": "transformers", "transformers": settings}
    backend = TransformersConductor(*pool(BatonConfig(**data)))
    backend._loaded = SimpleNamespace(version="stand-in")  # as if loaded: no model is needed here
    return backend


def ask(i: int) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id=str(i), messages=[common_pb2.ChatMessage(role="user", content=f"q{i}")])


class Generate:
    """Records the questions of every batch and which thread ran it."""

    def __init__(self, seconds: float = 0.05, text: str = PLAN, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.seconds, self.text, self.fail = seconds, text, fail

    def __call__(self, conversations, inner=None):
        self.batches.append([c[-1]["content"] for c in conversations])
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)  # blocks its thread, as the model does
        if self.fail:
            raise RuntimeError("out of memory")
        return [Sample(text=self.text, token_ids=[1, 2], token_logprobs=[-0.5, -0.25], model_logprobs=[-0.9, -0.7],
                       sampling_logprobs=[-0.2, -0.1],
                       finished=True) for _ in conversations]


async def test_concurrent_requests_share_generate_calls_up_to_the_batch_size():
    backend = conductor(batch_size=4, batch_wait_ms=50, temperature=0.7)
    backend.generate = gen = Generate()
    proposals = await asyncio.gather(*(backend.propose(ask(i)) for i in range(10)))
    assert [len(b) for b in gen.batches] == [4, 4, 2]
    assert sorted(q for b in gen.batches for q in b) == sorted(f"q{i}" for i in range(10))
    assert all(p.plan.workers == ["gemini-pro", "gemini-flash"] for p in proposals)
    assert proposals[0].token_logprobs == [-0.5, -0.25] and proposals[0].propensity == pytest.approx(math.exp(-0.3))
    assert proposals[0].log_propensity == pytest.approx(-0.3)
    assert gen.threads and all(t.startswith("conductor") for t in gen.threads), "generate runs off the event loop"
    await backend.aclose()


async def test_the_event_loop_stays_free_while_a_batch_is_generated():
    backend = conductor(batch_size=2, batch_wait_ms=0)
    backend.generate = Generate(seconds=0.5)
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await backend.propose(ask(0))
    ticker.cancel()
    assert ticks >= 20, "the loop kept running while the model worked"
    await backend.aclose()


async def test_a_lone_request_waits_at_most_batch_wait_ms():
    backend = conductor(batch_size=8, batch_wait_ms=100)
    backend.generate = gen = Generate(seconds=0)
    started = time.perf_counter()
    await backend.propose(ask(0))
    assert 0.09 <= time.perf_counter() - started < 1.0 and gen.batches == [["q0"]]
    await backend.aclose()


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_still_runs():
    backend = conductor(batch_size=4, batch_wait_ms=20)
    backend.generate = Generate(fail=True)
    results = await asyncio.gather(*(backend.propose(ask(i)) for i in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["out of memory"] * 3
    backend.generate = Generate()
    assert (await backend.propose(ask(9))).plan.subtasks == ["Answer.", "Check."]
    await backend.aclose()


async def test_unparseable_text_and_greedy_propensity():
    backend = conductor(batch_size=1, batch_wait_ms=0, temperature=0)
    backend.generate = Generate(text='{"model_id": [0], "subtasks": ["cut')
    with pytest.raises(ConductorOutputError) as err:
        await backend.propose(ask(0))
    assert err.value.token_logprobs == [-0.5, -0.25] and err.value.policy_version == "stand-in"
    backend.generate = Generate()
    assert (await backend.propose(ask(1))).propensity == 1.0, "greedy decoding picks the plan with certainty"
    await backend.aclose()


async def test_a_caller_that_gives_up_is_skipped_and_close_fails_the_waiting_ones():
    backend = conductor(batch_size=1, batch_wait_ms=0)
    backend.generate = gen = Generate(seconds=0.3)
    first = asyncio.create_task(backend.propose(ask(0)))
    await asyncio.sleep(0.05)  # the first batch is running
    gone = asyncio.create_task(backend.propose(ask(1)))
    waiting = asyncio.create_task(backend.propose(ask(2)))
    await asyncio.sleep(0.05)
    gone.cancel()
    await first
    await asyncio.sleep(0.5)
    assert ["q1"] not in gen.batches and ["q2"] in gen.batches
    await waiting
    running = asyncio.create_task(backend.propose(ask(3)))
    queued = asyncio.create_task(backend.propose(ask(4)))
    await asyncio.sleep(0.1)  # q3 is being generated, q4 waits in the queue
    await backend.aclose()
    for task in (running, queued):
        with pytest.raises(RuntimeError, match="closed"):
            await task
    with pytest.raises(RuntimeError, match="closed"):
        await backend.propose(ask(5))
