"""Matching responses to the HTTP requests waiting for them on this replica.

Each replica reads only the partitions of baton.responses the consumer group gives it, and asks for
its answers on one of them (the request's reply_partition), so replicas scale without each reading
every response.
"""

from __future__ import annotations

import asyncio
import itertools

from baton.v1 import responses_pb2

# Responses that precede a request's final one (answer or error): workflow progress and answer text.
INTERIM = ("progress", "delta")


class Replies:
    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Queue[responses_pb2.Response]] = {}
        self._partitions: list[int] = []
        self._turn = itertools.count()

    # Rebalance hooks of the reply consumer.
    async def revoked(self, revoked) -> None:
        self._partitions = []

    async def assigned(self, assigned) -> None:
        self._partitions = sorted(tp.partition for tp in assigned)

    @property
    def owned(self) -> int:
        """Partitions of baton.responses this replica reads: its share of the gateway's traffic."""
        return len(self._partitions)

    @property
    def ready(self) -> bool:
        return bool(self._partitions)

    def reply_partition(self) -> int | None:
        parts = self._partitions
        return parts[next(self._turn) % len(parts)] if parts else None

    def expect(self, request_id: str) -> asyncio.Queue[responses_pb2.Response]:
        """A queue that receives the request's interim responses, then its final one."""
        queue: asyncio.Queue[responses_pb2.Response] = asyncio.Queue()
        self._pending[request_id] = queue
        return queue

    def abandon(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def deliver(self, response: responses_pb2.Response) -> bool:
        """Hand a response to its waiter. After the final one the request is forgotten, so a
        duplicate final response (a redelivery) and strays for other replicas are dropped."""
        queue = self._pending.get(response.request_id)
        if queue is None:
            return False
        if response.WhichOneof("outcome") not in INTERIM:
            del self._pending[response.request_id]
        queue.put_nowait(response)
        return True

    @property
    def waiting(self) -> int:
        return len(self._pending)
