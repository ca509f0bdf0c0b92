"""Open-loop load: OpenAI chat completions sent at Poisson arrival times, whatever the server does.

A closed loop (send, wait, send) slows down with the server and hides queueing; here a request
leaves at its scheduled time even when earlier ones are still waiting. Each generator is a process
of its own (`python bench/loadgen.py ...`), so its CPU is neither shared with the orchestrator nor
limited to one interpreter when the rate needs several; `generate()` starts them, releases them at
the same instant and merges what they measured.

A generator also measures itself: how late each request left compared with its schedule (the send
lag) and how much CPU it used per request. A large lag means the client, not the server, was the
bottleneck, and the run says so instead of reporting the server as slow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

LAG_LIMIT_MS = 100.0  # send lag p99 above this: the generator, not the server, set the pace


@dataclass
class Load:
    url: str  # the server's base URL, ending in /v1
    model: str
    rate: float  # requests per second, all generator processes together
    duration_s: float  # measured part of the run
    warmup_s: float = 1.0  # sent at the same rate before the measured part; not counted
    timeout_s: float = 15.0
    seed: int = 1
    procs: int = 1


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; `sorted_values` must be sorted."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarise(records: list[list], duration_s: float) -> dict:
    """Latency and error summary of the measured requests (warm-up excluded)."""
    measured = [r for r in records if not r[4]]
    ok = sorted(r[2] for r in measured if r[3] == 200)
    lags = sorted(r[1] for r in measured)
    errors = Counter(str(r[3]) for r in measured if r[3] != 200)

    def pct(values, q):
        v = percentile(values, q)
        return None if v is None else round(v, 2)

    return {
        "sent": len(measured),
        "ok": len(ok),
        "errors": dict(errors),
        # Refused at once by admission control (429 with Retry-After): shed, not lost.
        "shed": errors.get("429", 0),
        "achieved_rps": round(len(ok) / duration_s, 2),
        "p50_ms": pct(ok, 50), "p95_ms": pct(ok, 95), "p99_ms": pct(ok, 99),
        "max_ms": round(ok[-1], 2) if ok else None,
        "mean_ms": round(sum(ok) / len(ok), 2) if ok else None,
        "lag_p50_ms": pct(lags, 50), "lag_p99_ms": pct(lags, 99),
        "lag_max_ms": round(lags[-1], 2) if lags else None,
    }


# --- the generator process ----------------------------------------------------------------------


def _arrivals(rate: float, horizon_s: float, seed: int) -> list[float]:
    """Poisson arrival offsets in [0, horizon_s); the same seed gives the same schedule."""
    rng = random.Random(seed)
    t, out = 0.0, list[float]()
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            return out
        out.append(t)


async def _drive(load: Load, rate: float, seed: int, start_at: float) -> dict:
    import httpx  # imported here: the orchestrator only needs this module's summaries

    offsets = _arrivals(rate, load.warmup_s + load.duration_s, seed)
    records: list[list] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=30)
    async with httpx.AsyncClient(base_url=load.url, timeout=load.timeout_s, limits=limits, trust_env=False) as client:

        async def one(i: int, scheduled: float) -> None:
            body = {"model": load.model, "max_tokens": 16,
                    "messages": [{"role": "user", "content": f"Benchmark request {seed}-{i}: reply briefly."}]}
            sent = time.monotonic()
            try:
                r = await client.post("/chat/completions", json=body)
                status: int | str = r.status_code
                if status == 200 and not r.json()["choices"][0]["message"]["content"]:
                    status = "empty_answer"
            except httpx.TimeoutException:
                status = "timeout"
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                status = type(e).__name__
            done = time.monotonic()
            records.append([round(scheduled - start_at, 4), round((sent - scheduled) * 1000, 3),
                            round((done - sent) * 1000, 3), status, scheduled - start_at < load.warmup_s])

        cpu0 = time.process_time()
        delay = start_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        jobs = []
        for i, offset in enumerate(offsets):
            scheduled = start_at + offset
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            jobs.append(asyncio.create_task(one(i, scheduled)))
        await asyncio.gather(*jobs)
        cpu = time.process_time() - cpu0
    return {"records": records, "cpu_s": cpu}


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="One load generator process (started by generate()).")
    p.add_argument("--load", required=True, help="the Load as JSON")
    p.add_argument("--rate", type=float, required=True, help="this process's share of the rate")
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args(argv)
    load = Load(**json.loads(args.load))
    import httpx  # noqa: F401 - pay the import before saying ready

    print("ready", flush=True)
    line = sys.stdin.readline().split()
    start_at = float(line[1])  # time.monotonic() is one system-wide clock on Linux
    result = asyncio.run(_drive(load, args.rate, args.seed, start_at))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


# --- the orchestrator's side -------------------------------------------------------------------


def favour(pid: int, niceness: int = -5) -> bool:
    """Raise a process's CPU priority; True when allowed (root, or CAP_SYS_NICE).

    The load generators and the provider stand-in play the outside world, which in production runs
    on other machines: on a saturated shared machine they must not queue for CPU behind the system
    they measure, or the measurement blames the system for its instruments being late.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
        return True
    except OSError:
        return False


def generate(load: Load) -> dict:
    """Run `load.procs` generator processes together; return merged records and a summary."""
    procs, favoured = [], True
    for k in range(load.procs):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--load", json.dumps(load.__dict__),
               "--rate", str(load.rate / load.procs), "--seed", str(load.seed * 1000 + k)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        favoured = favour(procs[-1].pid) and favoured
    pipes = [(cast(IO[str], proc.stdin), cast(IO[str], proc.stdout)) for proc in procs]  # both are pipes
    try:
        for proc, (_, out) in zip(procs, pipes, strict=True):
            if out.readline().strip() != "ready":
                raise RuntimeError(f"load generator exited before it was ready (status {proc.wait()})")
        start_at = time.monotonic() + 0.2
        for into, _ in pipes:
            into.write(f"go {start_at!r}\n")
            into.flush()
        outputs = [json.loads(out.readline()) for _, out in pipes]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    records = sorted((r for out in outputs for r in out["records"]), key=lambda r: r[0])
    return _result(records, sum(out["cpu_s"] for out in outputs), load.duration_s, load.procs, favoured)


def pooled(outs: list[dict], duration_s: float, procs: int) -> dict:
    """Several runs against one target as one: their measured requests summarised together."""
    return _result([r for out in outs for r in out["records"]], sum(out["client_cpu_s"] for out in outs),
                   duration_s, procs, all(out["summary"]["client_favoured"] for out in outs))


def _result(records: list[list], cpu_s: float, duration_s: float, procs: int, favoured: bool) -> dict:
    summary = summarise(records, duration_s)
    summary["client_cpu_ms_per_request"] = round(cpu_s * 1000 / len(records), 2) if records else None
    summary["client_procs"] = procs
    summary["client_favoured"] = favoured
    summary["client_keeping_up"] = summary["lag_p99_ms"] is not None and summary["lag_p99_ms"] <= LAG_LIMIT_MS
    return {"summary": summary, "records": records, "client_cpu_s": cpu_s}


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
