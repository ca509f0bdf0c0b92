"""What the chaos suite (tests/e2e/test_chaos.py) demands of every request it sent, as a function of
what it saw, so that a planted loss or duplicate can show each check failing
(tests/tools/test_chaos_checks.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class Call:
    cid: str
    phase: str
    sent: float
    done: float | None = None
    outcome: str = ""  # answer | error | refused | dropped | hung
    reason: str = ""
    status: int = 0  # the HTTP status of an error
    keyed: bool = False  # sent with an Idempotency-Key, retried on a connection error
    retries: int = 0  # sends after the first


def problems(calls: list[Call], rows: Counter, queued: set[str], rerun: list[str], late: list[str],
             recovery: dict[str, float | None], deadline_s: float) -> list[str]:
    """Everything that was lost, duplicated or stuck, one line each: empty when nothing was.

    A request that reached baton.requests (`queued`: the chaos ids found there) is logged exactly once,
    whatever its client saw: an answer, an error after it was accepted (a 5xx, counted against its row
    in the table), or its connection cut when its gateway died. One that never reached it (connection
    refused, 429, 503, or cut before it was queued) is logged never. A request still waiting past its
    deadline, a step run twice, a commit left behind or a fault never recovered from is a problem too;
    so is a request retried with its Idempotency-Key that was not answered in the end."""
    out = []
    for c in calls:
        logged, expected = rows.get(c.cid, 0), 1 if c.cid in queued else 0
        limit = (3 if c.keyed else 1) * deadline_s + 5
        if c.outcome == "hung" or c.done is None or c.done - c.sent > limit:
            out.append(f"{c.phase}: {c.cid} hung past its deadline")
        elif c.outcome == "answer" and not expected:
            out.append(f"{c.phase}: {c.cid} was answered but never queued")
        elif logged != expected:
            out.append(f"{c.phase}: {c.outcome} request {c.cid} ({'queued' if expected else 'not queued'}) "
                       f"logged {logged} time(s)")
        if c.keyed and c.outcome != "answer":
            out.append(f"{c.phase}: {c.cid} retried with its Idempotency-Key but not answered: {c.reason}")
    out += [f"step {t} ran again after it had completed" for t in rerun]
    out += [f"commits stalled at the end: {p}" for p in late]
    out += [f"no answer after the {fault} fault" for fault, t in recovery.items() if t is None]
    return out
