"""The development Kafka harness: a real KRaft broker from Maven Central jars, driven by aiokafka."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

import baton_tools.kafka as harness
from baton_tools.kafka import LocalKafka, acreate_topics, create_topics, ensure_kafka_libs, stop_pidfile

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def _unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _pid_gone(pid: int) -> bool:
    """The process has exited: it no longer exists, or is a zombie its (adoptive) parent has not
    reaped yet — a detached broker's parent is init, which may take a moment."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalKafka]:
    with LocalKafka() as kafka:
        yield kafka


async def _describe(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    finally:
        await admin.close()


async def test_create_topics_with_explicit_partitions(broker: LocalKafka) -> None:
    events, policy = _unique("h.events"), _unique("h.policy")
    create_topics(
        broker.bootstrap_servers,
        {events: 3, policy: 1},
        config={policy: {"cleanup.policy": "compact"}},
    )
    # Idempotent: existing topics are accepted as they are.
    await acreate_topics(broker.bootstrap_servers, {events: 3, policy: 1})

    assert await _describe(broker.bootstrap_servers, [events, policy]) == {events: 3, policy: 1}

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        assert await producer.partitions_for(events) == {0, 1, 2}
    finally:
        await producer.stop()

    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, policy)])
        entries = {c[0]: c[1] for c in response.resources[0][4]}
    finally:
        await admin.close()
    assert entries["cleanup.policy"] == "compact"


def test_config_for_unknown_topic_is_refused(broker: LocalKafka) -> None:
    with pytest.raises(ValueError):
        create_topics(broker.bootstrap_servers, {"h.a": 1}, config={"h.b": {"cleanup.policy": "compact"}})


async def test_produce_and_consume_through_a_group(broker: LocalKafka) -> None:
    topic = _unique("h.roundtrip")
    await acreate_topics(broker.bootstrap_servers, {topic: 2})

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"payload", key=b"k1")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        group_id=_unique("h.group"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST_GROUP,
    )
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 30)
        assert (message.key, message.value) == (b"k1", b"payload")
        assert (message.partition, message.offset) == (sent.partition, sent.offset)
        await consumer.commit()
        tp = TopicPartition(topic, sent.partition)
        assert await consumer.committed(tp) == sent.offset + 1
    finally:
        await consumer.stop()


async def test_producing_to_an_uncreated_topic_fails(broker: LocalKafka) -> None:
    topic = _unique("h.never-created")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=1500)
    await producer.start()
    try:
        with pytest.raises(KafkaError):
            await producer.send_and_wait(topic, b"x")
    finally:
        await producer.stop()

    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        assert topic not in await admin.list_topics()
    finally:
        await admin.close()


def test_two_brokers_side_by_side_then_stop(broker: LocalKafka) -> None:
    second = LocalKafka().start()
    try:
        ports = {broker.port, broker.controller_port, second.port, second.controller_port}
        assert len(ports) == 4
        assert second.bootstrap_servers != broker.bootstrap_servers
        only_here = _unique("h.second")
        create_topics(second.bootstrap_servers, {only_here: 2})
        assert asyncio.run(_describe(second.bootstrap_servers, [only_here])) == {only_here: 2}
        assert second.pidfile.read_text().strip() == str(second.pid)
    finally:
        pid, port, data_dir = second.pid, second.port, second.data_dir
        second.stop()

    assert pid is not None and _pid_gone(pid)
    assert _port_free(port)
    assert not data_dir.exists()  # it was a temporary folder owned by the broker
    assert second.pid is None
    second.stop()  # idempotent


def test_cached_jars_are_reused_without_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_kafka_libs()

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(harness, "_run_maven", no_maven)
    monkeypatch.setattr(harness.shutil, "which", lambda name: None)
    started = time.perf_counter()
    again = ensure_kafka_libs()
    elapsed = time.perf_counter() - started
    assert again == first
    assert elapsed < 0.5
    assert any(p.name == f"kafka_2.13-{harness.KAFKA_VERSION}.jar" for p in again.iterdir())


