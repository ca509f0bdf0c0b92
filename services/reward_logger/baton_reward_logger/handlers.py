"""Kafka wiring of the reward logger: baton.responses in, Parquet episodes out, offsets after the file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiokafka import ConsumerRebalanceListener, TopicPartition
from baton.v1 import responses_pb2
from faststream import AckPolicy
from faststream.kafka import KafkaMessage
from prometheus_client import Counter

from baton_platform import topics
from baton_platform.kafka import consumer_options
from baton_platform.messages import PoisonMessage, decode
from baton_platform.offsets import OffsetTracker
from baton_platform.service import Service

from baton_reward_logger.episodes import EpisodeWriter, Record

log = logging.getLogger(__name__)


class RewardLoggerWiring(ConsumerRebalanceListener):
    def __init__(self, service: Service, writer: EpisodeWriter) -> None:
        self.service = service
        self.writer = writer
        cfg = service.config.reward_logger
        self._flush_every = cfg.flush_every
        self._interval = cfg.flush_interval_s
        self._buffers: dict[TopicPartition, list[Record]] = {}
        self._since: dict[TopicPartition, float] = {}
        self.tracker = OffsetTracker()
        self._consumer = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._written = Counter("baton_episodes_written", "Episodes written to the dataset", registry=service.registry)

    def register(self) -> None:
        @self.service.broker.subscriber(topics.RESPONSES, group_id=topics.GROUP_REWARD_LOGGER, listener=self,
                                        ack_policy=AckPolicy.MANUAL, **consumer_options(self.service.config.kafka))
        async def on_response(msg: KafkaMessage) -> None:
            await self.handle(msg)

    async def handle(self, msg: KafkaMessage) -> None:
        raw = msg.raw_message
        tp = TopicPartition(raw.topic, raw.partition)
        self._consumer = msg.consumer
        self.tracker.begin(tp, raw.offset)
        try:
            response = decode(responses_pb2.Response, msg.body)
            if not response.request_id:
                raise PoisonMessage("Response without request_id")
        except PoisonMessage as e:
            await self.service.dead_letters.send(msg, str(e))
            self.tracker.finish(tp, raw.offset)
            return
        if response.WhichOneof("outcome") == "progress":
            self.tracker.finish(tp, raw.offset)  # not an episode: only final responses are
            return
        async with self._lock:
            self._buffers.setdefault(tp, []).append(Record(raw.partition, raw.offset, response))
            self._since.setdefault(tp, time.monotonic())
            if len(self._buffers[tp]) >= self._flush_every:
                await self._flush(tp)

    async def _flush(self, tp: TopicPartition) -> None:
        records = self._buffers.pop(tp, [])
        self._since.pop(tp, None)
        if records:
            # Blocking file I/O off the event loop, so heartbeats and other partitions go on.
            await asyncio.to_thread(self.writer.write, tp.partition, records)
            self._written.inc(len(records))
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
                if tp in self._buffers:
                    await self._flush(tp)
        self.tracker.forget(revoked)

    async def on_partitions_assigned(self, assigned) -> None:
        return None

    async def start_timer(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(min(0.5, self._interval))
                try:
                    await self.flush_due()
                except Exception:  # noqa: BLE001 - keep flushing; the records stay buffered and uncommitted
                    log.exception("episode flush failed")

        self._task = asyncio.create_task(loop())

    async def stop_timer(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush_due(force=True)
