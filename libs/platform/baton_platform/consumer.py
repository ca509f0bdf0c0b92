"""The one way a service reads a topic and writes others.

A `Consumer` subscribes to one topic and hands its handler decoded contract messages. It owns what
every consumer of the suite needs and none should write again:

- decoding: the record is parsed as the consumer's protobuf type; a record that does not parse, or
  whose handler raises `PoisonMessage`, goes to baton.dlq with the reason, from here only;
- offsets (consumers in a group, `tracked=True`): each record is begun before its handler runs and,
  unless the handler keeps it (`keep=True`: it calls `finish` once the work is durable), finished
  after, and finished only once the broker has acknowledged what was sent for it (`Publisher.send`
  with `record=`); commits never pass an unfinished record, are paced, made on revocation, and made
  while idle by a task the consumer keeps and cancels on shutdown;
- fetching: as soon as a record is written, or, for a consumer off the request path
  (`batch_wait_ms`), in batches;
- `after_each` runs after every record, handled or dead-lettered (state that moves with the offset,
  such as the end of a partition's history, must see poison records too);
- rebalances: `on_assigned` runs before any record of the new assignment is handled (recovery
  reads), `on_revoked` before the revoked partitions' final commit;
- membership: `in_group` says whether the group's coordinator confirmed this member recently
  enough that no other member can hold its partitions (a handler about to spend money asks it);
- lag: `end_offset` and `assignment` answer from the real consumer, and None / empty in memory
  (FastStream's test broker has no Kafka consumer), so handlers need not know which they run on;
- tracing: each record is handled in a `<topic> process` span whose parent is the context its
  `traceparent` header carries.

A `Publisher` is a declared FastStream publisher for one topic and message type: AsyncAPI documents
it and FastStream's test broker routes it. Each send is a `<topic> publish` span, and its context
goes in the record's `traceparent` header: one trace follows a request through every service.
In a trace that is not sampled neither span is made (`telemetry.span`); the context still travels.

Trace context is propagated here rather than by FastStream's telemetry middleware, which built
several objects and often an extra span per record, and parented a handler's sends on the upstream
producer instead of the handler's span. A whole service in a dozen lines is the example in
`libs/platform/README.md` (run as written by `tests/platform/test_consumer.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.protocol.commit import OffsetFetchRequest
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaMessage
from google.protobuf.message import Message
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from baton.v1 import dead_letter_pb2
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.kafka import MAX_RECORD_BYTES, RECORD_OVERHEAD_BYTES, consumer_options
from baton_platform.messages import PoisonMessage, decode, encode
from baton_platform.offsets import CommitPacer, OffsetTracker
from baton_platform.telemetry import span

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
_BATCH_FETCH_BYTES = 256 * 1024
_TRACE_CONTEXT = TraceContextTextMapPropagator()  # W3C traceparent / tracestate headers
_TRACE_HEADERS = frozenset(_TRACE_CONTEXT.fields)


def _trace_carrier(headers) -> dict[str, str]:
    """The trace headers of a Kafka record (aiokafka gives (name, bytes) pairs)."""
    return {k: v.decode("latin-1") for k, v in headers or () if k in _TRACE_HEADERS and v is not None}


async def _raw_body(msg: KafkaMessage) -> bytes:
    # FastStream's default decoder first tries JSON on a body without a content type: a wasted
    # parse (and exception) per protobuf record.
    return msg.body


@dataclass(frozen=True)
class Record:
    """Where a handled message came from, and the sends made in handling it that the broker has
    yet to acknowledge (`Publisher.send(..., record=...)`): the record is finished only after them."""

    tp: TopicPartition
    offset: int
    key: bytes
    value: bytes = field(default=b"", compare=False, repr=False)
    acks: list[asyncio.Future] = field(default_factory=list, compare=False, repr=False)


def _described(kind: type[Message]) -> str:
    return f"{kind.DESCRIPTOR.full_name} (protobuf, proto/{kind.DESCRIPTOR.file.name})"


class Publisher:
    """A declared publisher of `kind` messages on one topic."""

    def __init__(self, broker: KafkaBroker, service: str, topic: str, kind: type[Message] | None, tracer: Tracer,
                 description: str = "") -> None:
        self.topic = topic
        what = _described(kind) if kind is not None else "JSON"
        self._out = broker.publisher(topic, title=f"{service}:{topic}", schema=bytes,
                                     description=f"{description} {what}".strip())
        self._tracer = tracer
        self._span_name = f"{topic} publish"
        self._span_attributes = {"messaging.system": "kafka", "messaging.destination.name": topic,
                                 "messaging.operation": "publish"}

    async def send(self, message: Message | bytes, *, key: str | bytes, partition: int | None = None,
                   headers: dict[str, str] | None = None, record: Record | None = None) -> None:
        """Publish, and return once the broker has the message; or, as part of handling a consumed
        `record`, once the producer has queued it: the consumer then finishes the record (lets its
        offset be committed) only after the broker acknowledges it. A handler that waited for each
        acknowledgement would hold up its partition's next record for a broker round trip, and send
        one message per produce request where queued sends share a batch."""
        body = message if isinstance(message, bytes) else encode(message)
        if len(body) > MAX_RECORD_BYTES - RECORD_OVERHEAD_BYTES:
            # The producer would refuse it on every try, and the record being handled would stay
            # unfinished, freezing its partition's commits: it goes to the DLQ instead, saying why.
            raise PoisonMessage(f"a {self.topic} record of {len(body)} bytes would be over the "
                                f"{MAX_RECORD_BYTES}-byte record limit")
        headers = dict(headers) if headers else {}
        with span(self._tracer, self._span_name, kind=SpanKind.PRODUCER, attributes=self._span_attributes):
            _TRACE_CONTEXT.inject(headers)
            ack = await self._out.publish(body, key=key if isinstance(key, bytes) else key.encode(),
                                          partition=partition, headers=headers, no_confirm=record is not None)
        if record is not None and isinstance(ack, asyncio.Future):  # in memory, the send is already done
            ack.add_done_callback(self._report_failure)
            record.acks.append(ack)

    def _report_failure(self, ack: asyncio.Future) -> None:
        # A queued send's failure surfaces nowhere else when its record is never finished (a
        # synthesizer step whose run goes on: the step times out and is sent again).
        if not ack.cancelled() and ack.exception() is not None:
            log.error("a send to %s failed: %r", self.topic, ack.exception())


class DeadLetters:
    """Sends records a service cannot process to baton.dlq, so the consumer goes on and nothing is lost."""

    def __init__(self, broker: KafkaBroker, service: str, tracer: Tracer,
                 on_dead_letter: Callable[[str], None] | None = None) -> None:
        self._out = Publisher(broker, service, topics.DLQ, dead_letter_pb2.DeadLetter, tracer,
                              "Records a service could not process.")
        self._service = service
        self._on_dead_letter = on_dead_letter

    async def send(self, record: Record, reason: str) -> None:
        topic, partition = record.tp.topic, record.tp.partition
        value = record.value
        if len(value) > MAX_RECORD_BYTES - 2 * RECORD_OVERHEAD_BYTES:
            # Too large to wrap: the letter says where the record is, and the topic keeps it until retention.
            reason, value = f"{reason} (the {len(value)}-byte value is not copied)", b""
        letter = dead_letter_pb2.DeadLetter(
            source_topic=topic, partition=partition, offset=record.offset, key=record.key, value=value,
            reason=reason[:2000], service=self._service, failed_unix_ms=int(time.time() * 1000))
        log.warning("dead-lettering %s[%s]@%s: %s", topic, partition, record.offset, reason)
        await self._out.send(letter, key=record.key, headers={topics.DLQ_REASON_HEADER: reason[:500]})
        if self._on_dead_letter is not None:
            self._on_dead_letter(topic)


Hook = Callable[[set[TopicPartition]], Awaitable[None]]


def kafka_record(msg: KafkaMessage) -> ConsumerRecord:
    """The one record under a message (these subscribers never consume in batches)."""
    raw = msg.raw_message
    assert not isinstance(raw, tuple), "a batch subscriber"
    return raw


class Consumer(ConsumerRebalanceListener, Generic[M]):
    """One subscription; see the module's docstring. Made by `Service.consumer`."""

    def __init__(self, broker: KafkaBroker, service: str, kafka: KafkaConfig, dead_letters: DeadLetters, tracer: Tracer,
                 topic: str, kind: type[M], handler: Callable[[M, Record], Awaitable[None]], *, group: str | None = None,
                 tracked: bool = False, keep: bool = False, commit_every_s: float = 0.5,
                 offset_reset: str = "earliest", on_assigned: Hook | None = None, on_revoked: Hook | None = None,
                 on_stop: Callable[[], Awaitable[None]] | None = None,
                 after_each: Callable[[Record], Awaitable[None]] | None = None, batch_wait_ms: int = 0,
                 description: str = "") -> None:
        if tracked and group is None:
            raise ValueError("only a consumer group commits offsets: tracked=True needs a group")
        self.topic, self.kind, self.group, self.tracked, self.keep = topic, kind, group, tracked, keep
        self.tracker = OffsetTracker()
        self._pacer = CommitPacer(self.tracker, interval_s=commit_every_s)
        self._handler = handler
        self._dead_letters = dead_letters
        self._on_assigned, self._on_revoked, self._on_stop = on_assigned, on_revoked, on_stop
        self._after_each = after_each
        self._tracer = tracer
        self._span_name = f"{topic} process"
        self._timers: list[tuple[float, Callable[[], Awaitable[None]]]] = []
        self._awaiting_acks: set[asyncio.Future] = set()
        self._tasks: list[asyncio.Task] = []
        # Cleared while a new assignment's on_assigned runs: the consumer may already be fetching
        # the new partitions, and none of their records may be handled before it returns.
        self._assigned = asyncio.Event()
        self._assigned.set()
        # When the group's coordinator last confirmed this member (a join, or a heartbeat it answered),
        # and for how long such a confirmation holds: see `in_group`.
        self._confirmed_at: float | None = None
        self._confirmation_s = (kafka.session_timeout_ms - kafka.heartbeat_interval_ms) / 1000
        self._heartbeat_s = kafka.heartbeat_interval_ms / 1000
        # Whether the coordinator has loaded the group since this member last lost it: until then its
        # heartbeat answers say nothing (see `_watch_heartbeats`).
        self._group_loaded = False
        options: dict[str, Any] = {"auto_offset_reset": offset_reset}
        if group is not None:
            options = {**consumer_options(kafka), **options, "group_id": group, "listener": self}
        if batch_wait_ms:
            # Off the request path: the broker answers a fetch once it holds a batch or after
            # `batch_wait_ms`, where by default it answers as soon as one record arrives. Under load
            # that is one fetch request per few records, each a socket write here and work for the broker.
            options.update(fetch_min_bytes=_BATCH_FETCH_BYTES, fetch_max_wait_ms=batch_wait_ms)
        self.subscriber = broker.subscriber(
            topic, ack_policy=AckPolicy.MANUAL if tracked else AckPolicy.ACK_FIRST,
            title=f"{topic}:{service}", description=f"{description} {_described(kind)}".strip(),
            decoder=_raw_body, **options)

        async def on_record(body: bytes) -> None:  # `body: bytes` documents the payload
            # The message (partition, offset, key) from FastStream's context, read directly: as an
            # injected parameter it would cost a worker-thread round trip per record. (The broker's
            # context is the application's once one runs it: looked up per record.)
            await self.consume(broker.context.get_local("message"))

        self.subscriber(on_record)
        if tracked:
            self.every(commit_every_s, self.commit)  # the last records before a quiet spell commit too

    # -- what handlers and services call -----------------------------------------------------------

    def finish(self, record: Record) -> None:
        """The record's work is done: its offset may be committed once the broker has acknowledged
        what was sent for it. A send that failed keeps it unfinished (commits stop short of it, and a
        restart hands it over again)."""
        if all(ack.done() and not ack.cancelled() and ack.exception() is None for ack in record.acks):
            self.tracker.finish(record.tp, record.offset)
            return
        acked = asyncio.gather(*record.acks)
        self._awaiting_acks.add(acked)
        acked.add_done_callback(lambda done: self._acked(record, done))

    def _acked(self, record: Record, acked: asyncio.Future) -> None:
        self._awaiting_acks.discard(acked)
        if acked.cancelled() or acked.exception() is not None:
            error = "cancelled" if acked.cancelled() else repr(acked.exception())
            log.error("a send for %s@%s failed (%s): the record stays uncommitted", record.tp, record.offset, error)
            return
        self.tracker.finish(record.tp, record.offset)

    async def commit(self, *, soon: bool = False) -> None:
        """Commit every partition as far as its oldest unfinished record: now, or with `soon` within
        the consumer's commit interval (a busy consumer does not commit per record)."""
        await self._pacer.maybe_commit(self._kafka_consumer(), force=not soon)

    def every(self, seconds: float, tick: Callable[[], Awaitable[None]]) -> None:
        """Run `tick` every `seconds` from the service's start to its stop (a failure is logged)."""
        self._timers.append((seconds, tick))

    def end_offset(self, tp: TopicPartition) -> int | None:
        """The partition's end offset as last fetched, or None when unknown (or in memory)."""
        consumer = self._kafka_consumer()
        return consumer.highwater(tp) if consumer is not None else None

    async def end_offsets(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        """The partitions' end offsets, asked of the broker now; empty in memory."""
        consumer = self._kafka_consumer()
        return await consumer.end_offsets(list(tps)) if consumer is not None else {}

    def assignment(self) -> set[TopicPartition]:
        consumer = self._kafka_consumer()
        return set(consumer.assignment()) if consumer is not None else set()

    @property
    def on_kafka(self) -> bool:
        """Whether this subscription reads a running broker (not the in-memory test broker)."""
        return self._kafka_consumer() is not None

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of `tp`, asked of the broker; None when none is (or in memory)."""
        consumer = self._kafka_consumer()
        return await consumer.committed(tp) if consumer is not None else None

    def in_group(self) -> bool:
        """Whether the group's coordinator confirmed this member less than a session timeout (less one
        heartbeat interval) ago, and nothing since has said the confirmation may no longer hold. Until
        then no other member can hold this one's partitions: a rebalance waits for this member to give
        them up. Once it lapses (the broker away, or this member dropped from the group and not told
        yet), another member may already be handling the same records. A lost coordinator voids it at
        once: a broker that restarts may load the group without this member and hand its partitions
        to the first member that joins, long before this one's session would have timed out.
        Always True in memory and for a consumer without a group."""
        if self.group is None or self._kafka_consumer() is None:
            return True
        return self._confirmed_at is not None and time.monotonic() - self._confirmed_at < self._confirmation_s

    def _watch_heartbeats(self, consumer: AIOKafkaConsumer) -> None:
        """Note each heartbeat the coordinator answers as this member's, and each sign that this
        member may have left the group. aiokafka keeps both to itself, so its coordinator's methods are
        wrapped, once: the heartbeat call (GroupCoordinator._do_heartbeat: True when answered, also
        while the group rebalances, when this member still holds its partitions), and the two it calls
        when the coordinator is lost (coordinator_dead) or no longer knows this member or its
        generation (reset_generation)."""
        coordinator = getattr(consumer, "_coordinator", None)
        beat = getattr(coordinator, "_do_heartbeat", None)
        if coordinator is None or beat is None or getattr(beat, "baton_watched", False):
            return

        async def watched() -> bool:
            # A coordinator that is still loading the group answers every heartbeat "no error" without
            # looking at it (Kafka does so on purpose), however long ago it dropped this member. So once
            # the coordinator was lost, a heartbeat confirms only if sent after the coordinator answered
            # an offset fetch for the group, which it does only once the group is loaded.
            loaded = self._group_loaded or await self._coordinator_has_loaded(consumer)
            answered = await beat()
            if answered and loaded:
                self._group_loaded = True
                self._confirmed_at = time.monotonic()
            return answered

        watched.baton_watched = True  # type: ignore[attr-defined]
        coordinator._do_heartbeat = watched
        for name in ("coordinator_dead", "reset_generation"):
            setattr(coordinator, name, self._voiding(getattr(coordinator, name)))

    def _voiding(self, method: Callable[[], None]) -> Callable[[], None]:
        """`method`, which first voids this member's confirmation."""
        def voided() -> None:
            self._confirmed_at = None
            self._group_loaded = False
            method()
        return voided

    async def _coordinator_has_loaded(self, consumer: AIOKafkaConsumer) -> bool:
        """Whether the coordinator answers an offset fetch for one of this member's partitions, with no
        error, within a heartbeat interval: it does only once it has loaded the group. The fetch is sent
        here rather than through `AIOKafkaConsumer.committed`, which ignores the response's group-level
        error (where a broker says it is still loading) and reads it as "nothing committed". True with
        no partitions (no record to fence)."""
        assigned = sorted(consumer.assignment())
        if not assigned:
            return True
        tp = assigned[0]
        request = OffsetFetchRequest(self.group, [(tp.topic, [tp.partition])])
        try:
            response = await asyncio.wait_for(consumer._coordinator._send_req(request), timeout=self._heartbeat_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - away, or no answer in time: not confirmed this time
            return False
        errors = [getattr(response, "error_code", 0)]  # group-level, from version 2 on
        errors += [error for _, partitions in response.topics for *_, error in partitions]
        return not any(errors)

    def partition_count(self) -> int:
        consumer = self._kafka_consumer()
        return len(consumer.partitions_for_topic(self.topic) or ()) if consumer is not None else 0

    # -- lifecycle (Service runs these) ------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._repeat(s, t)) for s, t in self._timers]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._on_stop is not None:
            await self._on_stop()
        if self.tracked:
            await self._acks_then_commit()

    async def _repeat(self, seconds: float, tick: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await tick()
            except Exception:
                log.exception("periodic task of the %s consumer failed", self.topic)

    # -- records -----------------------------------------------------------------------------------

    async def consume(self, msg: KafkaMessage) -> None:
        """Handle one record (the subscriber calls this for each)."""
        raw = kafka_record(msg)
        record = Record(TopicPartition(raw.topic, raw.partition), raw.offset, raw.key or b"", raw.value or b"")
        if self.tracked:
            await self._assigned.wait()
            self.tracker.begin(record.tp, record.offset)
        with span(
                self._tracer, self._span_name, context=_TRACE_CONTEXT.extract(_trace_carrier(raw.headers)),
                kind=SpanKind.CONSUMER,
                attributes={"messaging.system": "kafka", "messaging.destination.name": raw.topic,
                            "messaging.operation": "process", "messaging.destination.partition.id": str(raw.partition),
                            "messaging.kafka.offset": raw.offset}):
            try:
                await self._handler(decode(self.kind, msg.body), record)
            except PoisonMessage as e:
                await self._dead_letters.send(record, str(e))
                self.finish(record)
            else:
                if not self.keep:
                    self.finish(record)
        if self._after_each is not None:
            await self._after_each(record)
        if self.tracked:
            await self.commit(soon=True)

    async def _acks_then_commit(self) -> None:
        """The final commit (on stop or revocation), after the acknowledgements of what the last
        records sent: otherwise it stops short of them, and their next owner handles them again."""
        if self._awaiting_acks:
            await asyncio.wait(list(self._awaiting_acks), timeout=5)
        await self.commit()

    def _kafka_consumer(self) -> AIOKafkaConsumer | None:
        consumer = getattr(self.subscriber, "consumer", None)
        return consumer if isinstance(consumer, AIOKafkaConsumer) else None

    # -- rebalances (aiokafka awaits these) --------------------------------------------------------

    async def on_partitions_revoked(self, revoked) -> None:
        revoked = set(revoked)
        if self._on_revoked is not None:
            await self._on_revoked(revoked)
        if self.tracked:
            await self._acks_then_commit()
            self.tracker.forget(revoked)

    async def on_partitions_assigned(self, assigned) -> None:
        # The group's join and sync just succeeded: this member is confirmed as of now (a coordinator
        # answers a join only once it has loaded the group).
        self._confirmed_at = time.monotonic()
        self._group_loaded = True
        consumer = self._kafka_consumer()
        if consumer is not None:
            self._watch_heartbeats(consumer)
        if self._on_assigned is None:
            return
        self._assigned.clear()
        try:
            await self._on_assigned(set(assigned))
        finally:
            self._assigned.set()