# A stand-in for Maven that writes the jars the harness checks for; it records each call, sleeps so
# that two callers overlap, and can fail half-way like an interrupted download.
_FAKE_MAVEN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import baton_tools.kafka as harness

    calls, fail_first = Path(sys.argv[1]), sys.argv[2] == "fail-first"

    def fake_maven(cmd, cwd):
        out = Path(next(a for a in cmd if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"kafka_2.13-{harness.KAFKA_VERSION}.jar").write_bytes(b"")
        with calls.open("a") as fh:
            fh.write("call\\n")
        if fail_first and len(calls.read_text().split()) == 1:
            raise harness.KafkaHarnessError("interrupted")
        time.sleep(1.0)
        for name in ("log4j-core-2.25.5.jar", "log4j-slf4j-impl-2.25.5.jar", "slf4j-api-1.7.36.jar"):
            (out / name).write_bytes(b"")

    harness._run_maven = fake_maven
    try:
        print(harness.ensure_kafka_libs())
    except harness.KafkaHarnessError as exc:
        print("failed:", exc)
    """
)


def _fake_fetch(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "BATON_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", _FAKE_MAVEN, str(tmp_path / "calls"), mode],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_concurrent_first_fetch_runs_maven_once(tmp_path: Path) -> None:
    procs = [_fake_fetch(tmp_path, "ok") for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    libs = tmp_path / "cache" / f"kafka-{harness.KAFKA_VERSION}" / "libs"
    assert outputs == [str(libs), str(libs)]
    assert (tmp_path / "calls").read_text().split() == ["call"]


def test_interrupted_fetch_is_redone(tmp_path: Path) -> None:
    first = _fake_fetch(tmp_path, "fail-first")
    assert first.communicate(timeout=60)[0].startswith("failed:")
    home = tmp_path / "cache" / f"kafka-{harness.KAFKA_VERSION}"
    assert (home / "libs").exists() and not (home / "READY.json").exists()

    second = _fake_fetch(tmp_path, "fail-first")
    assert second.communicate(timeout=60)[0].strip() == str(home / "libs")
    assert (tmp_path / "calls").read_text().split() == ["call", "call"]
    assert "log4j-slf4j-impl-2.25.5.jar" in json.loads((home / "READY.json").read_text())["jars"]


def test_kafka_for_tests_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker.example:9092")
    monkeypatch.setattr(harness, "LocalKafka", None)  # starting anything would fail loudly
    with harness.kafka_for_tests() as bootstrap:
        assert bootstrap == "broker.example:9092"


def test_kafka_for_tests_falls_back_to_a_local_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stub:
        bootstrap_servers = "127.0.0.1:1"
        entered = exited = False

        def __enter__(self) -> Stub:
            Stub.entered = True
            return self

        def __exit__(self, *exc: object) -> None:
            Stub.exited = True

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(harness, "_docker_reachable", lambda: False)
    monkeypatch.setattr(harness, "LocalKafka", Stub)
    with harness.kafka_for_tests() as bootstrap:
        assert bootstrap == "127.0.0.1:1"
        assert Stub.entered and not Stub.exited
    assert Stub.exited


def test_cli_detached_broker_outlives_its_starter_and_keeps_its_topics(tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    cli = [sys.executable, "-m", "baton_tools.kafka"]

    def run_detached() -> str:
        done = subprocess.run(
            [*cli, "run", "--detach", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    bootstrap = run_detached()
    pidfile = data_dir / "kafka.pid"
    pid = int(pidfile.read_text())
    try:
        assert not _pid_gone(pid)  # the CLI has exited, the broker has not
        topic = _unique("h.durable")
        create_topics(bootstrap, {topic: 2})
        assert stop_pidfile(pidfile)
        assert _pid_gone(pid) and not pidfile.exists()
        assert not stop_pidfile(pidfile)

        # Same folder, new ports: the formatted storage and its topics are kept.
        bootstrap = run_detached()
        pid = int(pidfile.read_text())
        assert asyncio.run(_describe(bootstrap, [topic])) == {topic: 2}
    finally:
        stop_pidfile(pidfile)
    assert _pid_gone(pid)


@pytest.fixture
def podman_socket(tmp_path: Path) -> Iterator[str]:
    """podman's Docker-compatible API on a socket of this test's own, stopped by PID afterwards."""
    import shutil

    # `make k8s-test` builds the images first and requires this test to run (BATON_REQUIRE_PODMAN=1);
    # `make test` on a machine without them skips it.
    absent = pytest.fail if os.environ.get("BATON_REQUIRE_PODMAN") else pytest.skip
    if not shutil.which("podman"):
        absent("no podman on this machine: the container path needs a Docker-compatible engine")
    image = os.environ.get("BATON_KAFKA_IMAGE", harness.KAFKA_IMAGE)
    if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
        absent(f"{image} is not built here (`make k8s-images` builds it)")
    sock = tmp_path / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        service.terminate()
        service.wait(30)


def test_kafka_for_tests_runs_the_broker_image_through_testcontainers(
        monkeypatch: pytest.MonkeyPatch, podman_socket: str) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("BATON_KAFKA_HARNESS", raising=False)
    monkeypatch.setenv("DOCKER_HOST", podman_socket)
    monkeypatch.setattr(harness, "LocalKafka", None)  # a fallback to the local broker would fail loudly
    image = os.environ.get("BATON_KAFKA_IMAGE", harness.KAFKA_IMAGE)

    def running() -> list[str]:
        out = subprocess.run(["podman", "--url", podman_socket, "ps", "--filter", f"ancestor={image}",
                              "--format", "{{.ID}}"], capture_output=True, text=True, check=True).stdout
        return out.split()

    with harness.kafka_for_tests() as bootstrap:
        assert len(running()) == 1
        topic = f"tc-{uuid.uuid4().hex[:8]}"
        harness.create_topics(bootstrap, {topic: 1})

        async def round_trip() -> bytes:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"through the container")
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
            await consumer.start()
            try:
                record = await asyncio.wait_for(consumer.getone(), 30)
            finally:
                await consumer.stop()
            return record.value

        assert asyncio.run(round_trip()) == b"through the container"
    assert running() == []
