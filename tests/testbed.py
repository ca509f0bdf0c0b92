"""Paths and config data the tests share (imported by name: conftest modules cannot be)."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from types import SimpleNamespace

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "config" / "baton.yaml"
ROUTING_DATA = REPO / "data" / "routing"
MMLU_PRO = ROUTING_DATA / "mmlu_pro_dev.csv"



def first_question() -> dict:
    """The first row of the MMLU-Pro outcome matrix the sim workers answer from."""
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        return next(csv.DictReader(f))


def pool(config):
    """What a conductor component is given: the conductor's settings and the workers it plans over."""
    return config.conductor, config.workers


def wait_for(predicate, timeout=30.0, interval=0.3):
    """Poll `predicate` (in a thread-free test: blocking) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def default_config_data(local_model_port: int | None = None) -> dict:
    """The default configuration for a test. Without `local_model_port` it has only the sim workers
    (no model server to start, and no fallback: a question the matrix lacks fails its step); with it,
    the local model worker is kept, served at that port, and the sim workers fall back to it."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    # Tests plan with the fixed plan unless they ask for a model conductor themselves.
    data["conductor"]["backend"] = "static"
    local = [w["name"] for w in data["workers"] if w.get("local_server")]
    if local_model_port is None:
        data["workers"] = [w for w in data["workers"] if not w.get("local_server")]
    for w in data["workers"]:
        if w.get("sim"):
            w["sim"]["dataset"] = str(MMLU_PRO)
            if local_model_port is None and w.get("fallback") in local:
                del w["fallback"]
        if w.get("local_server"):
            w["base_url"] = f"http://127.0.0.1:{local_model_port}/v1"
    # Tests write the config elsewhere: the evaluation sets', the adapter's and the estimate's relative paths would
    # not follow it.
    for eval_set in data.get("reward_logger", {}).get("eval_sets", {}).values():
        eval_set["path"] = str((DEFAULT_CONFIG.parent / eval_set["path"]).resolve())
    transformers = data["conductor"].get("transformers", {})
    if transformers.get("adapter"):
        transformers["adapter"] = str((DEFAULT_CONFIG.parent / transformers["adapter"]).resolve())
    if data["conductor"].get("evidence"):
        data["conductor"]["evidence"] = str((DEFAULT_CONFIG.parent / data["conductor"]["evidence"]).resolve())
    return data


def episodes(dataset_dir: Path, request_ids: Collection[str] | None = None,
             columns: Sequence[str] | None = None) -> list[dict]:
    """The episode rows in a stack's dataset (`Stack.dataset_dir`), only those of `request_ids` when given,
    with only `columns` (and request_id) when given; [] while none is written."""
    import pyarrow.dataset as ds

    root = Path(dataset_dir) / "episodes"
    wanted = None if columns is None else sorted({*columns, "request_id"})
    try:
        rows = ds.dataset(root, format="parquet", partitioning="hive").to_table(columns=wanted).to_pylist()
    except (FileNotFoundError, ValueError):  # no folder yet, or no file in it (pyarrow's errors are ValueErrors)
        return []
    return rows if request_ids is None else [r for r in rows if r["request_id"] in request_ids]


def wait_for_episodes(dataset_dir: Path, want: int | Collection[str], timeout: float = 60,
                      columns: Sequence[str] | None = None) -> list[dict]:
    """`episodes` once `want` are written (a number of rows, or the rows of these request ids: a stack on
    the session's shared broker may log other tests' leftovers too), or as they stand after `timeout`."""
    ids = None if isinstance(want, int) else set(want)
    count = want if isinstance(want, int) else len(want)
    deadline = time.monotonic() + timeout
    while True:
        rows = episodes(dataset_dir, ids, columns)
        if len(rows) >= count or time.monotonic() >= deadline:
            return rows
        time.sleep(0.3)


def episode_of(dataset_dir: Path, request_id: str) -> dict | None:
    """The episode row of one request in a stack's dataset, or None while it is not written yet."""
    return next(iter(episodes(dataset_dir, {request_id})), None)


def dataset_rows(root: str) -> list[dict]:
    """Every row of the parquet dataset at `root` (a directory or a URL), as the reward logger wrote it."""
    import fsspec
    import pyarrow.dataset as ds

    fs, path = fsspec.core.url_to_fs(root)
    files = [f for f in fs.find(path, refresh=True) if f.endswith(".parquet") and "/." not in f]
    if not files:
        return []
    return ds.dataset(files, filesystem=fs, format="parquet", partitioning="hive",
                      partition_base_dir=path).to_table().to_pylist()


def sandbox_available() -> bool:
    """Whether this machine can build the code grader's sandbox (root and util-linux)."""
    from baton_graders.code import SandboxUnavailable, _sandbox_tools

    try:
        _sandbox_tools()
    except SandboxUnavailable:
        return False
    return True


