"""Kafka wiring of the reward logger: responses and feedback in, Parquet out, offsets after the file.

Each topic has its own sink: records are buffered per partition, written as one file per
contiguous run of offsets, and only then committed. Progress responses are not episodes and pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

import pyarrow as pa
from aiokafka import ConsumerRebalanceListener, TopicPartition
from baton.v1 import feedback_pb2, responses_pb2, rewards_pb2
from faststream import AckPolicy
from faststream.kafka import KafkaMessage
from prometheus_client import Counter

from baton_platform import topics
from baton_platform.kafka import consumer_options
from baton_platform.messages import PoisonMessage, decode, encode
from baton_platform.offsets import OffsetTracker
from baton_platform.service import Service

from baton_reward_logger.episodes import DatasetWriter, Record

log = logging.getLogger(__name__)

# Turns a record's value into a dataset row (and its timestamp), None to skip it, or raises PoisonMessage.
RowMaker = Callable[[bytes, int, int], "tuple[dict, int] | None"]


class Sink(ConsumerRebalanceListener):
    """``after_write``, if given, runs on each durable run of records before their offsets commit:
    a crash in between repeats it with the file's rewrite, never skips it."""

    def __init__(self, service: Service, topic: str, writer: DatasetWriter, make_row: RowMaker,
                 written: Counter, after_write: Callable[[list[Record]], Awaitable[None]] | None = None) -> None:
        self.service = service
        self.after_write = after_write
        self.topic = topic
        self.writer = writer
        self.schema = writer.schema
        self.make_row = make_row
        cfg = service.config.reward_logger
        self._flush_every = cfg.flush_every
        self._interval = cfg.flush_interval_s
        self._buffers: dict[TopicPartition, list[Record]] = {}
        self._since: dict[TopicPartition, float] = {}
        # Bumped when a partition is revoked: a record still being graded then is dropped, since
        # the partition's next owner (maybe this replica again) reads it again from the last commit.
        self._epochs: dict[TopicPartition, int] = {}
        self.tracker = OffsetTracker()
        self._consumer = None
        self._lock = asyncio.Lock()
        self._written = written.labels(topic)

    def register(self) -> None:
        sub = self.service.broker.subscriber(self.topic, group_id=topics.GROUP_REWARD_LOGGER, listener=self,
                                             ack_policy=AckPolicy.MANUAL,
                                             **consumer_options(self.service.config.kafka))
        sub(self.handle)

    async def handle(self, msg: KafkaMessage) -> None:
        raw = msg.raw_message
        tp = TopicPartition(raw.topic, raw.partition)
        self._consumer = getattr(msg, "consumer", None)
        self.tracker.begin(tp, raw.offset)
        epoch = self._epochs.get(tp, 0)
        try:
            # Grading runs in a child process with a time limit: wait for it off the event loop.
            made = await asyncio.to_thread(self._checked_row, msg.body, raw.partition, raw.offset)
        except PoisonMessage as e:
            await self.service.dead_letters.send(msg, str(e))
            made = None
        except Exception as e:  # noqa: BLE001 - a record nothing can process must not hold its partition
            log.exception("cannot process %s[%s]@%s", raw.topic, raw.partition, raw.offset)
            await self.service.dead_letters.send(msg, f"unprocessable: {type(e).__name__}: {e}")
            made = None
        if made is None:
            self.tracker.finish(tp, raw.offset)
            return
        row, stamp = made
        async with self._lock:
            if self._epochs.get(tp, 0) != epoch:
                return  # revoked while grading: written by whoever reads it next, never twice
            self._buffers.setdefault(tp, []).append(Record(raw.partition, raw.offset, row, stamp))
            self._since.setdefault(tp, time.monotonic())
            if len(self._buffers[tp]) >= self._flush_every:
                await self._flush(tp)

    def _checked_row(self, value: bytes, partition: int, offset: int):
        made = self.make_row(value, partition, offset)
        if made is not None:
            # A row the dataset's schema refuses would fail its whole file at every flush, and the
            # partition would never commit again: refuse it here, alone, instead.
            pa.Table.from_pylist([made[0]], schema=self.schema)
        return made

    async def _flush(self, tp: TopicPartition) -> None:
        records = self._buffers.pop(tp, [])
        self._since.pop(tp, None)
        if records:
            await asyncio.to_thread(self.writer.write, tp.partition, records)
            self._written.inc(len(records))
            if self.after_write is not None:
                await self.after_write(records)
            for r in records:
                self.tracker.finish(tp, r.offset)
        if self._consumer is not None:
            await self.tracker.commit(self._consumer)

    async def flush_due(self, force: bool = False) -> None:
        async with self._lock:
            now = time.monotonic()
            for tp in [tp for tp, t in self._since.items() if force or now - t >= self._interval]:
                await self._flush(tp)
            if self._consumer is not None:
                await self.tracker.commit(self._consumer)

    async def on_partitions_revoked(self, revoked) -> None:
        # Write what we hold before the partition moves, so the new owner starts after it.
        async with self._lock:
            for tp in revoked:
                self._epochs[tp] = self._epochs.get(tp, 0) + 1
                if tp in self._buffers:
                    await self._flush(tp)
            self.tracker.forget(revoked)

    async def on_partitions_assigned(self, assigned) -> None:
        return None


