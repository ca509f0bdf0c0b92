"""Chaos: steady load through the official `openai` client while each process of the stack is
killed with SIGKILL and restarted with `baton up --only NAME`, and then the Kafka broker is stopped
and started, and killed with SIGKILL and started (the `kafka-kill` row); in the
`disk-full` row, the reward logger's disk (a small tmpfs: the test needs root) is filled for
DISK_FULL_S, then freed. That test runs twice: on the synthesizer's path (a two-step plan) and on
the direct path (`router.direct_single_step`: a one-step plan whose executor answers the client, so
a re-run step is looked for among the responses too). A second
test runs the stack on three brokers (replication 3, two in sync) and loses one: the busiest
partition's leader killed, a rolling restart, one broker down for BROKER_DOWN_S.
`make chaos` runs this file alone; `make test` runs it with the rest.

What must hold, checked at the end by `chaos_checks.problems` (whose unit tests plant each failure):
- every request that reached baton.requests was logged exactly once, whatever its client saw (an
  answer, a 5xx, which the table counts against its row, or a connection cut when its gateway died),
  and one that never reached it (connection refused, 429, 503, cut before it was queued) never;
- none hung past its deadline (the client's timeout is the gateway's deadline plus a margin);
- no step ran again after it had completed (two different results for one task id on
  baton.workflow; the same result published twice after a broker hiccup is not a re-run);
- at the end no consumer group's commits are stalled: every partition is committed to its end. The
  episodes are counted only then, after the reward logger's last flush.

A request whose gateway replica is killed gets a connection error on the client's side (the HTTP
connection drops). Its workflow is not cancelled: it runs to the end and its episode is logged once
(its answer goes to a reply partition nobody waits on); without an Idempotency-Key the client must
send it again, as a new request. Requests sent while no gateway listens are refused at connect,
never accepted.

In the `gateway-retry` row the gateway is killed again, and clients send each request with an
Idempotency-Key and retry it on a connection error until the gateway is back: every request of that
row must be answered, and its episode logged once (a retry that started a second workflow would log
a second one).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import openai
import pyarrow.parquet as pq
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from chaos_checks import Call, problems
from testbed import MMLU_PRO, default_config_data, small_disk, wait_for

from baton.v1 import requests_pb2, responses_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.dataset import current_files
from baton_tools.kafka import KafkaCluster, LocalKafka
from baton_tools.procs import free_port
from baton_tools.stack import Stack

RATE_PER_S = 3.0
DEADLINE_S = 20.0
PARTITIONS = 4
FAULTS = ["gateway", "gateway-retry", "router", "synthesizer", "executor-sim-0", "executor-sim-1", "reward-logger",
          "disk-full", "kafka", "kafka-kill"]
# How long the `disk-full` row keeps the reward logger's disk (a small tmpfs) full under load.
DISK_FULL_S = 15
KEYED = "gateway-retry"  # the row whose clients retry with their Idempotency-Key
GROUPS = {topics.GROUP_ROUTER: [topics.REQUESTS], topics.GROUP_SYNTHESIZER: [topics.WORKFLOW],
          topics.GROUP_REWARD_LOGGER: [topics.RESPONSES], topics.executor_group("sim"): [topics.tasks_topic("sim")]}


@dataclass
class Load:
    """Open-loop requests at a steady rate, each in its own thread, each tagged with the fault phase."""

    base_url: str
    questions: list[str]
    calls: list[Call] = field(default_factory=list)
    phase: str = "warm-up"

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=64)
        self._client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0,
                                     timeout=DEADLINE_S + 10, http_client=httpx.Client(trust_env=False))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        start, i = time.monotonic(), 0
        while not self._stop.is_set():
            delay = start + i / RATE_PER_S - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            call = Call(uuid.uuid4().hex, self.phase, time.monotonic())
            self.calls.append(call)
            self._pool.submit(self._one, call, self.questions[i % len(self.questions)])
            i += 1

    def _one(self, call: Call, question: str) -> None:
        keyed = call.keyed = call.phase == KEYED
        give_up = time.monotonic() + 2 * DEADLINE_S
        try:
            while True:
                try:
                    r = self._client.chat.completions.create(
                        model="baton", messages=[{"role": "user", "content": question}], metadata={"chaos_id": call.cid},
                        extra_headers={"Idempotency-Key": call.cid} if keyed else None)
                    break
                except openai.APIConnectionError:
                    if not keyed or time.monotonic() > give_up:
                        raise
                    call.retries += 1
                    time.sleep(0.5)
            call.outcome, call.reason = ("answer", "") if r.choices[0].message.content else ("error", "empty answer")
        except openai.APITimeoutError:
            call.outcome, call.reason = "hung", "no reply by the deadline"
        except openai.APIConnectionError as e:
            refused = isinstance(e.__cause__, httpx.ConnectError)
            call.outcome, call.reason = ("refused", "connect refused") if refused else ("dropped", "connection dropped")
            if not refused:
                call.phase = self.phase  # sent just before the fault that dropped it: count it there
        except openai.APIStatusError as e:
            code = (e.body or {}).get("code") if isinstance(e.body, dict) else None
            call.outcome, call.reason, call.status = "error", f"{e.status_code} {code or ''}".strip(), e.status_code
        finally:
            call.done = time.monotonic()

    def first_answer_after(self, t: float) -> float | None:
        done = [c.done for c in list(self.calls) if c.sent >= t and c.outcome == "answer" and c.done]
        return min(done) if done else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)


def questions(n: int = 50) -> list[str]:
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        return [row["prompt"] for _, row in zip(range(n), csv.DictReader(f))]


def chaos_config(tmp_path, bootstrap: str, replication_factor: int = 1, direct: bool = False):
    """The chaos stack's config: two steps through the synthesizer, or with `direct` one step that the
    router sends straight to the executor, which answers the client (router.direct_single_step)."""
    data = default_config_data()
    data["conductor"]["plan"] = {"workers": ["gemini-flash", "gemini-pro"], "subtasks": ["Solve it.", "Check it."],
                                 "access": [[], [0]]}
    if direct:
        data["conductor"]["plan"] = {"workers": ["gemini-pro"], "subtasks": ["Answer it."], "access": [[]]}
        data["router"] = {**data.get("router", {}), "direct_single_step": True}
    data["workers"][0]["replicas"] = 2
    data["kafka"] = {"bootstrap_servers": bootstrap, "partitions": PARTITIONS, "session_timeout_ms": 6000,
                     "heartbeat_interval_ms": 1000, "replication_factor": replication_factor}
    data["gateway"] = {**data["gateway"], "request_timeout_s": DEADLINE_S}  # keeps `auth: none` (loopback)
    data["synthesizer"] = {"step_timeout_s": 10}
    data["reward_logger"] = {"flush_interval_s": 0.5}
    path = tmp_path / "chaos.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def restart_with_the_cli(stack: Stack, name: str) -> None:
    """`baton up --only NAME` against the stack's run folder, then take the new process into `stack`."""
    env = {**os.environ, "BATON_RUN_DIR": str(stack.run_dir)}
    done = subprocess.run([sys.executable, "-m", "baton_tools.cli", "up", "--only", name], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"baton up --only {name} failed: {done.stderr}"
    stack.services = Stack.attach(stack.run_dir).services


def episodes(dataset_dir) -> Counter:
    """Rows per chaos id in the episode dataset."""
    rows: Counter = Counter()
    paths = [str(p) for p in (dataset_dir / "episodes").rglob("*.parquet") if not p.name.startswith(".")]
    for path in current_files(paths):  # as the shared reader: a file a merged one supersedes is not read
        for meta in pq.read_table(path, columns=["metadata_json"]).column("metadata_json").to_pylist():
            cid = json.loads(meta or "{}").get("chaos_id")
            if cid:
                rows[cid] += 1
    return rows


async def whole_topic(bootstrap: str, topic: str):
    """Every record of `topic` (its PARTITIONS partitions), up to the ends it had when the read began."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap.split(","), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for r in records:
                    yield r
    finally:
        await consumer.stop()


async def completions(bootstrap: str) -> dict[str, set[bytes]]:
    """Every distinct StepCompleted published per task id, over the whole of baton.workflow. The same
    result published again is one body; a re-run's result differs (its latency, at least)."""
    out: dict[str, set[bytes]] = defaultdict(set)
    async for r in whole_topic(bootstrap, topics.WORKFLOW):
        event = workflow_pb2.WorkflowEvent.FromString(r.value)
        if event.WhichOneof("event") == "step_completed":
            out[event.step_completed.task_id].add(r.value)
    return out


async def answered_steps(bootstrap: str) -> dict[str, set[bytes]]:
    """Every distinct step of the final responses on baton.responses, per task id: where a one-step
    workflow's executor answers the client itself (router.direct_single_step), its steps' results."""
    out: dict[str, set[bytes]] = defaultdict(set)
    async for r in whole_topic(bootstrap, topics.RESPONSES):
        response = responses_pb2.Response.FromString(r.value)
        if response.WhichOneof("outcome") in ("answer", "error"):
            for step in response.episode.steps:
                out[f"{response.request_id}:{step.step}:{step.attempt}"].add(step.SerializeToString())
    return out


async def queued_ids(bootstrap: str) -> set[str]:
    """The chaos ids of every request that reached baton.requests: those the gateway accepted."""
    return {requests_pb2.ChatRequest.FromString(r.value).metadata.get("chaos_id", "")
            async for r in whole_topic(bootstrap, topics.REQUESTS)}


async def stalled(bootstrap: str) -> list[str]:
    """Partitions whose group's committed offset is short of the partition's end."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap.split(","))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap.split(","), group_id=None)
    await admin.start()
    await consumer.start()
    try:
        out = []
        for group, group_topics in GROUPS.items():
            committed = await admin.list_consumer_group_offsets(group)
            tps = [TopicPartition(t, p) for t in group_topics for p in range(PARTITIONS)]
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                at = committed[tp].offset if tp in committed else 0
                if ends[tp] > max(at, 0):
                    out.append(f"{group} {tp.topic}[{tp.partition}] committed {at} of {ends[tp]}")
        return out
    finally:
        await consumer.stop()
        await admin.close()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", ["synthesizer", "direct"])
def test_every_process_and_the_broker_killed_in_turn_under_load(tmp_path, path):
    """Every fault of FAULTS on one broker: on the synthesizer's path (a two-step plan), and on the direct
    path (router.direct_single_step: a one-step plan the executor answers)."""
    direct = path == "direct"
    # The episode dataset lives on a disk of its own, which the `disk-full` row fills and then frees.
    with small_disk(tmp_path / "disk", "256m") as disk:
        kafka = LocalKafka(data_dir=tmp_path / "kafka", log_file=tmp_path / "kafka.log")
        kafka.start()
        try:
            stack = chaos_stack(tmp_path, kafka.bootstrap_servers, dataset_dir=disk.path / "data", direct=direct)
            calls = run_under_load(stack, kafka.bootstrap_servers, FAULTS,
                                   lambda fault: inject_into_one_broker(fault, stack, kafka, disk), direct=direct)
        finally:
            kafka.stop()
    keyed = [c for c in calls if c.keyed]
    assert sum(c.retries for c in keyed), "no request of the retry row was cut by the gateway's death: it tested nothing"


def inject_into_one_broker(fault: str, stack: Stack, kafka: LocalKafka, disk) -> None:
    """One fault of FAULTS: the broker stopped or crashed, the dataset's disk full for a while, or a
    service killed with SIGKILL and restarted with the CLI."""
    if fault in ("kafka", "kafka-kill"):
        kafka.stop() if fault == "kafka" else kafka.kill()  # a clean shutdown, then a crash
        time.sleep(1)
        kafka.start()
        return
    if fault == "disk-full":
        disk.fill()
        time.sleep(DISK_FULL_S)
        disk.free()
        return
    if fault == KEYED:
        time.sleep(1.5)  # requests with keys are in flight when it dies
    name = "gateway" if fault == KEYED else fault
    killed = stack.kill(name)
    for proc in stack._children:
        if proc.pid == killed.pid:
            proc.wait(10)  # reap it, as a supervisor would
    time.sleep(1)
    restart_with_the_cli(stack, name)


# How long the `broker-down` row keeps one of three brokers stopped.
BROKER_DOWN_S = float(os.environ.get("BATON_CHAOS_BROKER_DOWN_S", "120"))
CLUSTER_FAULTS = ["leader-kill", "rolling-restart", "broker-down"]


@pytest.mark.timeout(1200)
def test_a_three_broker_cluster_loses_a_broker_under_load(tmp_path):
    """Three KRaft brokers, every topic replicated three times with two in sync: the leader of the
    busiest topic's partition is killed with SIGKILL (and started again), then every broker is restarted
    in turn (each waiting until no partition is under-replicated, as an operator's rolling restart
    does), then one broker is stopped for BROKER_DOWN_S. The same checks as the single broker's rows."""
    cluster = KafkaCluster(tmp_path / "cluster")
    cluster.start()

    def settled() -> None:
        assert wait_for(lambda: asyncio.run(cluster.under_replicated()) == 0, 120, 1), "replicas never caught up"

    def inject(fault: str) -> None:
        if fault == "leader-kill":
            node = cluster.node(asyncio.run(cluster.leader(topics.WORKFLOW, 0)))
            node.kill()
            time.sleep(1)
            node.start()
        elif fault == "rolling-restart":
            for node in cluster.nodes:
                settled()
                node.stop()
                node.start()
        else:
            node = cluster.nodes[-1]
            node.stop()
            time.sleep(BROKER_DOWN_S)
            node.start()
        settled()

    try:
        stack = chaos_stack(tmp_path, cluster.bootstrap_servers, replication_factor=3)
        run_under_load(stack, cluster.bootstrap_servers, CLUSTER_FAULTS, inject)
    finally:
        cluster.stop()


def chaos_stack(tmp_path, bootstrap: str, replication_factor: int = 1, dataset_dir=None, direct: bool = False) -> Stack:
    return Stack(tmp_path / "run", config_file=chaos_config(tmp_path, bootstrap, replication_factor, direct),
                 gateway_port=free_port(), bootstrap_servers=bootstrap, console_port=free_port(),
                 gateway_metrics_port=free_port(), dataset_dir=dataset_dir)


def run_under_load(stack: Stack, bootstrap: str, faults: list[str], inject, direct: bool = False) -> list[Call]:
    """Start `stack`, send steady load, `inject` each fault in turn and time the recovery from it, then,
    once every group has committed to the end and the last episodes are written, print the table and
    fail on anything lost, duplicated, re-run, stalled or hung. With `direct` (the stack's one-step
    plans skip the synthesizer) a step re-run is looked for in the responses too, and no step may have
    gone through the synthesizer. Returns the calls. Stops the stack."""
    load = None
    recovery: dict[str, float | None] = {}
    try:
        stack.start(echo=lambda *_: None)
        load = Load(stack.base_url, questions())
        load.start()
        assert wait_for(lambda: load.first_answer_after(0), 60, 0.25), "the stack answers before any fault"
        time.sleep(2)
        for fault in faults:
            load.phase = fault
            t0 = time.monotonic()
            inject(fault)
            back = time.monotonic()
            # Recovered: a request sent once the process (or broker) is back has been answered.
            answered = wait_for(lambda back=back: load.first_answer_after(back), 60, 0.25)
            recovery[fault] = answered - t0 if answered else None
            time.sleep(3)
        load.phase = "after"
        time.sleep(3)
        load.stop()
        calls = load.calls
        # Let the last workflows end, the reward logger write them and every group commit; only then
        # count episodes (a duplicate written by a late flush would otherwise go unseen).
        late = asyncio.run(_wait_unstalled(bootstrap, 60))
        rows = episodes(stack.dataset_dir)
        results = asyncio.run(completions(bootstrap))
        answered = asyncio.run(answered_steps(bootstrap)) if direct else {}
        queued = asyncio.run(queued_ids(bootstrap))
    finally:
        if load is not None and not load._stop.is_set():
            load.stop()
        stack.stop()
    if direct:
        assert not results, f"{len(results)} step(s) of one-step plans went through the synthesizer"
        answers = sum(c.outcome == "answer" for c in calls)
        assert len(answered) >= answers, f"{len(answered)} steps found on baton.responses for {answers} answers"
        results = answered
    rerun = sorted(t for t, bodies in results.items() if len(bodies) > 1)
    print_table(calls, rows, recovery, rerun, faults)
    found = problems(calls, rows, queued, rerun, late, recovery, DEADLINE_S)
    assert not found, f"{len(found)} problem(s): {found[:10]}"
    return calls


async def _wait_unstalled(bootstrap: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        late = await stalled(bootstrap)
        if not late or time.monotonic() > deadline:
            return late
        await asyncio.sleep(1)


def longest_gap(calls: list[Call]) -> float:
    """The longest time between two answers of `calls` (by when each came back): how long clients saw
    no answer at all during a fault, while requests kept coming."""
    done = sorted(c.done for c in calls if c.outcome == "answer" and c.done)
    return max((b - a for a, b in zip(done, done[1:])), default=0.0)


def print_table(calls: list[Call], rows: Counter, recovery: dict, rerun: list[str], faults: list[str]) -> None:
    phases = ["warm-up", *faults, "after"]
    print("\nfault            sent answered errored (reasons)                                      dup.episodes recover "
          "longest-gap")
    for phase in phases:
        mine = [c for c in calls if c.phase == phase]
        reasons = Counter(c.reason for c in mine if c.outcome != "answer")
        dups = sum(1 for c in mine if rows.get(c.cid, 0) > 1)
        rec = recovery.get(phase)
        print(f"{phase:<16} {len(mine):>4} {sum(c.outcome == 'answer' for c in mine):>8} "
              f"{sum(c.outcome != 'answer' for c in mine):>7} {dict(reasons)!s:<52} {dups:>12} "
              f"{'-' if phase not in recovery else (f'{rec:.1f} s' if rec is not None else 'never'):>7} "
              f"{longest_gap(mine):>9.1f} s")
    dropped = [c for c in calls if c.outcome == "dropped"]
    print(f"connection dropped: {len(dropped)}, of which logged as episodes: {sum(1 for c in dropped if c.cid in rows)}; "
          f"steps re-run after completing: {len(rerun)}")
    keyed = [c for c in calls if c.keyed]
    if not keyed:
        return
    print(f"{KEYED}: {sum(c.retries > 0 for c in keyed)} of {len(keyed)} request(s) retried with their Idempotency-Key "
          f"({sum(c.retries for c in keyed)} retries); workflows logged for them: {sum(rows.get(c.cid, 0) for c in keyed)}")
