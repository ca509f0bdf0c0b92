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
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast
from urllib.parse import urlsplit

LAG_LIMIT_MS = 100.0  # send lag p99 above this: the generator, not the server, set the pace


def procs_for(rate: float) -> int:
    """Generator processes for a rate. One costs ~0.2-0.5 ms of CPU a request; past ~400/s a second
    process keeps each event loop on schedule (the send lag says whether it did)."""
    return max(1, min(4, math.ceil(rate / 400)))


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


class _Pool:
    """Keep-alive HTTP/1.1 connections to one server, for JSON POSTs. The generator is an instrument:
    httpx cost it 3-5 ms of CPU per request, which at a few hundred requests a second on a small
    machine is a core the system under test no longer has. This does only what the bench needs:
    Content-Length and chunked replies; a connection the server closed, or that timed out, is dropped,
    and one idle for `IDLE_S` is not reused (uvicorn closes idle ones after 5 s, and a request sent
    as it does so would fail for the client's sake, not the server's)."""

    IDLE_S = 4.0

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load generator speaks plain http only: {url}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            since, reader, writer = self._idle.pop()
            if not reader.at_eof() and time.monotonic() - since < self.IDLE_S:
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port)

    async def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._connection()
        try:
            writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % ((self.prefix + path).encode(), self.host.encode(),
                                                              self.port, len(body), body))
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(head[0].split(" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
            if headers.get("transfer-encoding", "").lower() == "chunked":
                chunks = []
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    chunks.append((await reader.readexactly(size + 2))[:-2])
                await reader.readuntil(b"\r\n")
                data = b"".join(chunks)
            else:
                data = await reader.readexactly(int(headers.get("content-length", "0")))
        except BaseException:
            writer.close()  # half-read or cancelled by the timeout: the connection's state is unknown
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self._idle.append((time.monotonic(), reader, writer))
        return status, data

    def close(self) -> None:
        for _, _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def _drive(load: Load, rate: float, seed: int, start_at: float) -> dict:
    offsets = _arrivals(rate, load.warmup_s + load.duration_s, seed)
    records: list[list] = []
    pool = _Pool(load.url)

    async def one(i: int, scheduled: float) -> None:
        body = json.dumps({"model": load.model, "max_tokens": 16, "messages": [
            {"role": "user", "content": f"Benchmark request {seed}-{i}: reply briefly."}]}).encode()
        sent = time.monotonic()
        try:
            code, data = await asyncio.wait_for(pool.post_json("/chat/completions", body), load.timeout_s)
            status: int | str = code
            if code == 200 and not json.loads(data)["choices"][0]["message"]["content"]:
                status = "empty_answer"
        except TimeoutError:
            status = "timeout"
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, IndexError, TypeError) as e:
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
    pool.close()
    return {"records": records, "cpu_s": cpu}


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="One load generator process (started by generate()).")
    p.add_argument("--load", required=True, help="the Load as JSON")
    p.add_argument("--rate", type=float, required=True, help="this process's share of the rate")
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args(argv)
    load = Load(**json.loads(args.load))
    import uvloop  # imported here, before saying ready: the orchestrator only needs this module's summaries

    print("ready", flush=True)
    line = sys.stdin.readline().split()
    start_at = float(line[1])  # time.monotonic() is one system-wide clock on Linux
    result = uvloop.run(_drive(load, args.rate, args.seed, start_at))
    # The result goes through a file, its path through the pipe: a result bigger than the pipe's
    # 64 KiB buffer, read back through it, came out cut or garbled at that boundary now and then
    # (seen after runs whose server went away mid-run).
    fd, path = tempfile.mkstemp(prefix="baton-loadgen-", suffix=".json")
    with os.fdopen(fd, "w") as out:
        json.dump(result, out)
    print(path, flush=True)
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


def _read_result(path: str) -> dict:
    if not path:
        raise RuntimeError("a load generator exited without a result (its error is above)")
    try:
        return json.loads(Path(path).read_text())
    finally:
        Path(path).unlink(missing_ok=True)


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
        outputs = [_read_result(out.readline().strip()) for _, out in pipes]
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


def main(argv: list[str]) -> int:
    """`python bench/loadgen.py --url URL --rate R --seconds S`: one open-loop run against a running
    gateway (e.g. after `make up`), its summary as JSON. With --load, one generator of `generate()`."""
    if "--load" in argv:
        return _child(argv)
    p = argparse.ArgumentParser(description="Open-loop chat completions at Poisson arrivals; prints the summary.")
    p.add_argument("--url", default="http://127.0.0.1:8080/v1", help="the gateway's base URL, ending in /v1")
    p.add_argument("--model", default="baton")
    p.add_argument("--rate", type=float, required=True, help="requests per second")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds, after one second of warm-up")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds a request may take before it counts as lost")
    p.add_argument("--procs", type=int, default=0, help="generator processes (default: one per 400 req/s, at most 4)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    summary = generate(Load(url=args.url, model=args.model, rate=args.rate, duration_s=args.seconds,
                            timeout_s=args.timeout, seed=args.seed,
                            procs=args.procs or procs_for(args.rate)))["summary"]
    summary["offered_rps"] = args.rate
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