class Flusher:
    """Writes every sink's due buffers on a timer, and everything at shutdown."""

    def __init__(self, sinks: list[Sink], interval_s: float) -> None:
        self.sinks = sinks
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(min(0.5, self.interval_s))
                for sink in self.sinks:
                    try:
                        await sink.flush_due()
                    except Exception:  # noqa: BLE001 - keep flushing; the records stay buffered and uncommitted
                        log.exception("flush of %s failed", sink.topic)

        self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sink in self.sinks:
            await sink.flush_due(force=True)


def response_row_maker(scheme, cost_weight: float, evals=None, grade_fn=None, outcomes: Counter | None = None
                       ) -> RowMaker:
    """Episodes graded against the operator's evaluation sets (`evals`), with `grade_fn` (by default
    in process; the service passes an IsolatedGrader's, which bounds each grade's time)."""
    from baton_graders import grade
    from baton_reward_logger.episodes import episode_row
    from baton_reward_logger.rewards import score

    def make(value: bytes, partition: int, offset: int):
        response = decode(responses_pb2.Response, value)
        if not response.request_id:
            raise PoisonMessage("Response without request_id")
        if response.WhichOneof("outcome") not in ("answer", "error"):
            return None  # progress and answer deltas for streaming clients: only final responses are episodes
        stamp = response.completed_unix_ms or response.episode.request.created_unix_ms
        reward = score(response, scheme, cost_weight, evals, grade_fn or grade)
        if outcomes is not None:
            outcomes.labels(_outcome(reward)).inc()
        return episode_row(response, reward, partition, offset), stamp

    return make


def reward_publisher(service: Service) -> Callable[[list[Record]], Awaitable[None]]:
    """Publishes each graded episode of a written run to baton.rewards, for the routers' online
    learning. A router applies an episode once, so the repeat after a crash is harmless."""

    async def publish(records: list[Record]) -> None:
        sends = []
        for r in records:
            row = r.row
            if row["quality"] is None or not row["plan_action"]:
                continue
            reward = rewards_pb2.Reward(
                request_id=row["request_id"], action=row["plan_action"], policy_version=row["plan_policy_version"],
                query=row["policy_query"], eval_name=json.loads(row["metadata_json"]).get("eval_name", ""),
                quality=row["quality"], cost_usd=row["cost_usd"], completed_unix_ms=row["completed_unix_ms"])
            sends.append(service.broker.publish(encode(reward), topics.REWARDS, key=row["request_id"].encode()))
        await asyncio.gather(*sends)

    return publish


def _outcome(reward) -> str:
    if reward.quality is not None:
        return "graded"
    if reward.grader is not None:
        return "grading_failed"
    return "unknown_item" if reward.detail.startswith("ungraded") else "no_item"


def feedback_row_maker() -> RowMaker:
    from baton_reward_logger.episodes import feedback_row

    def make(value: bytes, partition: int, offset: int):
        fb = decode(feedback_pb2.Feedback, value)
        if not fb.response_id:
            raise PoisonMessage("Feedback without response_id")
        return feedback_row(fb, partition, offset), fb.created_unix_ms or int(time.time() * 1000)

    return make
