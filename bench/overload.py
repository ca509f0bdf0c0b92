"""Overload, then a restart with the broker's data kept: is new traffic served in full at once?

An overload leaves requests, plans and tasks queued on the broker whose clients have long had their
504. A stack restarted over that backlog must not work through it before new traffic (and must not
pay providers for it): every hop drops work past its deadline, before any provider call, and counts
it. Measured here as three loads through the same stack, in one run: the modest rate before, the
overload, cut short by stopping every service as its last request is sent (its clients still
waiting get errors: the queue they leave behind is the point), and the modest rate again as soon as
every service has started again.
"""

from __future__ import annotations

import concurrent.futures
import time

import httpx
from loadgen import Load, generate, procs_for

# The counters of work dropped because its request's deadline had passed, one per hop.
EXPIRED = ("baton_router_expired_total", "baton_synthesizer_expired_total", "baton_executor_expired_total")


def bench(plan, stack, echo, emit) -> dict:
    before = _load(plan, stack, "before", plan.after_rps, plan.after_s, seed=700, echo=echo, emit=emit)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        overloading = pool.submit(_load, plan, stack, "overload (cut by the stop)", plan.overload_rps,
                                  plan.overload_s, seed=701, echo=echo, emit=emit)
        time.sleep(plan.overload_s + 1.0)  # the generators' start, then the whole sending window
        echo("stopping every service with the overload's backlog queued, the broker's data kept ...")
        stopped = time.monotonic()
        stack.stop()
        over = overloading.result()
    stack.start(echo=echo)
    restart_s = round(time.monotonic() - stopped, 1)
    after = _load(plan, stack, "after restart", plan.after_rps, plan.after_s, seed=702, echo=echo, emit=emit)
    dropped = expired_counts(stack)
    emit({"bench": "overload", "kind": "expired", **dropped})
    return {"path": "direct" if plan.direct else "synthesizer", "restart_s": restart_s,
            "request_timeout_s": plan.request_timeout_s, "p99_limit_ms": plan.p99_limit_ms,
            "runs": [before, over, after], "expired_after_restart": dropped}


def _load(plan, stack, name: str, rate: float, seconds: float, *, seed: int, echo, emit) -> dict:
    echo(f"overload bench, {name}: {rate:g} workflows/s for {seconds:g} s ...")
    out = generate(Load(url=stack.base_url, model="baton", rate=rate, duration_s=seconds, warmup_s=0.0,
                        timeout_s=plan.request_timeout_s + 5, seed=seed, procs=procs_for(rate)))
    s = out["summary"]
    answered = s["ok"] == s["sent"]
    fast = s["p99_ms"] is not None and s["p99_ms"] <= plan.p99_limit_ms
    verdict = "pass" if answered and fast else "fail"
    if name.startswith("overload"):
        verdict = "–"  # meant to fail: it is the cause, not a measurement
    emit({"bench": "overload", "kind": "run", "run": name, "offered_rps": rate, "verdict": verdict, **s})
    return {"run": name, "offered_rps": rate, "seconds": seconds, "verdict": verdict, "summary": s}


def expired_counts(stack) -> dict[str, float]:
    """Each hop's count of work dropped past its deadline, summed over the stack's processes (these
    count since the restart: the processes are new)."""
    totals = dict.fromkeys(EXPIRED, 0.0)
    for svc in stack.services:
        try:
            text = httpx.get(svc.metrics_url, timeout=5).text
        except httpx.HTTPError:
            continue  # a process without /metrics (a model server)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals
