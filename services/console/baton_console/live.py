"""Live traffic: the console follows baton.responses with its own consumer group and holds the
episodes the reward logger has not yet written to the dataset, so a page shows a request seconds
after it was answered (ungraded until its row is read from the dataset, which then replaces it).

Each console replica reads every partition in a group of its own (`baton-console-<host>`), from the
end of each partition, and commits nothing: what came before it started is in the dataset. A record
is decoded as the Response contract and made into a row as the reward logger makes it; one that does
not decode is counted and skipped (the reward logger dead-letters it, this reader only looks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from baton.v1 import responses_pb2
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.dataset import Reward, episode_row
from baton_platform.kafka import client_options
from baton_platform.messages import PoisonMessage, decode

log = logging.getLogger(__name__)

LIVE = Reward(None, None, None, None, "not graded yet: followed live from baton.responses")
RETRY_S = 5.0  # between attempts to reach the brokers


@dataclass
class LiveEpisodes:
    """The newest `most` final responses read from baton.responses, as dataset rows (`columns` of
    them), that the dataset did not hold when it was last read."""

    most: int
    columns: list[str]
    rows: dict[str, dict] = field(default_factory=dict)  # by request id, oldest first
    skipped: int = 0  # records that are not a Response
    status: str = "not started"

    def add(self, raw: bytes, partition: int, offset: int) -> None:
        try:
            response = decode(responses_pb2.Response, raw)
        except PoisonMessage:
            self.skipped += 1
            return
        if not response.request_id or response.WhichOneof("outcome") not in ("answer", "error"):
            return  # progress and deltas for streaming clients are not episodes
        row = episode_row(response, LIVE, partition, offset)
        self.rows.pop(response.request_id, None)
        self.rows[response.request_id] = {k: row[k] for k in self.columns}
        while len(self.rows) > self.most:
            del self.rows[next(iter(self.rows))]

    def written(self, request_ids: Iterable[str]) -> None:
        """Forget the episodes the dataset now holds: its rows are graded."""
        for request_id in request_ids:
            self.rows.pop(request_id, None)

    def pending(self) -> list[dict]:
        return sorted(self.rows.values(), key=lambda r: r["completed_unix_ms"] or 0)


class Follower(ConsumerRebalanceListener):
    """Reads baton.responses into a LiveEpisodes until stopped; keeps trying while the brokers
    cannot be reached (the pages go on showing the dataset)."""

    def __init__(self, kafka: KafkaConfig, live: LiveEpisodes) -> None:
        self.kafka = kafka
        self.live = live
        self.group = f"{topics.GROUP_CONSOLE}-{socket.gethostname()}"
        self._task: asyncio.Task | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            consumer = self._consumer = AIOKafkaConsumer(group_id=self.group, enable_auto_commit=False,
                                                         auto_offset_reset="latest", **client_options(self.kafka))
            try:
                await consumer.start()
                consumer.subscribe([topics.RESPONSES], listener=self)
                self.live.status = f"joining group {self.group}"
                await self._read(consumer)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any broker failure: say so, try again
                self.live.status = f"cannot read {topics.RESPONSES}: {type(e).__name__}"
                log.warning("console: %s; trying again in %.0f s", self.live.status, RETRY_S)
            finally:
                await consumer.stop()
            await asyncio.sleep(RETRY_S)

    async def on_partitions_revoked(self, revoked) -> None:
        pass

    async def on_partitions_assigned(self, assigned) -> None:
        """Start each partition at its end as of now: what came before is in the dataset."""
        if self._consumer is None or not assigned:
            return
        ends = await self._consumer.end_offsets(list(assigned))
        for tp, end in ends.items():
            self._consumer.seek(tp, end)
        self.live.status = f"following {topics.RESPONSES} ({len(assigned)} partitions)"

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=1000, max_records=500)
            for records in batch.values():
                for record in records:
                    self.live.add(record.value, record.partition, record.offset)