@contextlib.contextmanager
def small_disk(where: Path, size: str = "1m"):
    """A tmpfs of `size` mounted at `where` for the block (mounting needs root): `fill()` writes a filler
    file until writing fails with ENOSPC, `free()` removes it."""
    where = Path(where)
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    assert done.returncode == 0, f"this test mounts a small tmpfs and needs root: {done.stderr}"
    filler = where / "filler"

    def fill() -> None:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for chunk in (1 << 20, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * chunk)
        finally:
            os.close(fd)

    try:
        yield SimpleNamespace(path=where, fill=fill, free=lambda: filler.unlink(missing_ok=True))
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def running_stack(data: dict, run_dir: Path, bootstrap_servers: str | None, *, env: dict[str, str] | None = None,
                  start_timeout: float = 180, secure: bool = False):
    """Every service of `data`'s configuration as its own process on the given broker (or, with
    `secure`, on a SASL_SSL broker with ACLs of the stack's own), the gateway's API and metrics on free
    ports, `env` added to each process's environment; the config is written to `stack.config_file` in
    `run_dir`. Stopped however the block ends."""
    from baton_tools.procs import free_port
    from baton_tools.stack import Stack

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    cfg = Path(run_dir) / "baton.yaml"
    cfg.write_text(yaml.safe_dump(data))
    stack = Stack(run_dir, config_file=cfg, gateway_port=free_port(), bootstrap_servers=bootstrap_servers, env=env,
                  console_port=free_port(), gateway_metrics_port=free_port(), secure=secure)
    stack.start(echo=lambda *_: None, timeout=start_timeout)
    try:
        yield stack
    finally:
        stack.stop()


@contextlib.contextmanager
def two_step_standin_stack(bootstrap_servers: str, run_dir: Path, subtasks: tuple[str, str]):
    """Every service on the broker, planning two steps, `drafter` then `answerer` (which reads the
    draft), both on one OpenAI-compatible stand-in whose URL the stack carries as `standin_url`."""
    from baton_tools.standins.server import run_standin

    with run_standin("openai", mode="subprocess") as standin_url:
        data = default_config_data()
        for name in ("drafter", "answerer"):
            data["workers"].append({"name": name, "provider": "openai_compatible", "model": f"{name}-model",
                                    "base_url": standin_url})
        data["conductor"]["plan"] = {"workers": ["drafter", "answerer"], "subtasks": list(subtasks),
                                     "access": [[], [0]]}
        with running_stack(data, run_dir, bootstrap_servers) as stack:
            stack.standin_url = standin_url
            yield stack


# -- driving services' consumers on a broker ----------------------------------------------------------

BUSES = ("memory", "kafka")


def tracer():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider()


async def settle(seconds: float = 0.5) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def ensure_topics(bootstrap: str, partitions: int = 4) -> None:
    from baton_platform import topics
    from baton_tools.kafka import acreate_topics

    # Every provider the default configuration names (a test may serve a local model's worker).
    counts, configs = topics.topic_plan(partitions, ["sim", "openai_compatible"])
    await acreate_topics(bootstrap, counts, config=configs)


async def skip_backlog(bootstrap: str, group: str, topic: str) -> None:
    """Commit `group`'s offsets on `topic` at its end, so a service started next in that group reads
    only what its test publishes, not every record earlier tests left on the shared broker."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from baton_platform.kafka import partition_ids

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await partition_ids({"bootstrap_servers": bootstrap}, topic)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit(ends)
    finally:
        await consumer.stop()


def kafka_section(bootstrap: str) -> dict:
    """The test configuration's kafka section for a broker at `bootstrap`."""
    return {"bootstrap_servers": bootstrap, "partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def config_for(write_config, bootstrap: str, **sections):
    from baton_platform.config import load_config

    return load_config(write_config({"kafka": kafka_section(bootstrap), **sections}))


async def publish(bootstrap: str, topic: str, key: str, value: bytes, partition: int | None = None) -> None:
    """Write one record as another service would."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode(), partition=partition)
    finally:
        await producer.stop()


class Tap:
    """The records published to one topic from now on (aiokafka ConsumerRecords): read from the
    topic's end on the real broker (`bootstrap`), or handed over by an in-memory subscriber."""

    def __init__(self, bootstrap: str | None, topic: str) -> None:
        self.topic = topic
        self.bootstrap = bootstrap
        self.records: list = []
        self.consumer = None

    async def __aenter__(self) -> Tap:
        if self.bootstrap is None:
            return self
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from baton_platform.kafka import partition_ids

        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, auto_offset_reset="latest")
        await self.consumer.start()
        parts = await partition_ids({"bootstrap_servers": self.bootstrap}, self.topic)
        tps = [TopicPartition(self.topic, p) for p in parts]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve positions now, so nothing published after this is missed
            await self.consumer.position(tp)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def wait(self, predicate=lambda r: True, count: int = 1, timeout: float = 20.0) -> list:
        """The matching records once there are `count` of them, or what matched by the timeout."""
        import asyncio

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matched = [r for r in self.records if predicate(r)]
            if len(matched) >= count:
                return matched
            if self.consumer is None:
                await asyncio.sleep(0.02)
                continue
            batch = await self.consumer.getmany(timeout_ms=300)
            for recs in batch.values():
                self.records.extend(recs)
        return [r for r in self.records if predicate(r)]


