"""Matching responses to the HTTP requests waiting for them on this replica.

Each replica reads only the partitions of baton.responses the consumer group gives it, and asks for
its answers on one of them (the request's reply_partition), so replicas scale without each reading
every response.
"""

from __future__ import annotations

import asyncio
import itertools

from aiokafka import ConsumerRebalanceListener
from baton.v1 import responses_pb2


class Replies(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Future[responses_pb2.Response]] = {}
        self._partitions: list[int] = []
        self._turn = itertools.count()

    # Rebalance callbacks (aiokafka awaits them).
    async def on_partitions_revoked(self, revoked) -> None:
        self._partitions = []

    async def on_partitions_assigned(self, assigned) -> None:
        self._partitions = sorted(tp.partition for tp in assigned)

    @property
    def ready(self) -> bool:
        return bool(self._partitions)

    def reply_partition(self) -> int | None:
        parts = self._partitions
        return parts[next(self._turn) % len(parts)] if parts else None

    def expect(self, request_id: str) -> asyncio.Future[responses_pb2.Response]:
        fut = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        return fut

    def abandon(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def deliver(self, response: responses_pb2.Response) -> bool:
        """Hand a response to its waiter; the first one wins, duplicates and strays are dropped."""
        fut = self._pending.pop(response.request_id, None)
        if fut is None or fut.done():
            return False
        fut.set_result(response)
        return True

    @property
    def waiting(self) -> int:
        return len(self._pending)
