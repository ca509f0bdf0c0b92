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


async def test_a_commit_skipped_for_being_too_soon_is_made_while_the_consumer_is_idle(write_config):
    import asyncio
    from types import SimpleNamespace

    from aiokafka import AIOKafkaConsumer

    from baton.v1 import requests_pb2
    from baton_platform.config import load_config
    from baton_platform.service import Service
    from baton_platform.telemetry import setup_tracing

    class Consumer(AIOKafkaConsumer):
        def __init__(self):
            self.commits = []

        async def commit(self, offsets):
            self.commits.append(dict(offsets))

    async def handle(message, record):
        pass

    service = Service.create("t", load_config(write_config()).kafka, setup_tracing("t", set_global=False))
    consumer = service.consumer(TP.topic, requests_pb2.ChatRequest, handle, group="g", tracked=True,
                                commit_every_s=0.2)
    kafka = consumer.subscriber.consumer = Consumer()

    def record(offset):
        body = requests_pb2.ChatRequest(request_id="r").SerializeToString()
        return SimpleNamespace(body=body, raw_message=SimpleNamespace(topic=TP.topic, partition=TP.partition, headers=(),
                                                                      offset=offset, key=b"r", value=body))

    await service.start_consumers()
    try:
        await consumer.consume(record(0))
        await consumer.consume(record(1))  # too soon after the first: not committed with it
        assert kafka.commits == [{TP: 1}]
        await asyncio.sleep(0.5)  # and no record comes after it
        assert kafka.commits[-1] == {TP: 2}, "the last record is committed without waiting for another"
    finally:
        await service.stop_consumers()


async def test_a_record_is_finished_only_once_the_broker_acknowledged_what_was_sent_for_it(write_config):
    """`Publisher.send(..., record=...)` queues a send and returns; the consumer finishes (commits)
    the record when the send's acknowledgement arrives, and never when the send failed."""
    import asyncio

    from baton.v1 import requests_pb2
    from baton_platform.config import load_config
    from baton_platform.consumer import Record
    from baton_platform.service import Service
    from baton_platform.telemetry import setup_tracing

    async def handle(message, record):
        pass

    service = Service.create("t", load_config(write_config()).kafka, setup_tracing("t", set_global=False))
    consumer = service.consumer(TP.topic, requests_pb2.ChatRequest, handle, group="g", tracked=True)
    loop = asyncio.get_running_loop()
    acked, failed, pending = (Record(TP, o, b"", acks=[loop.create_future()]) for o in (0, 1, 2))
    for r in (acked, failed, pending):
        consumer.tracker.begin(r.tp, r.offset)
        consumer.finish(r)
    assert consumer.tracker.committable() == {TP: 0}, "nothing acknowledged yet"
    acked.acks[0].set_result(None)
    failed.acks[0].set_exception(ConnectionError("broker gone"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert consumer.tracker.committable() == {TP: 1}, "the acknowledged record only"
    assert consumer.tracker.holds(TP, 1) and consumer.tracker.holds(TP, 2)
    pending.acks[0].set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert consumer.tracker.committable() == {TP: 1}, "commits stay short of the failed send's record"
    assert not consumer.tracker.holds(TP, 2)


async def test_a_queued_send_that_fails_is_logged_even_when_its_record_is_never_finished(write_config, caplog):
    import asyncio

    from baton.v1 import requests_pb2
    from baton_platform.config import load_config
    from baton_platform.consumer import Record
    from baton_platform.service import Service
    from baton_platform.telemetry import setup_tracing

    service = Service.create("t", load_config(write_config()).kafka, setup_tracing("t", set_global=False))
    out = service.publisher("baton.requests", requests_pb2.ChatRequest)
    ack = asyncio.get_running_loop().create_future()

    async def publish(*args, **kwargs):
        assert kwargs["no_confirm"], "a send for a record is queued, not awaited"
        return ack

    out._out.publish = publish
    record = Record(TP, 0, b"")
    await out.send(requests_pb2.ChatRequest(request_id="r"), key="r", record=record)
    assert record.acks == [ack]
    ack.set_exception(ConnectionError("broker gone"))
    await asyncio.sleep(0)
    assert "a send to baton.requests failed: ConnectionError('broker gone')" in caplog.text
