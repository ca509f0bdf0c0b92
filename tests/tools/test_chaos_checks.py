"""The chaos suite's checks fail on a planted loss, duplicate, stuck request or re-run step."""

from __future__ import annotations

from collections import Counter

from chaos_checks import Call, problems


def call(cid: str, outcome: str = "answer", status: int = 0, keyed: bool = False) -> Call:
    return Call(cid, "gateway", sent=0.0, done=1.0, outcome=outcome, reason=f"{status}" if status else "",
                status=status, keyed=keyed)


# Answered; cut off after it was queued; cut off before; refused at connect; refused with a 503; a
# 504 after it was accepted (an error, logged like any other episode).
HEALTHY = [call("a"), call("b", "dropped"), call("b2", "dropped"), call("c", "refused"), call("d", "error", 503),
           call("e", "error", 504)]
QUEUED = {"a", "b", "e"}
ROWS = Counter({"a": 1, "b": 1, "e": 1})


def check(calls=HEALTHY, rows=ROWS, queued=QUEUED, rerun=(), late=(), recovery=None):
    return problems(list(calls), rows, set(queued), list(rerun), list(late), recovery or {"gateway": 2.0},
                    deadline_s=20)


def test_a_healthy_run_has_no_problem():
    assert check() == []


def test_each_planted_fault_is_a_problem():
    assert check(rows=Counter({"b": 1, "e": 1})) == ["gateway: answer request a (queued) logged 0 time(s)"]  # lost
    assert check(rows=ROWS + Counter({"a": 1})) == ["gateway: answer request a (queued) logged 2 time(s)"]
    assert check(rows=Counter({"a": 1, "e": 1})) == ["gateway: dropped request b (queued) logged 0 time(s)"]
    assert check(rows=ROWS + Counter({"c": 1})) == ["gateway: refused request c (not queued) logged 1 time(s)"]
    assert check(rows=Counter({"a": 1, "b": 1})) == ["gateway: error request e (queued) logged 0 time(s)"]
    assert check(queued={"b", "e"}, rows=Counter({"b": 1, "e": 1})) == ["gateway: a was answered but never queued"]
    assert check(calls=[Call("f", "gateway", sent=0.0, done=None)]) == ["gateway: f hung past its deadline"]
    assert check(calls=[*HEALTHY, call("g", "dropped", keyed=True)], queued=QUEUED | {"g"}, rows=ROWS + Counter({"g": 1})
                 ) == ["gateway: g retried with its Idempotency-Key but not answered: "]
    assert check(rerun=["r1:0:1"]) == ["step r1:0:1 ran again after it had completed"]
    assert check(late=["baton-router baton.requests[0] committed 3 of 4"]) == [
        "commits stalled at the end: baton-router baton.requests[0] committed 3 of 4"]
    assert check(recovery={"kafka": None}) == ["no answer after the kafka fault"]
