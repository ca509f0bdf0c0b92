"""The consumer building block itself, through the example in libs/platform/README.md: run in memory
and on the real broker, it answers, dead-letters in one place, and commits what it handled."""

from __future__ import annotations

import asyncio
import re
import uuid

from testbed import REPO, header

from baton.v1 import common_pb2, dead_letter_pb2, requests_pb2, responses_pb2
from baton_platform import topics
from baton_platform.consumer import Record
from baton_platform.messages import PoisonMessage
from baton_platform.service import Service


async def wait_committed(bootstrap: str, group: str, offsets: dict, timeout: float = 10.0) -> dict:
    """The group's committed offsets of `offsets`' partitions, once they reach `offsets` (or at the timeout)."""
    from aiokafka import AIOKafkaConsumer

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await probe.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            committed = {tp: await probe.committed(tp) for tp in offsets}
            if committed == offsets or asyncio.get_running_loop().time() > deadline:
                return committed
            await asyncio.sleep(0.2)
    finally:
        await probe.stop()


async def finished(consumer, timeout: float = 5.0) -> dict:
    """The consumer's committable offsets once no record it began is unfinished (a dead letter is
    published just before its record is finished, so seeing it does not mean the record is done)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while any(consumer.tracker.pending(tp) for tp in consumer.tracker.committable()):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    return consumer.tracker.committable()


def example_app(config):
    """The README's example, run as written."""
    (code,) = re.findall(r"```python\n(.*?)```", (REPO / "libs" / "platform" / "README.md").read_text(), re.DOTALL)
    scope = {"config": config, "Service": Service, "Record": Record, "PoisonMessage": PoisonMessage,
             "topics": topics, "requests_pb2": requests_pb2, "responses_pb2": responses_pb2}
    exec(code, scope)  # noqa: S102 - the repository's own documentation
    return scope["service"], scope["app"]


async def test_the_readme_example_answers_and_dead_letters(bus):
    service, app = example_app(bus.config())
    rid, bad = uuid.uuid4().hex, uuid.uuid4().hex
    async with bus.running(app, topics.RESPONSES, topics.DLQ) as seen:
        await bus.publish(app, topics.REQUESTS, rid, requests_pb2.ChatRequest(request_id=rid).SerializeToString())
        await bus.publish(app, topics.REQUESTS, bad, b"\xff not a request")
        (answer,) = await seen[topics.RESPONSES].wait(lambda r: r.key == rid.encode())
        (letter,) = await seen[topics.DLQ].wait(lambda r: r.key == bad.encode())
        (consumer,) = service.consumers
        handled = await finished(consumer)
        if bus.bootstrap is not None:
            # No record follows: the commit is made while the consumer is idle.
            committed = await wait_committed(bus.bootstrap, "baton-echo", handled)
            assert committed == handled, "the group's commits reach past both records"
        # Every letter counted was written. A new group reads baton.requests from its start, so on the
        # session's broker it also dead-letters what earlier suites left there: count those too.
        counted = service.registry.get_sample_value("baton_dlq_messages_total", {"topic": topics.REQUESTS})
        written = await seen[topics.DLQ].wait(
            lambda r: dead_letter_pb2.DeadLetter.FromString(r.value).service == "baton-echo", count=int(counted))
    assert responses_pb2.Response.FromString(answer.value).answer == "hi"
    assert "not a valid baton.v1.ChatRequest" in header(letter, topics.DLQ_REASON_HEADER)
    assert dead_letter_pb2.DeadLetter.FromString(letter.value).service == "baton-echo"
    assert counted == len(written) >= 1
    assert handled and all(consumer.tracker.pending(tp) == 0 for tp in handled), "both records are finished"
    assert {tp.topic for tp in handled} == {topics.REQUESTS}


async def test_a_record_too_large_to_send_is_dead_lettered_and_its_partition_goes_on(bus):
    """A handler whose output would be over the record limit (a task carrying a large conversation three
    times) can never send it: the record it handles goes to the DLQ saying why, is finished, and the
    records after it are answered and committed, instead of the partition's commits freezing."""
    service = Service.create("baton-tripler", bus.config().kafka)
    answers = service.publisher(topics.RESPONSES, responses_pb2.Response)

    async def triple(request: requests_pb2.ChatRequest, record: Record) -> None:
        text = request.messages[0].content * 3 if request.messages else "hi"
        await answers.send(responses_pb2.Response(request_id=request.request_id, answer=text),
                           key=request.request_id, record=record)

    service.consumer(topics.REQUESTS, requests_pb2.ChatRequest, triple, group="baton-tripler", tracked=True)
    app = service.asgi_app()
    big, small = uuid.uuid4().hex, uuid.uuid4().hex
    large = requests_pb2.ChatRequest(request_id=big, messages=[common_pb2.ChatMessage(
        role="user", content="x" * 400_000)])
    async with bus.running(app, topics.RESPONSES, topics.DLQ) as seen:
        await bus.publish(app, topics.REQUESTS, big, large.SerializeToString())
        await bus.publish(app, topics.REQUESTS, small, requests_pb2.ChatRequest(request_id=small).SerializeToString())
        (letter,) = await seen[topics.DLQ].wait(lambda r: r.key == big.encode())
        (answer,) = await seen[topics.RESPONSES].wait(lambda r: r.key == small.encode())
        (consumer,) = service.consumers
        handled = await finished(consumer)
        if bus.bootstrap is not None:
            assert await wait_committed(bus.bootstrap, "baton-tripler", handled) == handled
    assert "over the 1048576-byte record limit" in header(letter, topics.DLQ_REASON_HEADER)
    assert dead_letter_pb2.DeadLetter.FromString(letter.value).value == large.SerializeToString()
    assert responses_pb2.Response.FromString(answer.value).answer == "hi"
    assert handled and all(consumer.tracker.pending(tp) == 0 for tp in handled), "both records are finished"
