"""What the chaos suite (tests/e2e/test_chaos.py) demands of every request it sent, as a function of
what it saw, so that a planted loss or duplicate can show each check failing
(tests/unit/test_chaos_checks.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# Answers that mean the gateway did not accept the request: nothing ran, nothing was logged.
NOT_ACCEPTED = {429, 503}


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


def problems(calls: list[Call], rows: Counter, rerun: list[str], late: list[str], recovery: dict[str, float | None],
             deadline_s: float) -> list[str]:
    """Everything that went wrong, one line each: empty when nothing was lost, duplicated or stuck.

    A request is either answered, with its episode logged exactly once; or cut off with its connection
    (the gateway died), its workflow still run and logged exactly once; or never accepted (connection
    refused, 429, 503), with nothing logged. A 5xx after acceptance, an answer past the deadline, a step
    run twice, a commit left behind or a fault never recovered from is a problem."""
    out = []
    for c in calls:
        logged = rows.get(c.cid, 0)
        limit = (3 if c.keyed else 1) * deadline_s + 5
        if c.outcome == "hung" or c.done is None or c.done - c.sent > limit:
            out.append(f"{c.phase}: {c.cid} hung past its deadline")
        elif c.outcome in ("answer", "dropped") and logged != 1:
            out.append(f"{c.phase}: {c.outcome} request {c.cid} logged {logged} time(s), not once")
        elif c.outcome == "refused" or (c.outcome == "error" and c.status in NOT_ACCEPTED):
            if logged:
                out.append(f"{c.phase}: {c.cid} was not accepted ({c.reason}) but logged {logged} time(s)")
        elif c.outcome not in ("answer", "dropped"):
            out.append(f"{c.phase}: {c.cid} accepted but not answered: {c.reason or c.outcome}")
        if c.keyed and c.outcome != "answer":
            out.append(f"{c.phase}: {c.cid} retried with its Idempotency-Key but not answered: {c.reason}")
    out += [f"step {t} ran again after it had completed" for t in rerun]
    out += [f"commits stalled at the end: {p}" for p in late]
    out += [f"no answer after the {fault} fault" for fault, t in recovery.items() if t is None]
    return out
