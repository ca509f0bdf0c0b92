"""Time to first token of streaming requests, through each target in front of the same stand-in.

Requests go one at a time (closed loop, on purpose): this measures the path a first token takes,
not queueing, which the overhead runs already cover. The stand-in streams its answer in chunks with
a pause between them, so the first token and the end of the stream are distinct moments.
"""

from __future__ import annotations

import json
import time

import httpx
from loadgen import percentile

CHUNK_DELAY_MS = 20  # the stand-in's pause between streamed chunks while this runs
BODY = {"stream": True, "max_tokens": 64,
        "messages": [{"role": "user", "content": "Say a few words, slowly, one after another, please."}]}


def _has_content(line: str) -> bool:
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return False
    choices = json.loads(line[5:]).get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


def _one(client: httpx.Client, model: str) -> tuple[float, float]:
    """(ms to the first content chunk, ms to the end of the stream)."""
    started = time.perf_counter()
    first = None
    with client.stream("POST", "/chat/completions", json={**BODY, "model": model}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and _has_content(line):
                first = time.perf_counter()
    ended = time.perf_counter()
    return ((first or ended) - started) * 1000, (ended - started) * 1000


def measure(url: str, model: str, n: int) -> dict:
    ttft, total = [], []
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
        _one(client, model)  # the first streaming call on each path is not measured
        for _ in range(n):
            first, end = _one(client, model)
            ttft.append(first)
            total.append(end)
    ttft.sort()
    total.sort()
    return {"requests": n, **{f"ttft_{q}_ms": round(percentile(ttft, p), 2) for q, p in (("p50", 50), ("p95", 95))},
            "stream_p50_ms": round(percentile(total, 50), 2)}


def bench(targets: dict[str, tuple[str, str]], n: int, echo, emit) -> list[dict]:
    """One row per target; Baton's and LiteLLM's rows also say how much later than direct the first token came."""
    rows = []
    for name, (url, model) in targets.items():
        echo(f"time to first token: {n} streaming requests through {name} ...")
        rows.append({"target": name, **measure(url, model, n)})
    direct = next((r for r in rows if r["target"] == "direct"), None)
    for row in rows:
        if direct is not None and row is not direct:
            row["ttft_p50_overhead_ms"] = round(row["ttft_p50_ms"] - direct["ttft_p50_ms"], 2)
        emit({"bench": "overhead", "kind": "ttft", "chunk_delay_ms": CHUNK_DELAY_MS, **row})
    return rows
