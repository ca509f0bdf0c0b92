"""Idempotency-Key: a request repeated with the same key by the same tenant gets the first one's answer
(streamed or not), while it runs or after it finished, and never starts a second workflow.

A request with a key claims it on baton.idempotency before it is queued: a record keyed by a digest
of tenant and key, naming the request, its reply partition, when it was asked and its deadline, and
a digest of the request's body. Every gateway replica reads the topic whole (baton_gateway.table),
and the first claim of a key in the topic holds it: records of one key share a partition, so every
replica agrees on which came first, and a replica that claims a key reads the topic up to its own
claim before it acts on it. Two clients racing with one key therefore run one workflow. The others
attach to it: they wait for its replies, read again from its reply partition since it was asked
(baton_gateway.handover), so the replica that asked it may be gone.

A claim no request followed (its replica died between the two writes) would hold its key for
nothing: a repeat that finds its request neither on baton.requests nor answered queues it itself,
under the claim's request id, with its own body (the same: the fingerprints match), so there is
still one workflow. A request whose queueing failed releases its key. Keys are kept for
`gateway.idempotency_hours`, the topic's retention; baton.responses must keep replies at least as long.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from starlette.requests import Request

from baton_gateway.api import ApiError
from baton_gateway.handover import CLOCK_SKEW_MS
from baton_gateway.table import TopicTable
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.consumer import Publisher
from baton_platform.kafka import client_options, partition_ids, read_since

log = logging.getLogger(__name__)

HEADER = "idempotency-key"
MAX_KEY_CHARS = 255
LOOKUP_S = 5.0  # how long looking for a request on baton.requests may take


@dataclass(frozen=True)
class IdempotencyKey:
    """A request's key, scoped to its tenant, and the digest of what it asked."""

    slot: str
    fingerprint: str


def key_of(request: Request, body: bytes, tenant: str) -> IdempotencyKey | None:
    """The request's Idempotency-Key header, if it has one; a 400 for one that cannot be a key."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY_CHARS or not key.isprintable():
        raise ApiError(400, f"the Idempotency-Key header must hold 1 to {MAX_KEY_CHARS} printable characters",
                       param="Idempotency-Key")
    slot = hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()
    fingerprint = hashlib.sha256(request.url.path.encode() + b"\0" + body).hexdigest()
    return IdempotencyKey(slot, fingerprint)


@dataclass(frozen=True)
class Claim:
    request_id: str
    fingerprint: str
    partition: int   # the request's reply partition
    asked_ms: int
    deadline_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms > self.deadline_ms


class IdempotencyKeys:
    def __init__(self, kafka: KafkaConfig, out: Publisher, retention_s: float) -> None:
        self._kafka, self._out, self._retention_s = kafka, out, retention_s
        self._claims: dict[str, Claim] = {}  # slot: the claim holding it
        self.table = TopicTable(kafka, topics.IDEMPOTENCY, self._take)

    async def claim(self, key: IdempotencyKey, mine: Claim) -> Claim:
        """The claim that holds `key` once this replica has tried to take it with `mine`: `mine`, or
        the earlier claim of another request (which may have another fingerprint: the caller's 409)."""
        if not await self.table.catch_up():
            raise ApiError(503, "idempotency keys cannot be read now; retry shortly", type="service_unavailable")
        held = self.holder(key)
        if held is not None:
            return held
        try:
            await self._out.send(json.dumps(asdict(mine)).encode(), key=key.slot)
        except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so, run nothing
            raise ApiError(503, f"the request could not be queued ({type(e).__name__}); retry shortly",
                           type="service_unavailable") from None
        if not await self.table.catch_up():
            raise ApiError(503, "idempotency keys cannot be read now; retry shortly", type="service_unavailable")
        held = self.holder(key)
        if held is None:  # expired the moment it was read: a retention shorter than a request
            raise ApiError(503, "the idempotency key could not be claimed; retry shortly", type="service_unavailable")
        return held

    async def release(self, key: IdempotencyKey, request_id: str) -> None:
        """Free a key whose request was never queued (best effort: otherwise it expires at its deadline)."""
        try:
            await self._out.send(json.dumps({"release": request_id}).encode(), key=key.slot)
        except Exception as e:  # noqa: BLE001 - the claim ends at its deadline instead
            log.warning("could not release an idempotency key (%s)", type(e).__name__)

    def holder(self, key: IdempotencyKey) -> Claim | None:
        return self._live(self._claims.get(key.slot))

    def _live(self, claim: Claim | None) -> Claim | None:
        if claim is None or time.time() * 1000 - claim.asked_ms > self._retention_s * 1000:
            return None
        return claim

    def _take(self, slot: str, value: bytes | None) -> None:
        try:
            record = json.loads(value or b"{}")
            if "release" in record:
                held = self._claims.get(slot)
                if held is not None and held.request_id == str(record["release"]):
                    del self._claims[slot]
                return
            claim = Claim(request_id=str(record["request_id"]), fingerprint=str(record["fingerprint"]),
                          partition=int(record["partition"]), asked_ms=int(record["asked_ms"]),
                          deadline_ms=int(record["deadline_ms"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("skipping a malformed idempotency record")
            return
        if self._live(self._claims.get(slot)) is None:  # the first claim holds the key; later ones lost a race
            self._claims[slot] = claim

    async def queued(self, claim: Claim) -> bool:
        """Whether the request of `claim` reached baton.requests; True when that cannot be read (joining
        it is then the choice that never runs a workflow twice)."""
        options = client_options(self._kafka)
        probe = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **options)
        try:
            await probe.start()
            parts = sorted(await partition_ids(options, topics.REQUESTS))
            tp = TopicPartition(topics.REQUESTS, DefaultPartitioner()(claim.request_id.encode(), parts, parts))
            return await asyncio.wait_for(self._find(probe, tp, claim), LOOKUP_S)
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.warning("could not look for request %s on %s (%s)", claim.request_id, topics.REQUESTS, type(e).__name__)
            return True
        finally:
            await probe.stop()

    @staticmethod
    async def _find(probe: AIOKafkaConsumer, tp: TopicPartition, claim: Claim) -> bool:
        async for record in read_since(probe, [tp], claim.asked_ms - CLOCK_SKEW_MS):
            if record.key == claim.request_id.encode():
                return True
        return False
