"""Exploration: for a share of requests, several candidate workflows for one query.

Candidate 0 is the request itself and answers the client; candidates 1..G-1 get request ids
`<id>.<k>` and run in full, but only their episodes are kept. Each candidate records its plan's
log-probabilities and propensity, so the groups serve GRPO and off-policy evaluation alike. Whether
a request explores is decided by its id, so a redelivered request makes the same choice.
"""

from __future__ import annotations

import hashlib

from baton.v1 import requests_pb2


def explores(request_id: str, share: float) -> bool:
    if share <= 0:
        return False
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def candidates(request: requests_pb2.ChatRequest, group_size: int) -> list[requests_pb2.ChatRequest]:
    """The requests of one exploration group; the first is the client's own."""
    out = []
    for k in range(group_size):
        c = requests_pb2.ChatRequest()
        c.CopyFrom(request)
        c.group_id, c.candidate, c.group_size = request.request_id, k, group_size
        if k:
            c.request_id = f"{request.request_id}.{k}"
            c.stream = False  # only the client's own candidate reports progress
        out.append(c)
    return out
