import asyncio

from baton_executor.limits import Pacer, Slots, WorkerLimits, estimate_tokens


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_pacer_spaces_requests_evenly_with_no_initial_burst():
    clock = Clock()
    p = Pacer(10.0, clock)
    waits = [p.reserve() for _ in range(5)]
    assert [round(w, 9) for w in waits] == [0.0, 0.1, 0.2, 0.3, 0.4]


def test_idle_time_does_not_bank_a_burst():
    clock = Clock()
    p = Pacer(10.0, clock)
    p.reserve()
    clock.t += 60
    assert p.reserve() == 0.0
    assert abs(p.reserve() - 0.1) < 1e-9, "a minute idle buys no burst"


def test_a_pause_holds_every_reservation():
    clock = Clock()
    p = Pacer(None, clock)
    assert p.reserve() == 0.0, "no limit configured"
    p.pause(2.0)
    assert p.reserve() == 2.0
    limited = Pacer(10.0, clock)
    limited.pause(1.0)
    assert limited.reserve() == 1.0 and abs(limited.reserve() - 1.1) < 1e-9


def test_token_corrections_move_later_reservations():
    clock = Clock()
    p = Pacer(100.0, clock)
    p.reserve(100)  # estimated 100 tokens: one second of budget
    p.correct(100)  # they were 200
    assert abs(p.reserve(1) - 2.0) < 1e-9


async def test_shares_scale_every_limit():
    w = WorkerLimits(rpm=600, tpm=60_000, concurrency=8, headroom=0.5)
    await w.set_share(0.25)
    assert w.requests.rate == 600 * 0.25 * 0.5 / 60
    assert w.tokens.rate == 60_000 * 0.25 * 0.5 / 60
    await w.slots.acquire()
    await w.slots.acquire()
    blocked = asyncio.create_task(w.slots.acquire())
    await asyncio.sleep(0.01)
    assert not blocked.done(), "a quarter of 8 slots is 2"
    await w.set_share(0.5)
    await asyncio.wait_for(blocked, 1)


async def test_slots_release_wakes_a_waiter():
    s = Slots(1)
    await s.acquire()
    waiter = asyncio.create_task(s.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await s.release()
    await asyncio.wait_for(waiter, 1)
    assert s.used == 1


def test_estimates_count_prompt_and_answer_budget():
    assert estimate_tokens([{"role": "user", "content": "x" * 400}], 50) == 100 + 4 + 50
