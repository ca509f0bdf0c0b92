from aiokafka import TopicPartition

from baton_platform.offsets import OffsetTracker

TP = TopicPartition("t", 0)


def test_commits_stop_at_the_oldest_unfinished_record():
    t = OffsetTracker()
    for o in (10, 11, 12, 13):
        t.begin(TP, o)
    t.finish(TP, 11)
    t.finish(TP, 13)
    assert t.committable() == {TP: 10}
    t.finish(TP, 10)
    assert t.committable() == {TP: 12}
    t.finish(TP, 12)
    assert t.committable() == {TP: 14}, "all finished: one past the newest"


def test_partitions_are_independent_and_forgettable():
    t = OffsetTracker()
    other = TopicPartition("t", 1)
    t.begin(TP, 5)
    t.begin(other, 7)
    t.finish(other, 7)
    assert t.committable() == {TP: 5, other: 8}
    t.forget([TP])
    assert t.committable() == {other: 8}


class FakeConsumer:
    def __init__(self):
        self.commits = []

    async def commit(self, offsets):
        self.commits.append(dict(offsets))


async def test_commit_sends_only_what_moved():
    t, c = OffsetTracker(), FakeConsumer()
    t.begin(TP, 0)
    t.finish(TP, 0)
    await t.commit(c)
    await t.commit(c)
    assert c.commits == [{TP: 1}]


async def test_a_commit_skipped_for_being_too_soon_is_made_when_the_interval_is_up():
    import asyncio

    from aiokafka import AIOKafkaConsumer

    from baton_platform.offsets import CommitPacer

    class Consumer(AIOKafkaConsumer):
        def __init__(self):
            self.commits = []

        async def commit(self, offsets):
            self.commits.append(dict(offsets))

    t, consumer = OffsetTracker(), Consumer()
    pacer = CommitPacer(t, interval_s=0.2)
    t.begin(TP, 0)
    t.finish(TP, 0)
    await pacer.maybe_commit(consumer)
    t.begin(TP, 1)
    t.finish(TP, 1)
    await pacer.maybe_commit(consumer)  # too soon after the first: skipped for now
    assert consumer.commits == [{TP: 1}]
    await asyncio.sleep(0.4)  # and no record comes after it
    assert consumer.commits[-1] == {TP: 2}, "the last record is committed without waiting for another"
