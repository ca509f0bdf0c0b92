"""Stored responses (`store: true`): what `previous_response_id`, `GET /v1/responses/{id}` and
`DELETE` read, kept on the compacted topic baton.stored-responses keyed by response id.

Every gateway replica reads the whole topic into memory, so any replica can continue a conversation
another one answered. A record holds its tenant, the response object, its turn as chat messages, and
the response it continued: a conversation is a chain of records, each the size of one turn. A delete
is a newer record under the same key, which compaction keeps in place of the response. The topic's
retention (`gateway.stored_responses_days`) bounds how long, and so how much, is kept. Records are
checked as they are read: the topic is on the bus, and a malformed record is skipped, never served.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from baton_gateway.table import TopicTable
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.consumer import Publisher

log = logging.getLogger(__name__)

MAX_CHAIN = 1000  # turns a conversation may hold; past this a continuation is refused


class StoredResponses:
    def __init__(self, kafka: KafkaConfig, out: Publisher, retention_s: float) -> None:
        self._out, self._retention_s = out, retention_s
        self._items: dict[str, dict[str, Any]] = {}
        self.table = TopicTable(kafka, topics.STORED_RESPONSES, self._take)

    # -- writing --------------------------------------------------------------------------------

    async def put(self, response_id: str, tenant: str, body: dict[str, Any], messages: list[dict[str, Any]],
                  previous: str | None) -> None:
        record = {"tenant": tenant, "body": body, "messages": messages, "previous": previous,
                  "stored_at": time.time()}
        await self._out.send(json.dumps(record).encode(), key=response_id)
        self._take(response_id, record)  # this replica reads its own write at once

    async def delete(self, response_id: str, tenant: str) -> None:
        record = {"tenant": tenant, "deleted": True, "stored_at": time.time()}
        await self._out.send(json.dumps(record).encode(), key=response_id)
        self._items.pop(response_id, None)

    # -- reading --------------------------------------------------------------------------------

    async def get(self, response_id: str, tenant: str) -> dict[str, Any] | None:
        """The stored record of `response_id` if `tenant` stored it and it has not expired."""
        if response_id not in self._items:
            await self.table.catch_up()
        record = self._items.get(response_id)
        if record is None or record["tenant"] != tenant:
            return None  # another tenant's response is one this tenant cannot know of
        if time.time() - record["stored_at"] > self._retention_s:
            return None
        return record

    async def history(self, response_id: str, tenant: str) -> list[dict[str, Any]] | None:
        """The chat messages of the conversation up to and including `response_id`, oldest first; None
        when it, or a response it continued, is not stored for `tenant`."""
        chain: list[list[dict[str, Any]]] = []
        current: str | None = response_id
        while current is not None:
            record = await self.get(current, tenant)
            if record is None or len(chain) >= MAX_CHAIN:
                return None
            chain.append(record["messages"])
            current = record["previous"]
        return [m for turn in reversed(chain) for m in turn]

    def _take(self, key: str, value: bytes | dict[str, Any] | None) -> None:
        try:
            record = value if isinstance(value, dict) else json.loads(value or b"{}")
            if record.get("deleted"):
                self._items.pop(key, None)
                return
            messages = [dict(m) for m in record["messages"]]
            if not key or any(not isinstance(m.get("role"), str) for m in messages):
                raise ValueError("a message without a role")
            checked = {"tenant": str(record["tenant"]), "body": dict(record["body"]), "messages": messages,
                       "previous": None if record["previous"] is None else str(record["previous"]),
                       "stored_at": float(record["stored_at"])}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("skipping a malformed stored response %r", key[:64])
            return
        self._items[key] = checked
