"""Overload, then a restart with the broker's data kept: is new traffic served in full at once?

An overload leaves requests, plans and tasks queued on the broker whose clients have long had their
504. A stack restarted over that backlog must not work through it before new traffic (and must not
pay providers for it): every hop drops work past its deadline, before any provider call, and counts
it. Measured here as loads through the same stack, in one run: the modest rate before; again just
after every service was restarted with nothing queued (a rollout); the overload, cut short by
stopping every service as its last request is sent (its clients still waiting get errors: the queue
they leave behind is the point); and the modest rate again as soon as every service is back.
"""

from __future__ import annotations

import concurrent.futures
import time

import httpx
from loadgen import Load, generate, procs_for

# The counters of work dropped because its request's deadline had passed, one per hop.
EXPIRED = ("baton_router_expired_total", "baton_synthesizer_expired_total", "baton_executor_expired_total")


def bench(plan, stack, echo, emit) -> dict:
    modest = {"rate": plan.after_rps, "seconds": plan.after_s, "echo": echo, "emit": emit}
    before = _load(plan, stack, "before", seed=700, **modest)
    echo("restarting every service with nothing queued (as a rollout does) ...")
    clean_s = _restart(stack, echo)
    clean = _load(plan, stack, "after a clean restart", seed=701, **modest)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        overloading = pool.submit(_load, plan, stack, "overload (cut by the stop)", rate=plan.overload_rps,
                                  seconds=plan.overload_s, seed=702, echo=echo, emit=emit)
        time.sleep(plan.overload_s + 1.0)  # the generators' start, then the whole sending window
        echo("restarting every service with the overload's backlog queued, the broker's data kept ...")
        backlog_s = _restart(stack, echo, then=overloading.result)
        over = overloading.result()
    after = _load(plan, stack, "after a restart over the backlog", seed=703, **modest)
    dropped = expired_counts(stack)
    emit({"bench": "overload", "kind": "expired", **dropped})
    return {"path": "direct" if plan.direct else "synthesizer", "restart_s": {"clean": clean_s, "backlog": backlog_s},
            "request_timeout_s": plan.request_timeout_s, "p99_limit_ms": plan.p99_limit_ms,
            "runs": [before, clean, over, after], "expired_after_restart": dropped}


def _restart(stack, echo, then=None) -> float:
    """Stop every service (and wait for `then`, the load cut by the stop), start them again; the
    seconds from the stop to every service ready."""
    stopped = time.monotonic()
    stack.stop()
    if then is not None:
        then()
    stack.start(echo=echo)
    return round(time.monotonic() - stopped, 1)


def _load(plan, stack, name: str, *, rate: float, seconds: float, seed: int, echo, emit) -> dict:
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
