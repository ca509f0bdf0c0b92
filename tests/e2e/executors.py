"""Executor processes and task traffic for the scale tests, without the rest of the suite."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from baton.v1 import workflow_pb2

from baton_devtools.stack import free_port
from baton_platform import topics
from baton_platform.kafka import partition_ids


class ExecutorProcs:
    def __init__(self, config: Path, provider: str, bootstrap: str, log_dir: Path) -> None:
        self.config, self.provider, self.bootstrap, self.log_dir = config, provider, bootstrap, log_dir
        self.procs: list[tuple[subprocess.Popen, int]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            port = free_port()
            env = {**os.environ, "BATON_CONFIG": str(self.config), "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap}
            log = open(self.log_dir / f"executor-{len(self.procs)}.log", "ab")
            proc = subprocess.Popen([sys.executable, "-m", "baton_executor.main", "--provider", self.provider,
                                     "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.procs.append((proc, port))

    def shares(self) -> list[float]:
        out = []
        for proc, port in self.procs:
            if proc.poll() is not None:
                continue
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                out.append(0.0)
                continue
            m = re.search(r'^baton_executor_limit_share\{[^}]*\} ([0-9.e-]+)$', text, re.M)
            out.append(float(m.group(1)) if m else 0.0)
        return out

    def wait_balanced(self, timeout: float = 60) -> None:
        """Until every live replica holds a share and the shares add up to the whole limit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shares = self.shares()
            if shares and all(s > 0 for s in shares) and abs(sum(shares) - 1) < 1e-6:
                time.sleep(1.0)
                if self.shares() == shares:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"executors never balanced: shares {self.shares()}")

    def kill(self, index: int) -> None:
        os.killpg(self.procs[index][0].pid, signal.SIGKILL)
        self.procs[index][0].wait(10)

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


class Results:
    """Reads baton.workflow from its current end: every StepCompleted/StepFailed with its broker time."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.events: list[tuple[int, workflow_pb2.WorkflowEvent]] = []

    async def start(self) -> None:
        await self.consumer.start()
        ids = await partition_ids({"bootstrap_servers": self.bootstrap}, topics.WORKFLOW)
        tps = [TopicPartition(topics.WORKFLOW, p) for p in ids]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)

    async def collect_until(self, task_ids: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not task_ids <= self.done_ids():
            batch = await self.consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    self.events.append((r.timestamp, workflow_pb2.WorkflowEvent.FromString(r.value)))

    def completed(self) -> list[tuple[int, str]]:
        return [(ts, e.step_completed.task_id) for ts, e in self.events if e.WhichOneof("event") == "step_completed"]

    def done_ids(self) -> set[str]:
        return {tid for _, tid in self.completed()}

    async def stop(self) -> None:
        await self.consumer.stop()
