import asyncio

from baton_executor.limits import Member, Pacer, Slots, WorkerLimits, allocate, estimate_tokens, partition_slots


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
    p = Pacer(100.0, clock, credit_s=1.0)
    assert p.try_take(100) == 0  # estimated 100 tokens: the second of credit, charged before the call
    p.correct(100)  # they were 200
    assert 1.0 <= p.try_take(1) <= 1.02, "the extra 100 tokens push the next call a second"


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


async def test_concurrency_shares_never_add_up_to_more_than_the_limit():
    for concurrency, replicas in ((8, 3), (1, 4), (5, 2), (7, 3)):
        sizes = []
        for _ in range(replicas):
            w = WorkerLimits(rpm=None, tpm=None, concurrency=concurrency, headroom=1.0)
            await w.set_share(1 / replicas)
            sizes.append(w.slots.size)
        assert sum(sizes) <= concurrency, (concurrency, replicas, sizes)


def test_partition_slots_add_up_to_the_limit_for_any_split():
    for concurrency, partitions in ((8, 8), (1, 8), (3, 8), (64, 8), (10, 3)):
        for split in ([set(range(partitions))], [{0, 1, 2}, set(range(3, partitions))],
                      [{p} for p in range(partitions)]):
            assert sum(partition_slots(concurrency, partitions, s) for s in split) == concurrency


def member(name, partitions, busy=False, in_flight=0, at=1000.0, busy_since=0.0):
    return Member(name, partitions, busy, busy_since, in_flight, at)


def test_allocation_splits_slots_exactly_and_gives_every_replica_a_turn_when_there_are_too_few():
    table = [member("a", 3), member("b", 3), member("c", 2)]
    assert sum(allocate(m.member, table, 8, 1000.0).slots for m in table) == 8
    holders = set()
    for t in range(0, 200, 5):
        now = 1000.0 + t
        live = [member(m.member, m.partitions, at=now) for m in table]
        slots = {m.member: allocate(m.member, live, 1, now).slots for m in live}
        assert sum(slots.values()) == 1, "one call at a time over all replicas, never more"
        holders |= {k for k, v in slots.items() if v}
    assert holders == {"a", "b", "c"}, "each replica's tasks get a turn"


def test_a_slot_is_not_used_while_the_others_still_fill_the_limit():
    table = [member("a", 4, in_flight=1), member("b", 4)]
    # Whatever the turn says, b may not start a call while a still runs the only one allowed.
    assert allocate("b", table, 1, 1000.0).slots == 0


def test_idle_replicas_lend_their_share_to_busy_ones_after_the_grace():
    now = 1000.0
    table = [member("a", 3, busy=True, busy_since=now - 5), member("b", 3), member("c", 2)]
    a = allocate("a", table, 8, now)
    assert a.share > 0.9, a
    assert sum(allocate(m.member, table, 8, now).share for m in table) <= 1.0 + 1e-9
    # b just became busy: it takes its share only after the others have seen its report.
    table[1] = member("b", 3, busy=True, busy_since=now - 0.1)
    assert allocate("b", table, 8, now).share < 0.1
    assert 0.49 < allocate("b", table, 8, now + 1).share < 0.51
    assert 0.49 < allocate("a", table, 8, now).share < 0.51, "a gives b its half as soon as it reads b's report"


def test_a_replica_unknown_to_the_table_or_gone_falls_back_or_is_ignored():
    assert allocate("x", [member("a", 8)], 8, 1000.0) is None
    table = [member("a", 4), member("b", 4, at=900.0)]  # b stopped reporting long ago
    assert allocate("a", table, 8, 1000.0).share == 1.0


def test_a_zero_share_holds_calls_instead_of_letting_them_all_go():
    clock = Clock()
    p = Pacer(0.0, clock)
    assert p.try_take() > 0 and p.try_take() > 0, "a rate of 0 is no budget, not no limit"


async def test_a_replica_with_no_share_waits_for_one():
    w = WorkerLimits(rpm=600, tpm=None, concurrency=8, headroom=1.0)
    await w.set_share(0.0)
    admitted = asyncio.create_task(w.admit(10))
    await asyncio.sleep(0.3)
    assert not admitted.done(), "no share, no calls"
    await w.set_share(1.0)
    await asyncio.wait_for(admitted, 2)


def test_an_oversized_call_waits_for_its_tokens_before_it_goes():
    clock = Clock()
    w = WorkerLimits(rpm=None, tpm=6000, concurrency=8, headroom=1.0, clock=clock)
    asyncio.run(w.set_share(1.0))  # 100 tokens per second
    assert w.tokens.try_take(100) == 0  # the budget is spent up to now
    wait = w.tokens.try_take(1000)
    assert 9.5 < wait < 10.5, f"1000 tokens at 100/s are earned before the call, not after: {wait}"
    clock.t += wait
    assert w.tokens.try_take(1000) == 0
    assert w.tokens.try_take(50) > 0, "and the next call waits behind it"


def test_replicas_turning_busy_together_keep_their_partition_shares_meanwhile():
    now = 1000.0
    table = [member(k, p, busy=True, busy_since=now - 0.1) for k, p in (("a", 3), ("b", 3), ("c", 2))]
    shares = [allocate(m.member, table, 8, now).share for m in table]
    assert [round(s, 3) for s in shares] == [0.375, 0.375, 0.25]


def test_charges_made_at_a_small_rate_are_repaid_at_the_new_one():
    clock = Clock()
    p = Pacer(0.1, clock)
    assert p.try_take() == 0
    p.set_rate(10.0)
    assert p.try_take() <= 0.1 + 1e-9, "not ten seconds behind the call let through at the small rate"
