"""The Batch API's state: each batch is a record on the compacted topic baton.batches (key: its id),
which every gateway replica reads whole, so any replica answers `GET /v1/batches/{id}` and a batch
outlives the replica that took it.

A record holds the tenant, the key that created it (its permissions run the lines) and OpenAI's
batch object, whose `status` moves validating → in_progress → finalizing → completed (or failed,
cancelling → cancelled, expired). Records are checked as they are read (the topic is on the bus): one
that is not a batch of this shape is skipped, never served or run.

Input lines are checked when the batch is created: each a JSON object with a unique `custom_id`,
`method` POST, `url` the batch's endpoint and a `body` object; a file that breaks a rule is a 400
naming the line.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from baton_gateway.api import ApiError
from baton_gateway.table import TopicTable
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.consumer import Publisher

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
WINDOW = "24h"
WINDOW_S = 24 * 3600
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
MAX_CUSTOM_ID = 512
STATUSES = (*ACTIVE, "completed", "failed", "cancelled", "expired")
CANCEL = "cancel/"  # the key prefix of a cancel request


@dataclass
class Line:
    """One request of a batch's input file."""

    number: int  # from 1, as an editor counts
    custom_id: str
    body: dict[str, Any]


@dataclass
class Batch:
    tenant: str
    key_id: str
    scopes: list[str]
    models: list[str]
    object: dict[str, Any]
    home: int = 0  # the partition of baton.responses whose owner runs it

    @property
    def id(self) -> str:
        return self.object["id"]

    @property
    def status(self) -> str:
        return self.object["status"]

    def record(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "key_id": self.key_id, "scopes": self.scopes, "models": self.models,
                "home": self.home, "batch": self.object}


def new_batch_object(input_file_id: str, endpoint: str, metadata: dict[str, str] | None, total: int) -> dict[str, Any]:
    """OpenAI's batch object, as `POST /v1/batches` returns it."""
    now = int(time.time())
    return {"id": f"batch_{secrets.token_hex(12)}", "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": WINDOW, "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + WINDOW_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": metadata}


def parse_lines(content: bytes, endpoint: str, most: int) -> list[Line]:
    """The input file's requests; a 400 naming the first line that breaks a rule."""
    lines: list[Line] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        if len(lines) >= most:
            raise ApiError(400, f"the input file holds more than {most} requests, this tenant's max_batch_lines",
                           param="input_file_id")
        lines.append(_line(number, raw, endpoint, seen))
    if not lines:
        raise ApiError(400, "the input file holds no requests", param="input_file_id")
    return lines


def _line(number: int, raw: bytes, endpoint: str, seen: set[str]) -> Line:
    def bad(why: str) -> ApiError:
        return ApiError(400, f"line {number} of the input file {why}", param="input_file_id")

    try:
        item = json.loads(raw)
    except ValueError:
        raise bad("is not JSON") from None
    if not isinstance(item, dict):
        raise bad("is not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        raise bad(f"needs a custom_id of 1 to {MAX_CUSTOM_ID} characters")
    if custom_id in seen:
        raise bad(f"repeats custom_id {custom_id[:80]!r}; each must be unique")
    seen.add(custom_id)
    if item.get("method") != "POST":
        raise bad("needs method POST")
    if item.get("url") != endpoint:
        raise bad(f"has url {str(item.get('url'))[:80]!r}; this batch's endpoint is {endpoint}")
    if not isinstance(item.get("body"), dict):
        raise bad("needs a body object")
    return Line(number, custom_id, item["body"])


class Batches:
    """Every batch, read from baton.batches, and the writes that move one on."""

    def __init__(self, kafka: KafkaConfig | None, out: Publisher | None) -> None:
        self._out = out
        self._items: dict[str, Batch] = {}
        self._cancels: dict[str, int] = {}  # batch id: when its tenant asked to cancel it
        self.table = TopicTable(kafka, topics.BATCHES, self._take) if kafka is not None else None

    async def save(self, batch: Batch) -> None:
        if self._out is not None:
            await self._out.send(json.dumps(batch.record()).encode(), key=batch.id)
        self._items[batch.id] = batch  # this replica reads its own write at once

    async def cancel(self, batch: Batch) -> None:
        """Ask the replica running `batch` to stop it: a record of its own (key `cancel/<id>`), so the
        runner's own writes of the batch can never overwrite it."""
        at = int(time.time())
        if self._out is not None:
            await self._out.send(json.dumps({"tenant": batch.tenant, "at": at}).encode(), key=f"{CANCEL}{batch.id}")
        self._cancels.setdefault(batch.id, at)

    def cancel_asked(self, batch_id: str) -> int | None:
        """When the batch's tenant asked to cancel it (unix seconds), None if it did not."""
        return self._cancels.get(batch_id)

    def by_id(self, batch_id: str) -> Batch | None:
        return self._items.get(batch_id)

    def get(self, tenant: str, batch_id: str) -> Batch | None:
        batch = self._items.get(batch_id)
        return batch if batch is not None and batch.tenant == tenant else None

    def shown(self, batch: Batch) -> dict[str, Any]:
        """The batch object a client reads: `cancelling` from the moment a cancel was asked."""
        obj = dict(batch.object)
        if batch.id in self._cancels and obj["status"] in ACTIVE:
            obj.update(status="cancelling", cancelling_at=self._cancels[batch.id])
        return obj

    def of(self, tenant: str) -> list[Batch]:
        """The tenant's batches, newest first."""
        return sorted((b for b in self._items.values() if b.tenant == tenant),
                      key=lambda b: (b.object["created_at"], b.id), reverse=True)

    def open_count(self, tenant: str) -> int:
        return sum(1 for b in self._items.values() if b.tenant == tenant and b.status in ACTIVE)

    def active(self) -> list[Batch]:
        return [b for b in self._items.values() if b.status in ACTIVE]

    def _take(self, key: str, value: bytes | None) -> None:
        if value is None:
            self._items.pop(key, None)
            return
        if key.startswith(CANCEL):
            self._take_cancel(key.removeprefix(CANCEL), value)
            return
        try:
            batch = _checked(json.loads(value))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("baton.batches: skipping a record that is not a batch (%s)", type(e).__name__)
            return
        if batch.id != key:
            log.warning("baton.batches: skipping a record whose key is not its batch's id")
            return
        self._items[key] = batch


    def _take_cancel(self, batch_id: str, value: bytes) -> None:
        try:
            record = json.loads(value)
            tenant, at = str(record["tenant"]), int(record["at"])
        except (ValueError, KeyError, TypeError):
            log.warning("baton.batches: skipping a cancel record that is not one")
            return
        batch = self._items.get(batch_id)
        if batch is None or batch.tenant == tenant:  # a batch is read before its cancel, in one partition
            self._cancels.setdefault(batch_id, at)


def _checked(record: dict[str, Any]) -> Batch:
    batch = Batch(tenant=str(record["tenant"]), key_id=str(record["key_id"]),
                  scopes=[str(s) for s in record["scopes"]], models=[str(m) for m in record["models"]],
                  object=dict(record["batch"]), home=int(record["home"]))
    obj = batch.object
    if obj.get("status") not in STATUSES or obj.get("endpoint") not in ENDPOINTS:
        raise ValueError("unknown status or endpoint")
    if not str(obj.get("id", "")).startswith("batch_") or not isinstance(obj.get("request_counts"), dict):
        raise ValueError("not a batch object")
    return batch
