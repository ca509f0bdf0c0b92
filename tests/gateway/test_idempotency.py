"""Which claim holds an Idempotency-Key, as every gateway replica reads baton.idempotency (the
end-to-end suite, tests/e2e/test_idempotency.py, runs requests with keys on a broker)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import pytest
from starlette.requests import Request

from baton_gateway.api import ApiError
from baton_gateway.idempotency import Claim, IdempotencyKey, IdempotencyKeys, key_of

KEY = IdempotencyKey(slot="s1", fingerprint="f1")


def claim(request_id: str, asked_ms: int | None = None, **extra) -> Claim:
    now = int(time.time() * 1000) if asked_ms is None else asked_ms
    return Claim(request_id, "f1", 0, now, now + 60_000, **extra)


def keys() -> IdempotencyKeys:
    return IdempotencyKeys(None, None, retention_s=3600)  # type: ignore[arg-type] - only its table's rules here


def read(k: IdempotencyKeys, record) -> None:
    k._take(KEY.slot, json.dumps(record if isinstance(record, dict) else asdict(record)).encode())


def test_the_first_claim_of_a_key_holds_it_and_later_ones_lose():
    k = keys()
    read(k, claim("r1"))
    read(k, claim("r2"))  # a racing replica's claim, later in the partition
    assert k.holder(KEY).request_id == "r1"


def test_a_claim_is_released_only_by_its_own_request():
    k = keys()
    read(k, claim("r1"))
    read(k, {"release": "r2"})
    assert k.holder(KEY).request_id == "r1"
    read(k, {"release": "r1"})
    assert k.holder(KEY) is None
    read(k, claim("r3"))
    assert k.holder(KEY).request_id == "r3"


def test_a_key_past_its_retention_is_free_and_malformed_records_are_skipped():
    k = keys()
    read(k, claim("old", asked_ms=int(time.time() * 1000) - 7200_000))
    assert k.holder(KEY) is None
    read(k, claim("new"))
    assert k.holder(KEY).request_id == "new"
    k._take(KEY.slot, b"not json")
    k._take(KEY.slot, b'{"request_id": "x"}')
    assert k.holder(KEY).request_id == "new"


def request(headers: dict[str, str], path: str = "/v1/chat/completions") -> Request:
    return Request({"type": "http", "method": "POST", "path": path, "query_string": b"",
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})


def test_a_key_is_the_tenants_own_and_its_fingerprint_is_the_body_and_endpoint():
    a = key_of(request({"Idempotency-Key": "k"}), b"{}", "team")
    assert key_of(request({}), b"{}", "team") is None
    assert key_of(request({"Idempotency-Key": "k"}), b"{}", "others").slot != a.slot
    assert key_of(request({"Idempotency-Key": "k"}), b"{ }", "team").fingerprint != a.fingerprint
    assert key_of(request({"Idempotency-Key": "k"}, "/v1/responses"), b"{}", "team").fingerprint != a.fingerprint
    for bad in ("", "x" * 256, "tab\there"):
        with pytest.raises(ApiError) as err:
            key_of(request({"Idempotency-Key": bad}), b"{}", "team")
        assert (err.value.status, err.value.param) == (400, "Idempotency-Key")
