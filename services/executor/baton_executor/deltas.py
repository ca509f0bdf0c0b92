"""A streaming request's answer text as it comes: provider pieces batched into Delta responses.

The provider adapters hand over each parsed piece synchronously (ProviderCall.on_delta); a small
pump task publishes them. The first piece goes out at once, so the client's first token waits for no
timer; after that, whatever arrived is sent every FLUSH_INTERVAL_S, one record at a time, in order.
Publishing is best effort: a send that fails stops this task's stream (the gateway still gets the
whole answer with the final response) and never fails the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from baton.v1 import responses_pb2

log = logging.getLogger(__name__)

# Providers emit a token every few milliseconds; a Kafka record per token would multiply broker
# and gateway work by the answer's length. 25 ms batches a handful of tokens per record while
# staying well below what a reader notices (about 40 updates a second).
FLUSH_INTERVAL_S = 0.025

Publish = Callable[[responses_pb2.Response], Awaitable[None]]


class DeltaBatcher:
    """The Delta responses of one task. Offsets count code points from the start of the current
    provider call; `new_call` starts a retry at offset 0 again (the gateway reconciles)."""

    def __init__(self, request_id: str, task_id: str, publish: Publish, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._request_id = request_id
        self._task_id = task_id
        self._publish = publish
        self._interval_s = interval_s
        self._call: list[str] = []  # the current call's text so far
        self._call_len = 0
        self._batch: list[str] = []  # not yet sent, starting at _batch_start in the current call
        self._batch_start = 0
        self._ready: list[responses_pb2.Delta] = []  # sealed batches of earlier calls, not yet sent
        self._closed = asyncio.Event()
        self._pump: asyncio.Task | None = None
        self._broken = False
        self.records = 0  # Delta responses published

    def add(self, text: str) -> None:
        """A piece of the current call's answer (the provider callback; never blocks)."""
        if not text or self._broken:
            return
        if not self._batch:
            self._batch_start = self._call_len
        self._batch.append(text)
        self._call.append(text)
        self._call_len += len(text)
        if self._pump is None and not self._closed.is_set():
            self._pump = asyncio.create_task(self._run())

    def new_call(self) -> None:
        """A retry begins: what the failed call produced is still sent, the new call counts from 0."""
        self._seal()
        self._call, self._call_len = [], 0

    def finish(self, text: str) -> None:
        """The call's whole answer: sends what was not streamed (all of it, for a provider that does
        not stream). Text that contradicts what was streamed is left to the final response."""
        streamed = "".join(self._call)
        if text.startswith(streamed):
            self.add(text[len(streamed):])

    async def close(self) -> None:
        """Send everything left and wait until it is published (the step's result goes after it)."""
        self._closed.set()
        if self._pump is not None:
            await self._pump

    def abort(self) -> None:
        """Stop at once (the task itself was cancelled or failed)."""
        self._closed.set()
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    def _seal(self) -> None:
        if self._batch:
            self._ready.append(responses_pb2.Delta(text="".join(self._batch), task_id=self._task_id,
                                                   offset=self._batch_start))
            self._batch = []

    def _take(self) -> list[responses_pb2.Delta]:
        self._seal()
        ready, self._ready = self._ready, []
        return ready

    async def _run(self) -> None:
        try:
            while True:
                for delta in self._take():
                    await self._publish(responses_pb2.Response(request_id=self._request_id, delta=delta))
                    self.records += 1
                if self._closed.is_set():
                    if not (self._batch or self._ready):
                        return
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), self._interval_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the stream is a courtesy; the step's result is what counts
            self._broken = True
            log.warning("task %s: answer deltas could not be published (%s); the answer arrives whole",
                        self._task_id, type(e).__name__)
