import asyncio

from baton_executor.limits import Pacer, Slots, WorkerLimits, estimate_tokens


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_pacer_spaces_calls_evenly_with_no_initial_burst():
    clock = Clock()
    p = Pacer(10.0, clock)
    assert p.try_take() == 0.0
    assert round(p.try_take(), 9) == 0.1, "the next call waits its turn"
    clock.t += 0.1
    assert p.try_take() == 0.0


def test_a_stall_releases_at_most_one_extra_call():
    clock = Clock()
    p = Pacer(10.0, clock)
    p.try_take()
    clock.t += 60  # a long stall, or a minute idle
    assert p.try_take() == 0.0 and p.try_take() == 0.0
    assert round(p.try_take(), 9) == 0.1, "no burst of overdue calls"


def test_a_pause_holds_every_call():
    clock = Clock()
    p = Pacer(None, clock)
    assert p.try_take() == 0.0, "no limit configured"
    p.pause(2.0)
    assert p.try_take() == 2.0
    clock.t += 2.0
    assert p.try_take() == 0.0


def test_token_corrections_move_later_calls():
    clock = Clock()
    p = Pacer(100.0, clock)
    p.try_take(100)  # estimated 100 tokens: one second of budget
    p.correct(100)  # they were 200
    assert round(p.try_take(1), 9) == 2.0


async def test_admission_follows_the_rate_in_real_time():
    w = WorkerLimits(rpm=1200, tpm=None, concurrency=8, headroom=1.0)
    await w.set_share(1.0)  # 20 calls per second
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(w.admit(10) for _ in range(11)))
    assert 0.45 <= loop.time() - start <= 1.0, "11 calls at 20/s take about half a second"


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
