"""The executor's delta batching for streaming requests: a provider's pieces in few, ordered records."""

from __future__ import annotations

import asyncio

from baton.v1 import responses_pb2
from baton_executor.deltas import DeltaBatcher


class Recorder:
    """A publish function that keeps what it was given; `gate` holds each send until released."""

    def __init__(self, gated: bool = False) -> None:
        self.sent: list[responses_pb2.Response] = []
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        if not gated:
            self.gate.set()

    async def __call__(self, response: responses_pb2.Response) -> None:
        self.entered.set()
        await self.gate.wait()
        self.sent.append(response)

    @property
    def deltas(self) -> list[tuple[int, str]]:
        return [(r.delta.offset, r.delta.text) for r in self.sent]


async def test_the_first_piece_goes_out_at_once_and_the_rest_in_batches_in_order():
    publish = Recorder(gated=True)
    batcher = DeltaBatcher("r", "r:1:1", publish)
    batcher.add("Hello")
    await publish.entered.wait()  # the first piece is being sent with nothing else waiting for it
    for i in range(50):
        batcher.add(f" t{i}")
    publish.gate.set()
    await batcher.close()
    pieces = ["Hello"] + [f" t{i}" for i in range(50)]
    assert publish.deltas[0] == (0, "Hello")
    # 50 pieces that arrived while a send was under way travel in far fewer records.
    assert 2 <= len(publish.sent) <= 4 and batcher.records == len(publish.sent)
    assert "".join(t for _, t in publish.deltas) == "".join(pieces)
    offsets = [o for o, _ in publish.deltas]
    assert offsets == [sum(len(t) for _, t in publish.deltas[:i]) for i in range(len(offsets))]
    assert all(r.request_id == "r" and r.delta.task_id == "r:1:1" for r in publish.sent)


async def test_a_provider_that_does_not_stream_sends_its_whole_answer_as_one_delta():
    publish = Recorder()
    batcher = DeltaBatcher("r", "r:1:1", publish)
    batcher.new_call()
    batcher.finish("The answer is (C).")
    await batcher.close()
    assert publish.deltas == [(0, "The answer is (C).")]


async def test_what_a_streaming_call_left_out_of_its_pieces_is_sent_at_the_end():
    publish = Recorder()
    batcher = DeltaBatcher("r", "r:1:1", publish)
    batcher.add("abc")
    batcher.finish("abcdef")  # e.g. a refusal, or text the adapter assembled itself
    batcher.finish("xyz")  # contradicts what was streamed: left to the final response
    await batcher.close()
    assert "".join(t for _, t in publish.deltas) == "abcdef"


async def test_a_retried_call_starts_again_at_offset_zero_after_the_failed_calls_text():
    publish = Recorder(gated=True)
    batcher = DeltaBatcher("r", "r:1:1", publish)
    batcher.add("The c")
    await publish.entered.wait()
    batcher.add("at")  # still waiting to go when the call fails
    batcher.new_call()
    batcher.add("The cat sat.")
    publish.gate.set()
    await batcher.close()
    assert publish.deltas == [(0, "The c"), (5, "at"), (0, "The cat sat.")]


async def test_a_failed_send_stops_the_stream_but_not_the_step():
    async def broken(response):
        raise ConnectionError("broker gone")

    batcher = DeltaBatcher("r", "r:1:1", broken)
    batcher.add("a")
    await asyncio.sleep(0)
    batcher.add("b")
    await batcher.close()  # does not raise
    assert batcher.records == 0


async def test_abort_stops_a_pump_that_is_waiting_to_send():
    publish = Recorder(gated=True)
    batcher = DeltaBatcher("r", "r:1:1", publish)
    batcher.add("a")
    await publish.entered.wait()
    batcher.abort()
    await asyncio.sleep(0)
    assert publish.sent == []
