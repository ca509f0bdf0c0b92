"""A real single-node Apache Kafka broker (KRaft, combined mode) for development and tests.

The broker runs from Maven Central jars on the machine's JDK, so neither a Kafka tarball nor a
Docker engine is needed.  `kafka_for_tests()` picks the cheapest broker available: an external one
named by KAFKA_BOOTSTRAP_SERVERS, a container of the local broker image (testcontainers) when a
Docker-compatible engine answers, else `LocalKafka`.

CLI:
    python -m baton_tools.kafka fetch                 # pre-download the jars, print their folder
    python -m baton_tools.kafka run [--port 9092]     # foreground broker until Ctrl-C
    python -m baton_tools.kafka run --detach --data-dir .baton/kafka --port 9092
    python -m baton_tools.kafka stop --data-dir .baton/kafka
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import concurrent.futures
import contextlib
import fcntl
import functools
import importlib.resources
import json
import logging
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from baton_tools import procs
from baton_tools.kafka_security import ADMIN, BusSecurity

__all__ = [
    "KAFKA_VERSION",
    "KafkaHarnessError",
    "LocalKafka",
    "acreate_topics",
    "cache_root",
    "create_topics",
    "ensure_kafka_libs",
    "kafka_for_tests",
    "stop_pidfile",
]

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"

# Kafka 4.4.0's kafka-server declares log4j-core 2.25.5; the BOM keeps the SLF4J bridge on that
# same release so core, api and bridge never disagree.
_LOG4J_VERSION = "2.25.5"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.11.0"
# Kafka 4.x up to 4.4.0 brings slf4j-api 1.7.36, whose binding is log4j-slf4j-impl.  Should a release
# move to slf4j 2, the copied slf4j-api jar shows it and the copy is redone with the slf4j2 bridge.
_SLF4J1_BINDING = "log4j-slf4j-impl"
_SLF4J2_BINDING = "log4j-slf4j2-impl"
# Bumped whenever the recipe below changes, so caches made by an older recipe are rebuilt.
_RECIPE_REVISION = 1
_MARKER = "READY.json"

_NODE_ID = 1
_MIN_JAVA = 17

_T = TypeVar("_T")


class KafkaHarnessError(RuntimeError):
    """The local broker could not be fetched, started, stopped or prepared."""


# ---------------------------------------------------------------------------------------------
# jars


def cache_root() -> Path:
    configured = os.environ.get("BATON_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "baton"


def _recipe(version: str) -> dict[str, Any]:
    return {
        "revision": _RECIPE_REVISION,
        "kafka_version": version,
        "log4j_version": _LOG4J_VERSION,
        "plugin": _DEPENDENCY_PLUGIN,
    }


def _cached_libs(home: Path, version: str) -> Path | None:
    marker = home / _MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if data.get("recipe") != _recipe(version):
        return None
    libs = home / "libs"
    jars = data.get("jars") or []
    if not jars or not all((libs / jar).is_file() for jar in jars):
        return None
    return libs


def ensure_kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Return a folder holding every jar the broker needs, downloading them once.

    The marker file is written only after a complete copy, so an interrupted download is redone;
    a file lock makes concurrent callers (parallel test sessions, xdist workers) wait for one copy.
    """
    home = cache_root() / f"kafka-{version}"
    cached = _cached_libs(home, version)
    if cached is not None:
        return cached
    home.parent.mkdir(parents=True, exist_ok=True)
    # The lock lives beside the folder, not inside it, because a redo empties the folder.
    with open(home.parent / f"kafka-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            cached = _cached_libs(home, version)
            if cached is not None:
                return cached
            return _download_libs(home, version)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download_libs(home: Path, version: str) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaHarnessError(
            "Maven (`mvn`) is not on PATH; it is needed once to fetch the Kafka broker jars "
            "(Debian: apt-get install maven)"
        )
    _java()  # fail early with the clearer message when there is no usable JDK at all
    home.mkdir(parents=True, exist_ok=True)
    (home / _MARKER).unlink(missing_ok=True)
    libs = home / "libs"
    started = time.monotonic()
    binding = _SLF4J1_BINDING
    for _ in range(2):
        shutil.rmtree(libs, ignore_errors=True)
        pom = home / "pom.xml"
        pom.write_text(
            string.Template(_asset("pom.xml.template")).substitute(
                kafka_version=version, log4j_version=_LOG4J_VERSION, slf4j_binding=binding
            )
        )
        _run_maven(
            [
                mvn,
                "-B",
                "-q",
                # Retry artifacts whose earlier failure Maven cached (e.g. after a network outage).
                "-U",
                "-Dstyle.color=never",
                "-f",
                str(pom),
                f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={libs}",
            ],
            cwd=home,
        )
        slf4j2 = any(libs.glob("slf4j-api-2.*.jar"))
        wanted = _SLF4J2_BINDING if slf4j2 else _SLF4J1_BINDING
        if wanted == binding:
            break
        binding = wanted
    jars = sorted(p.name for p in libs.glob("*.jar"))
    for required in (f"kafka_2.13-{version}.jar", "log4j-core-", f"{binding}-"):
        if not any(jar.startswith(required) for jar in jars):
            raise KafkaHarnessError(f"Maven finished but {required}* is missing from {libs}")
    marker = {"recipe": _recipe(version), "binding": binding, "jars": jars}
    tmp = home / f".{_MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, home / _MARKER)
    log.info("fetched Kafka %s jars into %s in %.1fs", version, libs, time.monotonic() - started)
    return libs


def _run_maven(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaHarnessError(f"Maven did not finish within {exc.timeout:.0f}s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
        # Maven's own diagnosis is the first [ERROR] lines; the rest is generic advice.
        errors: list[str] = []
        for line in output.splitlines():
            if "full stack trace" in line:
                break
            if line.startswith("[ERROR] ") and line[8:].strip():
                errors.append(line)
        detail = "\n".join(errors) if errors else _tail(output.strip(), 40)
        raise KafkaHarnessError(
            f"Maven could not fetch the Kafka jars (exit {proc.returncode}): {' '.join(cmd)}\n{detail}"
        )


def _asset(name: str) -> str:
    return importlib.resources.files("baton_tools").joinpath("kafka_assets", name).read_text()


@functools.cache
def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    java = str(candidate) if candidate is not None and candidate.is_file() else shutil.which("java")
    if java is None:
        raise KafkaHarnessError(
            f"no `java` found (JAVA_HOME or PATH); the Kafka broker needs a JDK {_MIN_JAVA}+"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaHarnessError(f"could not run {java} -version: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        raise KafkaHarnessError(f"could not read the Java version from: {out.stderr.strip()}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < _MIN_JAVA:
        raise KafkaHarnessError(f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java {_MIN_JAVA}+")
    return java


# ---------------------------------------------------------------------------------------------
# helpers


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _new_cluster_id() -> str:
    # Like Kafka's own Uuid.randomUuid(): an id starting with "-" would be parsed as an option.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def run_sync(factory: Callable[[], Awaitable[_T]]) -> _T:
    async def runner() -> _T:
        return await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(runner())
    # A sync call made from inside a running loop (an async test using a sync helper) cannot
    # nest asyncio.run, so the coroutine gets its own loop on a worker thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, runner()).result()


def _is_kafka_process(pid: int) -> bool:
    if not Path("/proc/self").exists():
        return True  # no procfs to ask: trust the pid file
    return b"kafka.Kafka" in (procs.cmdline(pid) or b"")


# ---------------------------------------------------------------------------------------------
# the broker


class LocalKafka:
    """One Kafka broker+controller process on 127.0.0.1, started from the cached jars.

    Ports left as None are picked free at construction, so suites can run side by side; a data
    folder left as None is a temporary one that `stop()` removes.  A given data folder keeps its
    formatted storage (and topics) across restarts.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        heap: str = "512m",
        log_file: Path | None = None,
        *,
        version: str = KAFKA_VERSION,
        server_properties: dict[str, str] | None = None,
        security: BusSecurity | None = None,
        node_id: int = _NODE_ID,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="baton-kafka-")) if data_dir is None else Path(data_dir).absolute()
        )
        # Only when both ports were picked here may a lost race be retried on new ones.
        self._auto_ports = port is None and controller_port is None
        self.port, self.controller_port = self._pick_ports(port, controller_port)
        self.heap = heap
        self.log_file = Path(log_file).absolute() if log_file is not None else self.data_dir / "kafka.log"
        self.version = version
        self.server_properties = dict(server_properties or {})
        # Secured: SASL_SSL on `port`, mutual TLS on `tls_port` (see baton_tools.kafka_security).
        self.security = security
        self.tls_port = procs.free_ports(1)[0] if security is not None else None
        # One node of a KafkaCluster: its id, the quorum's voters, the cluster id and the replication the
        # internal topics get; alone, a quorum of itself.
        self.node_id = node_id
        self.voters = f"{node_id}@127.0.0.1:{self.controller_port}"
        self.cluster_id: str | None = None
        self.replication = 1
        self.pid: int | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _pick_ports(port: int | None, controller_port: int | None) -> tuple[int, int]:
        if port is not None and port == controller_port:
            raise ValueError(f"port and controller_port must differ (both {port})")
        free = [p for p in procs.free_ports(3) if p not in (port, controller_port)]
        return (
            port if port is not None else free.pop(0),
            controller_port if controller_port is not None else free.pop(0),
        )

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_bootstrap_servers(self) -> str | None:
        """The mutual-TLS listener of a secured broker."""
        return f"127.0.0.1:{self.tls_port}" if self.tls_port is not None else None

    def admin_options(self) -> dict:
        """aiokafka options of a principal that may do anything: plaintext, or `admin` when secured."""
        if self.security is None:
            return {"bootstrap_servers": self.bootstrap_servers}
        return self.security.client_options(ADMIN, self.bootstrap_servers)

    @property
    def pidfile(self) -> Path:
        return self.data_dir / "kafka.pid"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "kraft"

    @property
    def running(self) -> bool:
        return self.pid is not None and procs.alive(self.pid)

    def __repr__(self) -> str:
        return f"LocalKafka({self.bootstrap_servers}, pid={self.pid}, data_dir={str(self.data_dir)!r})"

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 120, detach: bool = False) -> LocalKafka:
        """Start the broker and return once it answers admin requests.

        detach=True leaves the broker running after this Python process exits (stop it with
        `stop_pidfile(data_dir / "kafka.pid")`); otherwise it is stopped at interpreter exit and,
        where possible, killed with its parent.
        """
        if self.running:
            return self
        deadline = time.monotonic() + timeout
        libs = ensure_kafka_libs(self.version)
        java = _java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._refuse_if_running()
        attempts = 3 if self._auto_ports else 1
        for attempt in range(1, attempts + 1):
            offset = self._launch(java, libs, deadline, detach)
            spawned = time.monotonic()
            try:
                self._wait_ready(deadline, offset)
            except _PortTaken:
                self._reap()
                if attempt == attempts:
                    raise KafkaHarnessError(
                        f"ports {self.port}/{self.controller_port} stayed busy; log: {self.log_file}\n"
                        + procs.tail(self.log_file, 60, offset)
                    ) from None
                log.info("port race lost on %s/%s, retrying", self.port, self.controller_port)
                self.port, self.controller_port = self._pick_ports(None, None)
                continue
            except BaseException:
                self._reap()
                raise
            self.startup_seconds = time.monotonic() - spawned
            break
        self._started(detach)
        log.info(
            "Kafka %s ready at %s (pid %s) in %.1fs",
            self.version,
            self.bootstrap_servers,
            self.pid,
            self.startup_seconds,
        )
        return self

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM for a clean shutdown, SIGKILL after `timeout`; safe to call repeatedly."""
        atexit.unregister(self._stop_at_exit)
        pid = self.pid
        if pid is not None:
            procs.stop_groups([pid], timeout)
            with contextlib.suppress(OSError, ValueError):
                if int(self.pidfile.read_text().strip()) == pid:
                    self.pidfile.unlink()
        self.pid = None
        self._proc = None
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine would stop it: no clean shutdown, the data directory
        kept for `start` to recover from."""
        atexit.unregister(self._stop_at_exit)
        self._reap()
        with contextlib.suppress(OSError):
            self.pidfile.unlink()

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------------

    def _launch(self, java: str, libs: Path, deadline: float, detach: bool) -> int:
        """Write the config, format the storage once, and spawn the JVM; returns where its log starts."""
        self._write_config()
        self._format(java, libs, deadline)
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._spawn(java, libs, detach)
        return offset

    def _started(self, detach: bool) -> None:
        self.pidfile.write_text(f"{self.pid}\n")
        if not detach:
            atexit.register(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=10)

    def _reap(self) -> None:
        pid = self.pid
        if pid is not None and procs.alive(pid):
            procs.signal_group(pid, signal.SIGKILL)
            procs.stop_groups([pid], 10)
        self.pid = None
        self._proc = None

    def _refuse_if_running(self) -> None:
        try:
            other = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        if procs.alive(other) and _is_kafka_process(other):
            raise KafkaHarnessError(
                f"a Kafka broker (pid {other}) already uses {self.data_dir}; "
                f"stop it first (python -m baton_tools.kafka stop --data-dir {self.data_dir})"
            )
        self.pidfile.unlink(missing_ok=True)

    def _write_config(self) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            # The defaults assume three brokers; with one, groups and transactions never start.
            "offsets.topic.replication.factor": str(self.replication),
            "transaction.state.log.replication.factor": str(self.replication),
            "transaction.state.log.min.isr": str(min(self.replication, 2)),
            "share.coordinator.state.topic.replication.factor": str(self.replication),
            "share.coordinator.state.topic.min.isr": str(min(self.replication, 2)),
            # 50 partitions each (the default) make the first group join or transaction slow on 2 cores.
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": str(self.replication),
            "min.insync.replicas": str(min(self.replication, 2)),
            # One thread each for the network and the requests: the defaults (3 and 8) are sized for
            # a server's cores, and here only add thread hand-offs between a few cores.
            "num.network.threads": "1",
            "num.io.threads": "1",
        }
        if self.security is not None:
            props.update(self.security.broker_properties(self.port, self.tls_port, self.controller_port))
        props.update(self.server_properties)
        body = "".join(f"{key}={value}\n" for key, value in props.items())
        (self.data_dir / "server.properties").write_text(
            "# Written by baton_tools.kafka on every start; edits are overwritten.\n" + body
        )
        (self.data_dir / "log4j2.properties").write_text(_asset("log4j2.properties"))

    def _jvm_common(self, libs: Path) -> list[str]:
        return [
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-Djava.awt.headless=true",
            "-cp",
            f"{libs}/*",  # one argument: the JVM expands the wildcard, a shell must not
        ]

    def _format(self, java: str, libs: Path, deadline: float) -> None:
        if (self.log_dir / "meta.properties").exists():
            return
        cmd = [
            java,
            # A one-shot tool: the C1-only JIT and a small serial heap start fastest.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-Xmx128m",
            *self._jvm_common(libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id or _new_cluster_id(),
            "-c",
            str(self.data_dir / "server.properties"),
            *(self.security.format_args() if self.security is not None else []),
        ]
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=max(10.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaHarnessError(f"formatting Kafka storage in {self.log_dir} timed out") from exc
        with open(self.log_file, "a") as fh:
            fh.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise KafkaHarnessError(
                f"formatting Kafka storage in {self.log_dir} failed (exit {proc.returncode}):\n"
                + _tail(proc.stdout + proc.stderr, 40)
            )

    def _spawn(self, java: str, libs: Path, detach: bool) -> None:
        cmd = [
            java,
            f"-Xmx{self.heap}",
            # A development broker shares a few cores with the services it serves, and it is new for
            # every stack, suite and benchmark: with the default tiered JIT, its C2 compiler threads
            # were most of its CPU in the minutes after a start (a flight recording of a 5-hop relay
            # at 100 messages/s). Only C1 and the serial collector cut its CPU per message there by 40%.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            *self._jvm_common(libs),
            "kafka.Kafka",
            str(self.data_dir / "server.properties"),
        ]
        setpriv = shutil.which("setpriv")
        # PDEATHSIG fires when the forking *thread* ends, so it is only safe from the main thread;
        # it covers a test run killed with SIGKILL, where atexit never runs.
        if not detach and setpriv and threading.current_thread() is threading.main_thread():
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        self._proc = procs.Child("kafka", cmd, log=self.log_file, cwd=self.data_dir).proc
        self.pid = self._proc.pid

    def _wait_ready(self, deadline: float, log_offset: int) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                output = procs.tail(self.log_file, 100_000, log_offset)
                if self._auto_ports and "Address already in use" in output:
                    raise _PortTaken()
                # The first Java exception message names the cause; the tail shows the shutdown.
                cause = next(
                    (line for line in output.splitlines() if re.match(r"^[\w.$]+(Exception|Error): ", line)),
                    "see the log",
                )
                raise KafkaHarnessError(
                    f"Kafka exited with code {code} during start-up: {cause}\n"
                    f"log: {self.log_file}\n{_tail(output, 40)}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaHarnessError(
                    f"Kafka at {self.bootstrap_servers} was not ready in time; log: {self.log_file}\n"
                    + procs.tail(self.log_file, 60, log_offset)
                )
            if procs.port_open(self.port):
                try:
                    probe = functools.partial(_broker_ready, self.admin_options(), min(5.0, remaining), self.node_id)
                    if run_sync(probe):
                        return
                except Exception as exc:  # noqa: BLE001 - any failure here just means "not yet"
                    log.debug("Kafka not ready yet: %r", exc)
            time.sleep(0.1)


class _PortTaken(Exception):
    pass


class KafkaCluster:
    """`size` KRaft nodes on 127.0.0.1, each a broker and a controller of one quorum, with the internal
    topics replicated `size` times (at least 2 in sync): the shape a platform team runs, for the
    tests that lose a broker. `nodes[i]` is a LocalKafka to stop, kill and start on its own; the data
    lives under `root` until `stop()`."""

    def __init__(self, root: Path, size: int = 3, heap: str = "384m") -> None:
        self.root = Path(root).absolute()
        # Every port picked at once: picked node by node, one node's port could be another's.
        ports = procs.free_ports(2 * size)
        self.nodes = [LocalKafka(data_dir=self.root / f"node-{i}", port=ports[2 * i - 2], controller_port=ports[2 * i - 1],
                                 heap=heap, node_id=i) for i in range(1, size + 1)]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        cluster_id = _new_cluster_id()
        for node in self.nodes:
            node.voters, node.cluster_id, node.replication = voters, cluster_id, size

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self, timeout: float = 240) -> KafkaCluster:
        """Start every node, then wait for each: no node is ready before a majority of the quorum runs."""
        deadline = time.monotonic() + timeout
        libs, java = ensure_kafka_libs(), _java()
        offsets = []
        try:
            for node in self.nodes:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                offsets.append(node._launch(java, libs, deadline, detach=False))
            for node, offset in zip(self.nodes, offsets, strict=True):
                node._wait_ready(deadline, offset)
                node._started(detach=False)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def leader(self, topic: str, partition: int) -> int:
        """The node id leading `topic`'s `partition` now."""
        (described,) = await self._describe([topic])
        return next(p["leader"] for p in described["partitions"] if p["partition"] == partition)

    async def under_replicated(self) -> int:
        """Partitions of every topic whose in-sync replicas are fewer than their replicas."""
        return sum(1 for t in await self._describe(None) for p in t.get("partitions", [])
                   if len(p.get("isr", [])) < len(p.get("replicas", [])))

    async def _describe(self, names: list[str] | None, timeout: float = 30) -> list[dict]:
        """Topics described by whichever node answers (`names` None: all), asked again while a stopped
        node is still in the metadata."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.errors import KafkaError

        deadline = time.monotonic() + timeout
        while True:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers.split(","))
            try:
                await admin.start()
                return await admin.describe_topics(names if names is not None else list(await admin.list_topics()))
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await admin.close()


async def _broker_ready(options: dict, timeout: float, node_id: int = _NODE_ID) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options, request_timeout_ms=max(1000, int(timeout * 1000)))
    await asyncio.wait_for(admin.start(), timeout)
    try:
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
    finally:
        await admin.close()
    # A broker is listed only once it has registered and been unfenced, i.e. can host partitions.
    brokers = cluster.get("brokers") or []
    return any(b.get("node_id") == node_id for b in brokers) and cluster.get("controller_id", -1) >= 0


def stop_pidfile(pidfile: Path, timeout: float = 30) -> bool:
    """Stop a detached broker recorded in `pidfile`; True when a live broker was stopped."""
    pidfile = Path(pidfile)
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    stopped = False
    # A stale pid may have been reused by an unrelated process; only a Kafka JVM gets a signal.
    if procs.alive(pid) and _is_kafka_process(pid):
        procs.stop_groups([pid], timeout)
        if procs.alive(pid):
            raise KafkaHarnessError(f"Kafka pid {pid} survived SIGKILL")
        stopped = True
    pidfile.unlink(missing_ok=True)
    return stopped


# ---------------------------------------------------------------------------------------------
# topics


async def acreate_topics(
    bootstrap_servers: str,
    topics: dict[str, int],
    *,
    config: dict[str, dict[str, str]] | None = None,
    timeout: float = 30,
) -> None:
    """Create topics (replication 1) on a development broker and wait for their leaders."""
    from baton_platform.admin import create_topics as create

    await create({"bootstrap_servers": bootstrap_servers}, topics, config=config, timeout=timeout)


def create_topics(
    bootstrap_servers: str,
    topics: dict[str, int],
    *,
    config: dict[str, dict[str, str]] | None = None,
    timeout: float = 30,
) -> None:
    """Blocking form of `acreate_topics`."""
    run_sync(lambda: acreate_topics(bootstrap_servers, topics, config=config, timeout=timeout))


# ---------------------------------------------------------------------------------------------
# picking a broker for tests


def _docker_reachable(timeout: float = 1.0) -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(host[len("unix://") :])
        elif host.startswith("tcp://"):
            address, _, port = host[len("tcp://") :].rstrip("/").rpartition(":")
            sock = socket.create_connection((address, int(port)), timeout=timeout)
        else:
            return False
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(256).split(b"\r\n", 1)[0] + b" "
    except (OSError, ValueError):
        return False


# The broker image `make images` builds (docker/kafka.Dockerfile): the same jars as LocalKafka.
KAFKA_IMAGE = "ghcr.io/baton-llm/baton-kafka:0.1.0"


def _kafka_container() -> tuple[Any, str] | None:
    """A container of the local broker image and the address clients reach it at, not started;
    None without the `testcontainers` package."""
    # Ryuk, testcontainers' reaper, is an image from Docker Hub; the harness stops its own container.
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        from docker.types import Ulimit
        from testcontainers.core.container import DockerContainer
    except ImportError:
        return None
    import resource

    port, controller_port = procs.free_ports(2)
    # Host networking: the broker listens on a loopback port picked here, so the address it
    # advertises is the one clients use (a mapped port would be known only after the start).
    # Explicit limits: an engine's defaults (podman's are the host's maximum) may exceed what its
    # runtime is allowed to set. The broker needs this process's open files and a few hundred threads.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limits = [Ulimit(name="nofile", soft=nofile, hard=nofile), Ulimit(name="nproc", soft=4096, hard=4096)]
    container = (
        DockerContainer(os.environ.get("BATON_KAFKA_IMAGE", KAFKA_IMAGE))
        .with_kwargs(network_mode="host", ulimits=limits)
        .with_envs(KAFKA_DATA="/tmp/kafka", KAFKA_ADVERTISED_HOST="127.0.0.1", KAFKA_PORT=str(port),
                   KAFKA_CONTROLLER_PORT=str(controller_port), KAFKA_CLUSTER_ID=_new_cluster_id(),
                   KAFKA_HEAP_OPTS="-Xmx512m")
    )
    return container, f"127.0.0.1:{port}"


def _wait_container_ready(container: Any, bootstrap: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = container.get_wrapped_container()
        status.reload()
        if status.status == "exited":
            raise KafkaHarnessError(f"the Kafka container exited: {container.get_logs()[1][-2000:]!r}")
        try:
            if run_sync(functools.partial(_broker_ready, {"bootstrap_servers": bootstrap}, 5.0)):
                return
        except Exception as exc:  # noqa: BLE001 - any failure here just means "not yet"
            log.debug("Kafka container not ready yet: %r", exc)
        time.sleep(0.5)
    raise KafkaHarnessError(f"the Kafka container at {bootstrap} was not ready in {timeout:g} s")


@contextlib.contextmanager
def kafka_for_tests() -> Iterator[str]:
    """Yield bootstrap servers of a broker that lives for the block.

    KAFKA_BOOTSTRAP_SERVERS wins (nothing is started); then a container of the local broker image,
    through testcontainers, when a Docker-compatible engine answers at DOCKER_HOST (Docker, or
    `podman system service`); otherwise a `LocalKafka`.  BATON_KAFKA_HARNESS=local skips the probe.
    """
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        yield external
        return
    made = None
    if os.environ.get("BATON_KAFKA_HARNESS", "auto") != "local" and _docker_reachable():
        made = _kafka_container()
    if made is not None:
        container, bootstrap = made
        try:
            container.start()
            _wait_container_ready(container, bootstrap)
        except Exception as exc:  # noqa: BLE001 - e.g. the image is not built and cannot be pulled offline
            log.warning("testcontainers could not start Kafka (%s); starting a local broker", exc)
            with contextlib.suppress(Exception):
                container.stop()
            made = None
    if made is not None:
        container, bootstrap = made
        log.info("Kafka in container %s at %s", container.get_wrapped_container().short_id, bootstrap)
        try:
            yield bootstrap
        finally:
            container.stop()
        return
    with LocalKafka() as broker:
        yield broker.bootstrap_servers


# ---------------------------------------------------------------------------------------------
# CLI


def _cmd_fetch(args: argparse.Namespace) -> int:
    started = time.monotonic()
    libs = ensure_kafka_libs(args.version)
    print(libs)
    print(f"ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    if args.detach and args.data_dir is None:
        print("--detach needs --data-dir (the pid file lives there)", file=sys.stderr)
        return 2
    broker = LocalKafka(
        data_dir=args.data_dir,
        port=args.port,
        controller_port=args.controller_port,
        heap=args.heap,
        log_file=args.log_file,
        version=args.version,
    )
    broker.start(timeout=args.timeout, detach=args.detach)
    print(broker.bootstrap_servers, flush=True)
    print(f"pid {broker.pid}, log {broker.log_file}", file=sys.stderr)
    if args.detach:
        print(f"stop with: python -m baton_tools.kafka stop --data-dir {broker.data_dir}", file=sys.stderr)
        return 0

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        assert broker._proc is not None
        code = broker._proc.wait()
        print(
            f"Kafka exited on its own (code {code}):\n{procs.tail(broker.log_file, 30)}", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print("stopping Kafka", file=sys.stderr)
        return 0
    finally:
        broker.stop()


def _cmd_stop(args: argparse.Namespace) -> int:
    pidfile = args.pidfile or (args.data_dir / "kafka.pid" if args.data_dir else None)
    if pidfile is None:
        print("give --data-dir or --pidfile", file=sys.stderr)
        return 2
    stopped = stop_pidfile(pidfile, timeout=args.timeout)
    print("stopped" if stopped else "no running broker", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m baton_tools.kafka", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    fetch = sub.add_parser("fetch", help="download the broker jars into the cache and print their folder")
    fetch.add_argument("--version", default=KAFKA_VERSION)
    fetch.set_defaults(func=_cmd_fetch)

    run = sub.add_parser("run", help="run a broker; prints its bootstrap servers")
    run.add_argument("--port", type=int)
    run.add_argument("--controller-port", type=int)
    run.add_argument("--data-dir", type=Path)
    run.add_argument("--log-file", type=Path)
    run.add_argument("--heap", default="512m")
    run.add_argument("--timeout", type=float, default=120)
    run.add_argument("--version", default=KAFKA_VERSION)
    run.add_argument("--detach", action="store_true", help="leave the broker running and exit")
    run.set_defaults(func=_cmd_run)

    stop = sub.add_parser("stop", help="stop a detached broker")
    stop.add_argument("--data-dir", type=Path)
    stop.add_argument("--pidfile", type=Path)
    stop.add_argument("--timeout", type=float, default=30)
    stop.set_defaults(func=_cmd_stop)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except KafkaHarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
