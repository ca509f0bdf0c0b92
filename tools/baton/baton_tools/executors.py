"""Executor replicas as processes, and the step results they publish: for the scale tests and the
limits benchmark, which measure executors alone (tasks go straight to a provider's topic)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from baton.v1 import responses_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.kafka import partition_ids
from baton_tools import procs
from baton_workflow.steps import episode_results

_SHARE = re.compile(r"^baton_executor_limit_share\{[^}]*\} ([0-9.e+-]+)$", re.M)


class ExecutorProcs:
    """N executor processes of one provider, in one consumer group; their limit shares come from /metrics."""

    def __init__(self, config: Path, provider: str, bootstrap: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.config, self.provider, self.bootstrap, self.log_dir = config, provider, bootstrap, log_dir
        self.env = env or {}
        self.procs: list[tuple[procs.Child, int]] = []
        self.killed: set[int] = set()

    def start(self, count: int) -> None:
        env = {**os.environ, "BATON_CONFIG": str(self.config), "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, **self.env}
        for _ in range(count):
            port, name = procs.free_port(), f"executor-{self.provider}-{len(self.procs)}"
            child = procs.Child(name, [sys.executable, "-m", "baton_executor.main", "--provider", self.provider,
                                       "--port", str(port)], log=self.log_dir / f"{name}.log", env=env)
            self.procs.append((child, port))

    def shares(self) -> list[float]:
        """Each live replica's share of the limits (0 until it has partitions); killed ones are left out."""
        out = []
        for i, (proc, port) in enumerate(self.procs):
            if i in self.killed:
                continue
            if not proc.alive():
                raise RuntimeError(f"executor {i} exited (status {proc.proc.returncode}); logs in {self.log_dir}")
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2, trust_env=False).text
            except httpx.HTTPError:
                out.append(0.0)
                continue
            m = _SHARE.search(text)
            out.append(float(m.group(1)) if m else 0.0)
        return out

    def wait_balanced(self, timeout: float = 90) -> list[float]:
        """Until every live replica holds a share, the shares add up to the whole, and they stay put for 1 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shares = self.shares()
            if shares and all(s > 0 for s in shares) and abs(sum(shares) - 1) < 1e-6:
                time.sleep(1.0)
                if self.shares() == shares:
                    return shares
            time.sleep(0.3)
        raise TimeoutError(f"executors never balanced: shares {self.shares()}")

    def kill(self, index: int) -> None:
        """SIGKILL one replica: no drain, no commit, as a crash."""
        self.killed.add(index)
        self.procs[index][0].kill()

    def stop(self) -> None:
        procs.stop_groups([child.pid for child, _ in self.procs])


class StepResults:
    """Every step result from the current end of baton.workflow (StepCompleted/StepFailed, a synthesizer's
    steps) and of baton.responses (the final responses of one-step workflows the executor answers itself,
    router.direct_single_step: one result per step of their episodes), each with its broker time."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.results: list[tuple[int, str, bool]] = []  # (broker time, task id, completed)

    async def start(self) -> None:
        await self.consumer.start()
        tps = [TopicPartition(topic, p) for topic in (topics.WORKFLOW, topics.RESPONSES)
               for p in await partition_ids({"bootstrap_servers": self.bootstrap}, topic)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)

    async def collect(self, task_ids: set[str], timeout: float) -> None:
        """Read until every one of `task_ids` has a result, or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not task_ids <= self.done_ids():
            batch = await self.consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    self.results.extend((r.timestamp, task_id, ok) for task_id, ok in _step_results(r.topic, r.value))

    def completed(self) -> list[tuple[int, str]]:
        """(broker time, task id) of every completion, duplicates included."""
        return [(ts, task_id) for ts, task_id, ok in self.results if ok]

    def failed(self) -> list[tuple[int, str]]:
        return [(ts, task_id) for ts, task_id, ok in self.results if not ok]

    def done_ids(self) -> set[str]:
        return {tid for _, tid in self.completed() + self.failed()}

    async def stop(self) -> None:
        await self.consumer.stop()


def _step_results(topic: str, value: bytes) -> list[tuple[str, bool]]:
    """(task id, completed) of each step result in one record of baton.workflow or baton.responses."""
    if topic == topics.WORKFLOW:
        event = workflow_pb2.WorkflowEvent.FromString(value)
        kind = event.WhichOneof("event")
        if kind == "step_completed":
            return [(event.step_completed.task_id, True)]
        return [(event.step_failed.task_id, False)] if kind == "step_failed" else []
    return episode_results(responses_pb2.Response.FromString(value))


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
