"""Executor replicas against a provider that enforces a request limit.

Tasks are published straight to the provider's tasks topic (as the synthesizer would), so the
measurement is the executors' pacing alone, not the gateway's or the conductor's throughput. The
stand-in answers 429 beyond `limit_per_s * window_s` requests in any sliding window of `window_s`;
the executors are told the same limit (as RPM) and must share it between replicas with no store
in common. What is measured: the rate at which steps complete, and the 429s the stand-in sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from baton_platform import topics
from baton_platform.kafka import partition_ids
from baton_tools.executors import ExecutorProcs, StepResults, sustained_rate
from baton_tools.kafka import acreate_topics
from baton_tools.standins import standin_stats
from baton_tools.traffic import make_task, offer

PROVIDER = "openai_compatible"
WORKER = "limited"
# On a fresh broker the first group commit waits for the offsets topic to be created; aiokafka
# retries that on its own but logs every try, which would bury the benchmark's progress lines.
logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

def executor_config(path: Path, base_url: str, bootstrap: str, limit_per_s: float, partitions: int) -> Path:
    data = {
        "workers": [{"name": WORKER, "provider": PROVIDER, "model": "limited-model", "base_url": base_url,
                     "limits": {"rpm": int(limit_per_s * 60), "concurrency": 32}}],
        "conductor": {"backend": "static", "plan": {"workers": [WORKER], "subtasks": ["x"], "access": [[]]}},
        "kafka": {"bootstrap_servers": bootstrap, "partitions": partitions, "session_timeout_ms": 6000,
                  "heartbeat_interval_ms": 1000},
        "executor": {"max_attempts": 5},
    }
    path.write_text(yaml.safe_dump(data))
    return path


async def skip_backlog(bootstrap: str) -> None:
    """Move the executors' group to the end of the tasks topic: earlier runs' leftovers are not ours."""
    topic = topics.tasks_topic(PROVIDER)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=topics.executor_group(PROVIDER),
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await partition_ids({"bootstrap_servers": bootstrap}, topic)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        await consumer.commit({tp: await consumer.position(tp) for tp in tps})
    finally:
        await consumer.stop()


async def run_limits(bootstrap: str, standin_url: str, replica_counts: list[int], *, limit_per_s: float,
                     window_s: float, offered_s: float, overload: float, partitions: int, work_dir: Path,
                     log_dir: Path, echo, emit) -> list[dict]:
    """One measurement per replica count, scaling one group of executors up between them (as an
    autoscaler would): tasks offered at `overload` times the limit for `offered_s` each time."""
    counts, configs = topics.topic_plan(partitions, [PROVIDER])
    await acreate_topics(bootstrap, counts, config=configs)
    await skip_backlog(bootstrap)
    config = executor_config(work_dir / "limits.yaml", standin_url, bootstrap, limit_per_s, partitions)
    executors = ExecutorProcs(config, PROVIDER, bootstrap, log_dir, env={"OTEL_TRACES_EXPORTER": "none"})
    runs = []
    try:
        for replicas in replica_counts:
            executors.start(replicas - len(executors.procs))
            shares = await asyncio.to_thread(executors.wait_balanced)
            await asyncio.sleep(window_s)  # the provider's window forgets the previous measurement
            run = await _measure(bootstrap, standin_url, shares, limit_per_s=limit_per_s, offered_s=offered_s,
                                 overload=overload, echo=echo)
            runs.append(run)
            emit(run)
    finally:
        executors.stop()
    return runs


async def _measure(bootstrap: str, standin_url: str, shares: list[float], *, limit_per_s: float, offered_s: float,
                   overload: float, echo) -> dict:
    results = StepResults(bootstrap)
    await results.start()
    try:
        before = standin_stats(standin_url)
        count = int(overload * limit_per_s * offered_s)
        tasks = [make_task(uuid.uuid4().hex, WORKER, f"limits task {i}", deadline_s=600) for i in range(count)]
        echo(f"limits: {len(shares)} replica(s), shares {shares}: offering {len(tasks)} tasks at "
             f"{overload * limit_per_s:g}/s against a limit of {limit_per_s:g}/s")
        started = time.monotonic()
        await offer(bootstrap, PROVIDER, tasks, rate=overload * limit_per_s)
        # Every task must finish; at the limit that takes len(tasks)/limit seconds, plus slack.
        await results.collect({t.task_id for t in tasks}, timeout=len(tasks) / limit_per_s * 2 + 30)
        drained_s = time.monotonic() - started
        after = standin_stats(standin_url)
    finally:
        await results.stop()
    ids = {t.task_id for t in tasks}
    done = {tid: ts for ts, tid in reversed(results.completed()) if tid in ids}  # each task's first result
    failed = {tid for _, tid in results.failed() if tid in ids} - done.keys()
    rate = sustained_rate(list(done.values()))
    return {
        "replicas": len(shares),
        "shares": shares,
        "limit_per_s": limit_per_s,
        "offered": len(tasks),
        "offered_rps": overload * limit_per_s,
        "completed": len(done),
        "failed": len(failed),
        "lost": len(ids - done.keys() - failed),
        "observed_rps": round(rate, 2) if rate else None,
        "share_of_limit": round(rate / limit_per_s, 3) if rate else None,
        "rate_limited_429": after["rate_limited"] - before["rate_limited"],
        "provider_calls": after["requests"] - before["requests"],
        "drained_s": round(drained_s, 1),
    }
