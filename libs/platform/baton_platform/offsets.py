"""Offset commits that never pass unfinished work.

Consumers that finish records out of order (concurrent calls, workflows spanning many events, buffered
writes) mark each record begun and finished; the committable offset of a partition is its oldest
unfinished record, or one past the newest record seen when all are finished. After a crash the
partition is re-read from there, so no record whose work was not durable is ever skipped.
"""

from __future__ import annotations

import heapq
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)


class OffsetTracker:
    def __init__(self) -> None:
        self._pending: dict[TopicPartition, set[int]] = {}
        self._heaps: dict[TopicPartition, list[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def begin(self, tp: TopicPartition, offset: int) -> None:
        self._pending.setdefault(tp, set()).add(offset)
        heapq.heappush(self._heaps.setdefault(tp, []), offset)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def finish(self, tp: TopicPartition, offset: int) -> None:
        pending = self._pending.get(tp)
        if pending is not None:
            pending.discard(offset)

    def holds(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the record is begun and not finished (False once its partition is forgotten)."""
        return offset in self._pending.get(tp, ())

    def pending(self, tp: TopicPartition) -> int:
        return len(self._pending.get(tp, ()))

    def committable(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for tp, nxt in self._next.items():
            heap, pending = self._heaps[tp], self._pending[tp]
            while heap and heap[0] not in pending:
                heapq.heappop(heap)
            out[tp] = heap[0] if heap else nxt
        return out

    def forget(self, tps) -> None:
        """Drop partitions this consumer no longer owns (their new owner resumes from the commit)."""
        for tp in tps:
            for d in (self._pending, self._heaps, self._next, self._committed):
                d.pop(tp, None)

    async def commit(self, consumer) -> None:
        """Commit every partition whose committable offset moved."""
        offsets = {tp: o for tp, o in self.committable().items() if self._committed.get(tp) != o}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as e:  # a rebalance took the partition away; its new owner re-reads from the last commit
            log.warning("offset commit skipped: %s", e)
            return
        self._committed.update(offsets)


class CommitPacer:
    """Commits at most every `interval_s`, so a busy consumer does not commit per record. A commit
    skipped for being too soon is made by the next one, or by the owner's idle timer (see
    baton_platform.consumer): the last records before a quiet spell must not stay uncommitted."""

    def __init__(self, tracker: OffsetTracker, interval_s: float = 0.5) -> None:
        self.tracker = tracker
        self._interval = interval_s
        self._last = 0.0

    async def maybe_commit(self, consumer: AIOKafkaConsumer | None, force: bool = False) -> None:
        if consumer is None:  # FastStream's in-memory test broker has no Kafka consumer to commit with
            return
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        await self.tracker.commit(consumer)