def planned_event(rid: str, reply_partition: int = 2, deadline_unix_ms: int = 0) -> bytes:
    """A two-step plan (draft, then a check that reads the draft) for the synthesizer."""
    from baton.v1 import common_pb2, requests_pb2, workflow_pb2
    from baton_workflow import Plan, to_proto

    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       reply_partition=reply_partition, deadline_unix_ms=deadline_unix_ms)
    plan = to_proto(Plan(workers=["gemini-flash", "gemini-pro"], subtasks=["draft", "check"], access=[[], [0]]),
                    backend="static")
    return workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(
        request=request, plan=plan)).SerializeToString()


def completed(rid: str, step: int, output: str) -> bytes:
    """Step `step`'s first attempt of request `rid`, done with `output`."""
    from baton.v1 import common_pb2, workflow_pb2

    return workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
        task_id=f"{rid}:{step}:1", step=step, attempt=1, output=output,
        usage=common_pb2.Usage(calls=1))).SerializeToString()


def header(record, name: str) -> str | None:
    return next((v.decode() for k, v in record.headers if k == name), None)


class Bus:
    """A consumer test's broker: `memory` (FastStream's TestKafkaBroker) or `kafka` (the harness's).
    The same test body runs on both, as FastStream's own tests do with their TestcaseBroker."""

    def __init__(self, kind: str, write_config, bootstrap: str | None) -> None:
        self.kind, self._write_config, self.bootstrap = kind, write_config, bootstrap
        self.config_path: Path | None = None

    def config(self, data: dict | None = None, **sections):
        """The test configuration, on this bus's broker."""
        from baton_platform.config import load_config

        if self.bootstrap is not None:
            sections["kafka"] = kafka_section(self.bootstrap)
        self.config_path = self._write_config(sections, data=data)  # for a CLI the test runs
        return load_config(self.config_path)

    @contextlib.asynccontextmanager
    async def running(self, app, *tapped: str):
        """Run `app` (a service's AsgiFastStream, or the gateway's Starlette app) with a Tap on each of
        `tapped`; yields the taps by topic once the app's consumers own their partitions."""
        from faststream import TestApp
        from faststream.kafka import TestKafkaBroker

        broker = broker_of(app)
        async with contextlib.AsyncExitStack() as stack:
            if self.bootstrap is not None:
                await ensure_topics(self.bootstrap)
            taps = {t: await stack.enter_async_context(Tap(self.bootstrap, t)) for t in tapped}
            if self.bootstrap is None:
                for tap in taps.values():
                    broker.subscriber(tap.topic)(_keeper(tap, broker))
                stack.enter_context(_offsets_in_order())
                await stack.enter_async_context(TestKafkaBroker(broker))
            if hasattr(app, "broker"):
                await stack.enter_async_context(TestApp(app))
            else:
                await stack.enter_async_context(app.router.lifespan_context(app))
            if self.bootstrap is not None:
                await _positioned(broker)
            yield taps

    async def publish(self, app, topic: str, key: str, value: bytes, partition: int | None = None) -> None:
        """Write a record as another service would."""
        if self.bootstrap is None:
            await broker_of(app).publish(value, topic, key=key.encode(), partition=partition)
        else:
            await publish(self.bootstrap, topic, key, value, partition)


@contextlib.contextmanager
def _offsets_in_order():
    """Give FastStream's in-memory records the offsets Kafka would (0, 1, 2... per partition) instead
    of 0 for all: services name files and commit by offset."""
    import dataclasses
    from itertools import count
    from unittest import mock

    from faststream.kafka import testing

    build = testing.build_message
    offsets: dict[tuple[str, int], count] = {}

    async def build_in_order(*args, **kwargs):
        record = await build(*args, **kwargs)
        return dataclasses.replace(record, offset=next(offsets.setdefault((record.topic, record.partition), count())))

    with mock.patch.object(testing, "build_message", build_in_order):
        yield


def broker_of(app):
    """The broker of a service's AsgiFastStream, or of the gateway's Starlette app."""
    return app.broker if hasattr(app, "broker") else app.state.service.broker


async def gateway_metrics(app) -> str:
    """The text of a gateway app's /metrics, which its metrics app serves (the API app does not)."""
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.state.metrics_app),
                                 base_url="http://gw-metrics") as client:
        return (await client.get("/metrics")).text


async def _positioned(broker, timeout: float = 30.0) -> None:
    """Wait until every Kafka consumer of `broker` has partitions and a position in each: a record
    published after this is read (a consumer reading from the end would otherwise miss it)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    for subscriber in broker.subscribers:
        consumer = getattr(subscriber, "consumer", None)
        if not isinstance(consumer, AIOKafkaConsumer):
            continue
        deadline = time.monotonic() + timeout
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no partition of {sorted(consumer.subscription())} assigned in {timeout} s")
            await asyncio.sleep(0.1)
        for tp in consumer.assignment():
            await consumer.position(tp)


def _keeper(tap: Tap, broker):
    async def keep(body: bytes) -> None:
        tap.records.append(broker.context.get_local("message").raw_message)

    return keep
