"""Matching responses to the HTTP requests waiting for them on this replica.

Each replica reads only the partitions of baton.responses the consumer group gives it, and asks for
its answers on one of them (the request's reply_partition), so replicas scale without each reading
every response. A rebalance (a replica starting or stopping, a rolling upgrade) can give a partition
to another replica while requests here still wait on it, and a partition that stays may restart
from its end (no offset committed yet) past a reply sent during the rebalance: after each one,
`assigned` reports the requests still waiting, and the gateway reads their partitions again without
the group (baton_gateway.handover) until none of them waits.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from baton.v1 import responses_pb2

# Responses that precede a request's final one (answer or error): workflow progress and answer text.
INTERIM = ("progress", "delta")


class Replies:
    def __init__(self) -> None:
        # Each waiting request's queues: one per client waiting on it (a repeat with its
        # Idempotency-Key waits beside the first, baton_gateway.idempotency).
        self._pending: dict[str, list[asyncio.Queue[responses_pb2.Response]]] = {}
        # Each waiting request's reply partition and when it was asked (unix ms).
        self._asked: dict[str, tuple[int, int]] = {}
        self._partitions: list[int] = []
        self._revoked: set[int] = set()
        self._turn = itertools.count()
        # Called after a rebalance with the requests waiting on the partitions it revoked.
        self.on_rebalanced: Callable[[dict[str, tuple[int, int]]], None] | None = None

    # Rebalance hooks of the reply consumer. While the group rebalances, new requests still ask on the
    # partitions held before: they are among those reported once it ends, and the client gets its
    # answer instead of a 503 for the length of the rebalance.
    async def revoked(self, revoked) -> None:
        self._revoked |= {tp.partition for tp in revoked}

    async def assigned(self, assigned) -> None:
        self._partitions = sorted(tp.partition for tp in assigned)
        waiting = {r: asked for r, asked in self._asked.items() if asked[0] in self._revoked}
        self._revoked = set()
        if waiting and self.on_rebalanced is not None:
            self.on_rebalanced(waiting)

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._pending

    @property
    def owned(self) -> int:
        """Partitions of baton.responses this replica reads: its share of the gateway's traffic."""
        return len(self._partitions)

    def owns(self, partition: int) -> bool:
        """Whether this replica reads `partition` now (not while a rebalance is taking it away)."""
        return partition in self._partitions and partition not in self._revoked

    @property
    def ready(self) -> bool:
        return bool(self._partitions)

    def reply_partition(self) -> int | None:
        parts = self._partitions
        return parts[next(self._turn) % len(parts)] if parts else None

    def expect(self, request_id: str, partition: int) -> asyncio.Queue[responses_pb2.Response]:
        """A queue that receives the request's interim responses, then its final one."""
        queue: asyncio.Queue[responses_pb2.Response] = asyncio.Queue()
        self._pending.setdefault(request_id, []).append(queue)
        self._asked.setdefault(request_id, (partition, int(time.time() * 1000)))
        return queue

    def abandon(self, request_id: str, queue: asyncio.Queue[responses_pb2.Response] | None = None) -> None:
        """Stop waiting for a request: for one of its clients (`queue`), or for all of them."""
        queues = self._pending.get(request_id, [])
        if queue is not None and queue in queues:
            queues.remove(queue)
        if queue is None or not queues:
            self._pending.pop(request_id, None)
            self._asked.pop(request_id, None)

    def deliver(self, response: responses_pb2.Response) -> bool:
        """Hand a response to its waiter. After the final one the request is forgotten, so a
        duplicate final response (a redelivery) and strays for other replicas are dropped."""
        queues = self._pending.get(response.request_id)
        if queues is None:
            return False
        if response.WhichOneof("outcome") not in INTERIM:
            del self._pending[response.request_id]
            self._asked.pop(response.request_id, None)
        for queue in queues:
            queue.put_nowait(response)
        return True

    @property
    def waiting(self) -> int:
        return len(self._pending)
