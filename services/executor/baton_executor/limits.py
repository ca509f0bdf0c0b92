"""Provider limits that hold for all replicas of an executor together, with no shared store.

Each replica takes a share of every limit equal to the share of the tasks topic's partitions the
consumer group assigned it (recomputed on every rebalance): with tasks spread over partitions by
request id, the replicas' shares add up to the whole limit at any replica count, and no replica
depends on another or on a coordinator. Requests and tokens are paced rather than spent in bursts:
providers enforce limits over short windows, so a minute's budget never leaves at once. A 429 pauses
the worker on this replica for its Retry-After, instead of letting each request find out alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Pacer:
    """Spaces units at `rate` per second, with at most one unit of credit.

    A call takes its units only when it actually goes out (`try_take`); a call that cannot go yet
    learns how long to wait and asks again. Slots are never booked ahead, so a process that stalls
    (a busy CPU, a long GC) does not release a burst of overdue calls when it wakes: after any stall
    at most one extra unit goes out at once.
    """

    def __init__(self, rate_per_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rate = rate_per_s
        self._next = clock()
        self._paused_until = 0.0

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, rate_per_s: float | None) -> None:
        self._rate = rate_per_s

    def try_take(self, units: float = 1.0) -> float:
        """Take `units` now and return 0, or return the seconds until they could be taken."""
        now = self._clock()
        wait = max(self._paused_until, self._next if self._rate else 0.0) - now
        if wait > 0:
            return wait
        if self._rate:
            self._next = max(self._next, now - 1.0 / self._rate) + units / self._rate
        return 0.0

    def correct(self, units: float) -> None:
        """Add (or give back, when negative) units after the fact: the real usage was known late."""
        if self._rate:
            self._next = max(self._clock() - 1.0 / self._rate, self._next + units / self._rate)

    def pause(self, seconds: float) -> None:
        self._paused_until = max(self._paused_until, self._clock() + seconds)


class Slots:
    """A concurrency limit whose size can change while calls are in flight."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._used = 0
        self._cond = asyncio.Condition()

    @property
    def used(self) -> int:
        return self._used

    async def resize(self, size: int) -> None:
        async with self._cond:
            self._size = max(1, size)
            self._cond.notify_all()

    async def acquire(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._used < self._size)
            self._used += 1

    async def release(self) -> None:
        async with self._cond:
            self._used -= 1
            self._cond.notify_all()


class WorkerLimits:
    """One worker's RPM, TPM and concurrency on this replica, scaled by the replica's share."""

    def __init__(self, rpm: int | None, tpm: int | None, concurrency: int, headroom: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rpm, self._tpm, self._concurrency, self._headroom = rpm, tpm, concurrency, headroom
        self.requests = Pacer(None, clock)
        self.tokens = Pacer(None, clock)
        self.slots = Slots(concurrency)
        self.share = 0.0

    async def set_share(self, share: float) -> None:
        self.share = share
        scale = share * self._headroom
        self.requests.set_rate(self._rpm * scale / 60 if self._rpm else None)
        self.tokens.set_rate(self._tpm * scale / 60 if self._tpm else None)
        await self.slots.resize(max(1, round(self._concurrency * share)) if share > 0 else 1)

    async def admit(self, estimated_tokens: int) -> float:
        """Wait until this call may go under RPM and TPM; return the seconds waited."""
        waited = 0.0
        while True:
            # Tokens first: a call blocked on tokens must not spend a request slot meanwhile.
            wait = self.tokens.try_take(estimated_tokens)
            if wait == 0:
                wait = self.requests.try_take(1)
                if wait > 0:
                    self.tokens.correct(-estimated_tokens)  # give the tokens back; ask again later
            if wait == 0:
                return waited
            await asyncio.sleep(wait)
            waited += wait

    def settle(self, estimated_tokens: int, actual_tokens: int) -> None:
        self.tokens.correct(actual_tokens - estimated_tokens)

    def back_off(self, seconds: float) -> None:
        self.requests.pause(seconds)
        self.tokens.pause(seconds)


def estimate_tokens(messages: list[dict[str, str]], max_tokens: int | None) -> int:
    """A cheap upper-ish estimate before the call: ~4 characters per token, plus the answer budget."""
    prompt = sum(len(m["content"]) for m in messages) // 4 + 4 * len(messages)
    return prompt + (max_tokens or 256)
