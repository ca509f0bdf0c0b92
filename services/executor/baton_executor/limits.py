"""Provider limits that hold for all replicas of an executor together, with no coordinator.

Shares. Every replica takes a share of each limit: its share of the tasks topic's partitions (tasks
are keyed by request id, so load spreads over partitions), which adds up to the whole limit at any
replica count. Because backlogs are uneven, replicas also lend: each reports to a small compacted
topic (`baton.limits.<provider>`, see `sharing.py`) its partitions, whether it has a backlog and its
calls in flight, and every replica computes every replica's allocation from the same table with the
same pure function (`allocate`). An idle replica keeps a small reserve (`RESERVE` of its weight) and
the busy ones split the rest by partitions. A replica that becomes busy takes its full weight only
`GRACE_S` after announcing it, once the others have read its report and shrunk; the pacers keep
`headroom` for that and for clock skew. A replica silent for `TTL_S` is gone and its share goes to
the others; without the table a replica keeps its base share.

Why lending, not a shared store or a lease per call: a store (Redis) or a coordinator is a new
dependency and a single point of failure, and a lease over Kafka costs a round trip per call.
Lending moves only idle replicas' spare, costs one small record per replica every quarter second,
and degrades to the base shares when the topic is unreachable.

Concurrency never exceeds the limit across replicas: the slots are split over the live replicas by
partitions, floored, and the slots left go round the replicas with a remainder, so they add up to
the limit exactly. It is not lent by backlog (an idle replica starting a call would otherwise wait
for another's to end). When the limit is below the replica count some replica gets 0 slots; the
order of the remainder rotates every `ROTATE_S`, and a replica uses a slot it was just given only
while the in-flight calls the others report leave room. A replica with 0 slots holds its tasks
until its turn. Without the table, each partition owns a fixed part of the slots
(`partition_slots`), which also never adds up to more.

Pacing. Requests and tokens are paced rather than spent in bursts, since providers enforce limits
over short windows. A call's estimated tokens are charged before it goes (it waits until the pacer
has earned them, beyond one second's credit) and its real usage corrects the charge. A share of zero
holds every call; it does not mean "unlimited". A 429 pauses the worker on this replica for its
Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

RESERVE = 0.05   # of an idle replica's partition weight that it keeps for its next call
GRACE_S = 0.5    # a replica that became busy waits this long before taking its full share
TTL_S = 3.0      # a replica not heard from for this long is gone
ROTATE_S = 5.0   # how often the order that breaks ties between slot remainders turns


class Pacer:
    """Spaces units at `rate` per second, with `credit` units of credit (at least one).

    A call takes its units only when it actually goes out (`try_take`); a call that cannot go yet
    learns how long to wait and asks again. Slots are never booked ahead, so a process that stalls
    (a busy CPU, a long GC) does not release a burst of overdue calls when it wakes. A call's units
    are earned before it goes: a call bigger than the credit waits for them. A rate of 0 holds
    every call; None is no limit.
    """

    def __init__(self, rate_per_s: float | None, clock: Callable[[], float] = time.monotonic,
                 credit_s: float = 0.0) -> None:
        self._clock = clock
        self._rate = rate_per_s
        self._credit_s = credit_s
        self._next: float | None = None  # when the units charged so far are earned; None: fresh
        self._paused_until = 0.0

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, rate_per_s: float | None) -> None:
        if rate_per_s == self._rate:
            return
        if self._next is not None and self._rate and rate_per_s:
            # Units already charged ahead are repaid at the new rate: a call let through at a tiny
            # share must not hold the next ones for its old, long spacing once the share grows.
            now = self._clock()
            if self._next > now:
                self._next = now + (self._next - now) * self._rate / rate_per_s
        self._rate = rate_per_s

    def _credit(self) -> float:
        """Seconds of rate that may have accumulated unused: one unit, or `credit_s` if more."""
        return max(1.0 / self._rate, self._credit_s) if self._rate else self._credit_s

    def try_take(self, units: float = 1.0) -> float:
        """Take `units` now and return 0, or return the seconds until they could be taken."""
        now = self._clock()
        if now < self._paused_until:
            return self._paused_until - now
        if self._rate is None:
            return 0.0
        if self._rate <= 0:
            return 0.25  # no share of the limit now: ask again soon, the share may change
        if self._next is None:
            start = now - self._credit() + 1.0 / self._rate  # a fresh pacer: its credit, no idle past
        else:
            # Unused time before now counts, up to the credit or, for a call bigger than that, its
            # own size: a call may spend budget left idle in the past, never budget from the future.
            start = max(self._next, now - max(self._credit(), units / self._rate))
        ready = start + (units - 1) / self._rate  # all but one unit earned before the call goes
        if ready > now:
            return ready - now
        self._next = start + units / self._rate
        return 0.0

    def correct(self, units: float) -> None:
        """Add (or give back, when negative) units after the fact: the real usage was known late."""
        if self._rate:
            now = self._clock()
            self._next = max(now - self._credit(), (now if self._next is None else self._next) + units / self._rate)

    def pause(self, seconds: float) -> None:
        self._paused_until = max(self._paused_until, self._clock() + seconds)


class Slots:
    """A concurrency limit whose size can change while calls are in flight (0 holds every call)."""

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._used = 0
        self._cond = asyncio.Condition()

    @property
    def used(self) -> int:
        return self._used

    @property
    def size(self) -> int:
        return self._size

    async def resize(self, size: int) -> None:
        async with self._cond:
            self._size = max(0, size)
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
        # A second's worth of tokens may go at once; a bigger call waits until its tokens are earned.
        self.tokens = Pacer(None, clock, credit_s=1.0)
        self.slots = Slots(concurrency)
        self.share = 0.0

    @property
    def concurrency(self) -> int:
        return self._concurrency

    async def set_share(self, share: float, slots: int | None = None) -> None:
        """Take `share` of RPM and TPM, and `slots` calls at once (default: this share's slots
        when the whole topic's partitions are split evenly; see `partition_slots` for exact ones)."""
        self.share = share
        scale = share * self._headroom
        self.requests.set_rate(self._rpm * scale / 60 if self._rpm else None)
        self.tokens.set_rate(self._tpm * scale / 60 if self._tpm else None)
        await self.slots.resize(int(self._concurrency * share + 1e-9) if slots is None else slots)

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
            # Ask again at least every quarter second: the share may grow meanwhile.
            wait = min(wait, 0.25)
            await asyncio.sleep(wait)
            waited += wait

    def settle(self, estimated_tokens: int, actual_tokens: int) -> None:
        self.tokens.correct(actual_tokens - estimated_tokens)

    def back_off(self, seconds: float) -> None:
        self.requests.pause(seconds)
        self.tokens.pause(seconds)


def partition_slots(concurrency: int, partitions: int, mine) -> int:
    """Slots of `concurrency` that belong to the partitions `mine` of `partitions`: partition p owns
    floor(C(p+1)/P) - floor(Cp/P), so any split of the partitions adds up to exactly C."""
    if partitions <= 0:
        return 0
    return sum((concurrency * (p + 1)) // partitions - (concurrency * p) // partitions for p in mine)


@dataclass(frozen=True)
class Member:
    """One replica's latest report."""

    member: str
    partitions: int
    busy: bool
    busy_since: float  # wall time it last became busy (0 when idle)
    in_flight: int
    at: float  # wall time of the report


@dataclass(frozen=True)
class Allocation:
    share: float  # of RPM and TPM
    slots: int  # calls at once


def allocate(me: str, members: list[Member], concurrency: int, now: float) -> Allocation | None:
    """This replica's allocation from the table of live replicas (see the module's docstring), or None
    when the table does not know this replica."""
    live = {m.member: m for m in members if now - m.at <= TTL_S and m.partitions > 0}
    if me not in live:
        return None
    order = sorted(live)

    def settled(m: Member) -> bool:
        return m.busy and now - m.busy_since >= GRACE_S

    i_settled = settled(live[me])

    def weight(m: Member) -> float:
        # A replica still in its grace holds back to its reserve: the others may not have read its
        # report yet. A settled replica counts one in its grace in full, so it gives way at once;
        # replicas in their grace count each other as holding back, which they do (at the start of
        # a burst, when all turn busy together, they all keep their partition share meanwhile).
        if m.member == me:
            full = i_settled
        else:
            full = settled(m) or (m.busy and i_settled)
        return m.partitions * (1.0 if full else RESERVE)

    weights = {k: weight(m) for k, m in live.items()}
    total = sum(weights.values())
    share = weights[me] / total if total else 0.0
    # Slots: in proportion to partitions, floored, the rest in turn (the same for every replica reading the table).
    parts = sum(m.partitions for m in live.values())
    exact = {k: concurrency * live[k].partitions / parts for k in order}
    slots = {k: int(exact[k] + 1e-9) for k in order}
    left = concurrency - sum(slots.values())
    # The slots left after flooring go round the replicas with a remainder, in an order that turns
    # every ROTATE_S: each gets its turn (by size alone, the smallest might never get one).
    turn = int(now // ROTATE_S) % len(order)
    ranked = [k for k in order[turn:] + order[:turn] if exact[k] - slots[k] > 1e-9]
    for k in ranked[:left]:
        slots[k] += 1
    # Never more in flight than the limit: the others may still finish calls on slots they just lost.
    room = concurrency - sum(m.in_flight for k, m in live.items() if k != me)
    return Allocation(share=share, slots=max(0, min(slots[me], room)))


def estimate_tokens(messages: list[dict[str, str]], max_tokens: int | None) -> int:
    """A cheap upper-ish estimate before the call: ~4 characters per token, plus the answer budget."""
    prompt = sum(len(m["content"]) for m in messages) // 4 + 4 * len(messages)
    return prompt + (max_tokens or 256)
