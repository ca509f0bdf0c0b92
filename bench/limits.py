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
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition
from baton.v1 import workflow_pb2

from baton_devtools.kafka import acreate_topics
from baton_devtools.stack import free_port
from baton_devtools.traffic import make_task, offer
from baton_devtools.standins import standin_stats
from baton_platform import topics
from baton_platform.kafka import partition_ids

PROVIDER = "openai_compatible"
WORKER = "limited"
# On a fresh broker the first group commit waits for the offsets topic to be created; aiokafka
# retries that on its own but logs every try, which would bury the benchmark's progress lines.
logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

_SHARE = re.compile(r"^baton_executor_limit_share\{[^}]*\} ([0-9.e+-]+)$", re.M)


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


class Executors:
    """N executor processes of one provider; their limit shares are read from /metrics."""

    def __init__(self, config: Path, bootstrap: str, log_dir: Path) -> None:
        self.config, self.bootstrap, self.log_dir = config, bootstrap, log_dir
        self.procs: list[tuple[subprocess.Popen, int]] = []

    def start(self, count: int) -> None:
        env = {**os.environ, "BATON_CONFIG": str(self.config), "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
               "OTEL_TRACES_EXPORTER": "none"}
        for _ in range(count):
            port = free_port()
            with open(self.log_dir / f"limits-executor-{len(self.procs)}.log", "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "baton_executor.main", "--provider", PROVIDER,
                                         "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append((proc, port))

    def shares(self) -> list[float]:
        out = []
        for proc, port in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"an executor exited (status {proc.returncode}); logs in {self.log_dir}")
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2, trust_env=False).text
            except httpx.HTTPError:
                out.append(0.0)
                continue
            m = _SHARE.search(text)
            out.append(float(m.group(1)) if m else 0.0)
        return out

    def wait_balanced(self, timeout: float = 90) -> list[float]:
        """Until every replica holds a share, the shares add up to the whole, and they stay put for 1 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shares = self.shares()
            if shares and all(s > 0 for s in shares) and abs(sum(shares) - 1) < 1e-6:
                time.sleep(1.0)
                if self.shares() == shares:
                    return shares
            time.sleep(0.3)
        raise TimeoutError(f"executors never balanced: shares {self.shares()}")

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


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


class Results:
    """StepCompleted/StepFailed records on baton.workflow from its current end, with broker timestamps."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.completed: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    async def start(self) -> None:
        await self.consumer.start()
        ids = await partition_ids({"bootstrap_servers": self.bootstrap}, topics.WORKFLOW)
        tps = [TopicPartition(topics.WORKFLOW, p) for p in ids]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)

    async def collect(self, wanted: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= (self.completed.keys() | self.failed.keys()):
            batch = await self.consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    event = workflow_pb2.WorkflowEvent.FromString(r.value)
                    kind = event.WhichOneof("event")
                    if kind == "step_completed":
                        self.completed.setdefault(event.step_completed.task_id, r.timestamp)
                    elif kind == "step_failed":
                        self.failed.setdefault(event.step_failed.task_id, r.timestamp)

    async def stop(self) -> None:
        await self.consumer.stop()


def sustained_rate(stamps_ms: list[int]) -> float | None:
    """Completions per second between the 10th and 80th percentile of completion times.

    The ends are left out: the first completions come while replicas start pulling, and at the end
    partitions that held fewer tasks run dry, leaving the others to finish alone.
    """
    stamps = sorted(stamps_ms)
    if len(stamps) < 20:
        return None
    lo, hi = len(stamps) // 10, len(stamps) * 8 // 10
    span = (stamps[hi] - stamps[lo]) / 1000
    return (hi - lo) / span if span > 0 else None


async def run_limits(bootstrap: str, standin_url: str, replica_counts: list[int], *, limit_per_s: float,
                     window_s: float, offered_s: float, overload: float, partitions: int, work_dir: Path,
                     log_dir: Path, echo, emit) -> list[dict]:
    """One measurement per replica count, scaling one group of executors up between them (as an
    autoscaler would): tasks offered at `overload` times the limit for `offered_s` each time."""
    counts, configs = topics.topic_plan(partitions, [PROVIDER])
    await acreate_topics(bootstrap, counts, config=configs)
    await skip_backlog(bootstrap)
    config = executor_config(work_dir / "limits.yaml", standin_url, bootstrap, limit_per_s, partitions)
    executors = Executors(config, bootstrap, log_dir)
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
    results = Results(bootstrap)
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
    done = [ts for tid, ts in results.completed.items() if tid in ids]
    rate = sustained_rate(done)
    return {
        "replicas": len(shares),
        "shares": shares,
        "limit_per_s": limit_per_s,
        "offered": len(tasks),
        "offered_rps": overload * limit_per_s,
        "completed": len(done),
        "failed": len([tid for tid in results.failed if tid in ids]),
        "lost": len(ids - results.completed.keys() - results.failed.keys()),
        "observed_rps": round(rate, 2) if rate else None,
        "share_of_limit": round(rate / limit_per_s, 3) if rate else None,
        "rate_limited_429": after["rate_limited"] - before["rate_limited"],
        "provider_calls": after["requests"] - before["requests"],
        "drained_s": round(drained_s, 1),
    }
