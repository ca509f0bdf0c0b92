"""Kafka wiring of the reward logger: responses and feedback in, Parquet out, offsets after the file.

Each topic has its own recorder: records are buffered per partition, written as one file per
contiguous run of offsets, and only then committed. Progress responses are not episodes and pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import pyarrow as pa
from aiokafka import TopicPartition
from google.protobuf.message import Message
from opentelemetry import trace

from baton.v1 import feedback_pb2, responses_pb2, rewards_pb2
from baton_platform import consumer, topics
from baton_platform.config import RewardLoggerConfig
from baton_platform.kafka import client_options, topic_incarnation
from baton_platform.messages import PoisonMessage
from baton_platform.service import Service
from baton_reward_logger.episodes import ARROW_REFUSALS, DatasetWriter, Record, RowsRefused
from baton_reward_logger.metrics import DatasetMetrics

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

# Records are written in files every flush_interval_s: waiting up to this long (and at most half that
# interval) for a fuller fetch costs nothing, and saves the broker and this service a fetch request
# per few records.
_FETCH_WAIT_MS = 200

# Turns a record's message into a dataset row (and its timestamp), None to skip it, or raises PoisonMessage.
RowMaker = Callable[[Message, int, int], "tuple[dict, int] | None"]


# While the dataset cannot be written, a partition holds at most this many flushes' worth of rows;
# then its consumer waits, and the rest stays on the broker, uncommitted.
HELD_FLUSHES = 20
RETENTION_CHECK_S = 3600.0  # how often the datasets' retention is applied (reward_logger.retention_days)


class TopicRecorder:
    """Records one topic into the episode dataset: each record becomes a row, and its offset commits
    only once the file holding the row is durable.

    ``after_write``, if given, runs on each durable run of records before their offsets commit:
    a crash in between repeats it with the file's rewrite, never skips it.

    A write that fails (a full disk, an unreachable store) loses nothing: its rows stay buffered and
    are written again at the next flush, the service reports not-ready and `baton_dataset_unwritable`
    says so, and, past HELD_FLUSHES flushes' worth of rows, the partition stops being read until a
    write succeeds.

    Before its first file on Kafka it asks the cluster which incarnation of the topic it reads (the
    cluster's and the topic's ids), which file names hold; until it knows, writes fail and are retried.
    Every `compact_interval_s` it merges the small files of the partitions it owns, below their
    committed offsets (`DatasetWriter.compact`): a partition has one owner in the group, so no two
    replicas merge the same files, and only the owner's committed offset says which files a re-read
    can no longer replace."""

    def __init__(self, service: Service, settings: RewardLoggerConfig, topic: str, kind: type[Message],
                 writer: DatasetWriter, make_row: RowMaker, metrics: DatasetMetrics,
                 after_write: Callable[[list[Record]], Awaitable[None]] | None = None,
                 blocks: Callable[[Message], bool] = lambda message: False) -> None:
        self.after_write = after_write
        # Whether making a message's row may block (grading in a child process): only those rows are
        # made in a thread, whose round trip costs more than making any other row on the loop.
        self._blocks = blocks
        self.topic = topic
        self.writer = writer
        self.schema = writer.schema
        self._row_type = pa.struct(list(writer.schema))  # the schema's check for one row, 9x cheaper than a table
        self._dead_letters = service.dead_letters
        self.make_row = make_row
        self._flush_every = settings.flush_every
        self._interval = settings.flush_interval_s
        # Each row with the record it was made from (for the dead-letter topic, should the schema refuse it).
        self._buffers: dict[TopicPartition, list[tuple[Record, consumer.Record]]] = {}
        self._since: dict[TopicPartition, float] = {}
        # Bumped when a partition is revoked: a record still being graded then is dropped, since
        # the partition's next owner (maybe this replica again) reads it again from the last commit.
        self._epochs: dict[TopicPartition, int] = {}
        self._lock = asyncio.Lock()
        self._written = metrics.written.labels(topic)
        self._failures = metrics.failures.labels(topic)
        self._unwritable = metrics.unwritable.labels(topic)
        self.error: str | None = None  # why the last write failed, until one succeeds
        self.consumer = service.consumer(topic, kind, self.handle, group=topics.GROUP_REWARD_LOGGER, tracked=True,
                                         keep=True, on_revoked=self.revoked, on_stop=lambda: self.flush_due(force=True),
                                         batch_wait_ms=max(1, min(_FETCH_WAIT_MS, int(self._interval * 500))),
                                         description="Episodes and ratings to write to the dataset.")
        self.consumer.every(min(0.5, self._interval), self.flush_due)
        self._kafka = service.kafka
        self._compact_bytes = int(settings.compact_target_mb * 1_000_000)
        if settings.compact_interval_s is not None:
            self.consumer.every(settings.compact_interval_s, self.compact)
        if settings.retention_days is not None:
            self.consumer.every(RETENTION_CHECK_S, lambda: self.expire(settings.retention_days))
        self.tracker = self.consumer.tracker

    async def handle(self, message: Message, record: consumer.Record) -> None:
        tp = record.tp
        epoch = self._epochs.get(tp, 0)
        try:
            if self._blocks(message):  # grading runs in a child process with a time limit: off the loop
                made = await asyncio.to_thread(self.make_row, message, tp.partition, record.offset)
            else:
                made = self.make_row(message, tp.partition, record.offset)
        except PoisonMessage:
            raise
        except Exception as e:  # noqa: BLE001 - a record nothing can process must not hold its partition
            log.exception("cannot process %s[%s]@%s", tp.topic, tp.partition, record.offset)
            raise PoisonMessage(f"unprocessable: {type(e).__name__}: {e}") from None
        if made is None:
            self.consumer.finish(record)
            return
        row, stamp = made
        while self.error is not None and len(self._buffers.get(tp, ())) >= HELD_FLUSHES * self._flush_every:
            await asyncio.sleep(self._interval)  # the dataset cannot take rows: stop reading more
        async with self._lock:
            if self._epochs.get(tp, 0) != epoch:
                return  # revoked while grading: written by whoever reads it next, never twice
            self._buffers.setdefault(tp, []).append((Record(tp.partition, record.offset, row, stamp), record))
            self._since.setdefault(tp, time.monotonic())
            if len(self._buffers[tp]) >= self._flush_every:
                await self._flush(tp)

    async def _write(self, partition: int, buffered: list[tuple[Record, consumer.Record]]) -> list[Record]:
        """Write the buffered rows as one file; returns those written. The schema is checked once, as
        the file's table is built (a check per row cost the service a fifth of its CPU), and row by
        row only when the file is refused."""
        records = [r for r, _ in buffered]
        await self._identify()
        try:
            await asyncio.to_thread(self.writer.write, partition, records)
            return records
        except RowsRefused:
            records = await self._refuse_unfit(buffered)
        if records:
            await asyncio.to_thread(self.writer.write, partition, records)
        return records

    async def _refuse_unfit(self, buffered: list[tuple[Record, consumer.Record]]) -> list[Record]:
        """The buffered rows that fit the dataset's schema, after a file of them all was refused. A row
        that does not fit would fail its whole file at every flush, and the partition would never
        commit again: it goes to the dead-letter topic, alone."""
        fit = []
        for r, source in buffered:
            try:
                pa.array([r.row], type=self._row_type)
            except ARROW_REFUSALS as e:
                await self._dead_letters.send(source, f"unprocessable: the dataset's schema refuses its row: {e}")
                self.tracker.finish(source.tp, source.offset)
            else:
                fit.append(r)
        return fit

    async def _flush(self, tp: TopicPartition) -> None:
        buffered = self._buffers.pop(tp, [])
        since = self._since.pop(tp, None)
        try:
            records = await self._write(tp.partition, buffered) if buffered else []
        except Exception as e:  # noqa: BLE001 - a full disk or an unreachable store: keep the rows, try again
            self._buffers[tp] = buffered
            self._since[tp] = since if since is not None else time.monotonic()
            self._failures.inc()
            self._unwritable.set(1)
            if self.error is None:
                log.error("cannot write %s rows to the dataset (%s: %s); keeping them and retrying",
                          self.topic, type(e).__name__, e)
            self.error = f"{type(e).__name__}: {e}"
            return
        if self.error is not None and buffered:
            log.info("the %s dataset is writable again", self.topic)
            self.error = None
            self._unwritable.set(0)
        if records:
            self._written.inc(len(records))
            if self.after_write is not None:
                await self.after_write(records)
            for r in records:
                self.tracker.finish(tp, r.offset)
        await self.consumer.commit()

    async def flush_due(self, force: bool = False) -> None:
        async with self._lock:
            now = time.monotonic()
            for tp in [tp for tp, t in self._since.items() if force or now - t >= self._interval]:
                await self._flush(tp)
            await self.consumer.commit()

    async def _identify(self) -> None:
        """Name files by the topic's incarnation, asked of the cluster once (on Kafka; the in-memory
        test broker has none, and names hold none)."""
        if self.writer.incarnation is None and self.consumer.on_kafka:
            identity = await topic_incarnation(client_options(self._kafka), self.topic)
            self.writer.identify(identity)
            log.info("%s is incarnation %s of the topic; its files are named by it", self.topic, identity)

    async def compact(self) -> None:
        await self._identify()
        if self.writer.incarnation is None:
            return  # in memory: no partition is owned, nothing to merge
        committed = {}
        for tp in self.consumer.assignment():
            offset = await self.consumer.committed(tp)
            if offset is not None:
                committed[tp.partition] = offset
        if committed:
            made = await asyncio.to_thread(self.writer.compact, committed, self._compact_bytes)
            if made:
                log.info("merged small %s files into %d file(s)", self.topic, len(made))

    async def expire(self, keep_days: int) -> None:
        removed = await asyncio.to_thread(self.writer.expire, keep_days)
        if removed:
            log.info("removed %d day(s) of %s rows past the retention of %d days", len(removed), self.topic, keep_days)

    async def ready(self) -> str | None:
        """Not ready while the dataset cannot be written (the rows wait, uncommitted)."""
        return None if self.error is None else f"cannot write the {self.topic} dataset: {self.error}"

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        # Write what we hold before the partition moves, so the new owner starts after it. Rows that
        # cannot be written now are dropped here: uncommitted, the new owner reads them again.
        async with self._lock:
            for tp in revoked:
                self._epochs[tp] = self._epochs.get(tp, 0) + 1
                if tp in self._buffers:
                    await self._flush(tp)
                self._buffers.pop(tp, None)
                self._since.pop(tp, None)
                self.writer.forget(tp.partition)  # another replica may write it next


def response_row_maker(scheme, cost_weight: float, evals=None, grade_fn=None, outcomes: Counter | None = None
                       ) -> RowMaker:
    """Episodes graded against the operator's evaluation sets (`evals`), with `grade_fn` (by default
    in process; the service passes an IsolatedGrader's, which bounds each grade's time)."""
    from baton_graders import grade
    from baton_platform.dataset import episode_row
    from baton_reward_logger.rewards import score

    def make(response: responses_pb2.Response, partition: int, offset: int):
        if not response.request_id:
            raise PoisonMessage("Response without request_id")
        if response.WhichOneof("outcome") not in ("answer", "error"):
            return None  # progress and answer deltas for streaming clients: only final responses are episodes
        stamp = response.completed_unix_ms or response.episode.request.created_unix_ms
        reward = score(response, scheme, cost_weight, evals, grade_fn or grade)
        outcome = _outcome(reward)
        if outcomes is not None:
            outcomes.labels(outcome).inc()
        if reward.quality is not None:
            # GenAI semantic conventions (v1.41.0): the grade as an event on the span handling the response.
            trace.get_current_span().add_event("gen_ai.evaluation.result", {
                "gen_ai.evaluation.name": reward.grader or "", "gen_ai.evaluation.score.value": reward.quality,
                "gen_ai.evaluation.score.label": "pass" if reward.quality >= 1 else "fail",
                "baton.request_id": response.request_id})
        graded = "" if reward.quality is None else f", quality {reward.quality:g}"
        if reward.reward is not None:
            graded += f", reward {reward.reward:.4f}"
        log.info("episode %s: %s%s", response.request_id, outcome.replace("_", " "), graded)
        return episode_row(response, reward, partition, offset), stamp

    return make


def reward_publisher(service: Service) -> Callable[[list[Record]], Awaitable[None]]:
    """Publishes each graded episode of a written run to baton.rewards, for the routers' online
    learning. A router applies an episode once, so the repeat after a crash is harmless."""
    rewards = service.publisher(topics.REWARDS, rewards_pb2.Reward, "Graded episodes, for online learning.")

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
            sends.append(rewards.send(reward, key=row["request_id"]))
        await asyncio.gather(*sends)

    return publish


def _outcome(reward) -> str:
    if reward.quality is not None:
        return "graded"
    if reward.grader is not None:
        return "grading_failed"
    return "unknown_item" if reward.detail.startswith("ungraded") else "no_item"


def feedback_row_maker() -> RowMaker:
    from baton_platform.dataset import feedback_row

    def make(fb: feedback_pb2.Feedback, partition: int, offset: int):
        if not fb.response_id:
            raise PoisonMessage("Feedback without response_id")
        return feedback_row(fb, partition, offset), fb.created_unix_ms or int(time.time() * 1000)

    return make
