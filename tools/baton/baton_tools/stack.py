"""Run the whole suite on one machine: Kafka plus every service as its own process, plus a local
model server for each worker that has a `local_server` section (see `model_servers`).

`make up` starts a detached stack and records it in `.baton/run/stack.json`; `make down` stops
exactly what that file names. Tests and `make demo` use the same class in the foreground.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from baton_platform import acls, topics
from baton_platform.admin import create_topics
from baton_platform.config import BatonConfig, load_config
from baton_platform.kafka import servers
from baton_tools import kafka as kafka_harness
from baton_tools import model_servers, procs
from baton_tools.kafka_security import BusSecurity, wait_until_granted

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = REPO_ROOT / "config" / "baton.yaml"


def config_path() -> Path:
    """BATON_CONFIG when set, else the default configuration that ships with the project."""
    return Path(os.environ.get("BATON_CONFIG") or DEFAULT_CONFIG).resolve()


@dataclass
class ServiceProc:
    name: str
    module: str
    port: int
    args: list[str] = field(default_factory=list)
    pid: int | None = None
    log: str = ""
    # A process that is not one of Baton's modules (a model server): its whole command line, the
    # environment it needs beside ours, where it says it is ready, and how long it may take.
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health/ready"
    start_timeout_s: float | None = None
    # A Baton module run by another interpreter than ours (the router in the vLLM environment).
    python: str | None = None
    # Where its /metrics are when not on `port` (the gateway's, on gateway.metrics_port).
    metrics_port: int | None = None

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.ready_path}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port or self.port}/metrics"

    @property
    def command(self) -> list[str]:
        return self.argv or [self.python or sys.executable, "-m", self.module, *self.args]


def plan_services(config: BatonConfig, gateway_port: int, console_port: int, gateway_metrics_port: int | None = None,
                  pick_port=procs.free_port) -> list[ServiceProc]:
    """One process per service; one executor per provider in use, times its `replicas`."""
    procs = [
        ServiceProc("gateway", "baton_gateway.main", gateway_port,
                    metrics_port=gateway_metrics_port or config.gateway.metrics_port),
        ServiceProc("console", "baton_console.main", console_port),
        ServiceProc("router", "baton_router.main", pick_port()),
        ServiceProc("synthesizer", "baton_synthesizer.main", pick_port()),
        ServiceProc("reward-logger", "baton_reward_logger.main", pick_port()),
    ]
    for provider in config.providers:
        replicas = max(w.replicas for w in config.workers if w.provider == provider)
        for i in range(replicas):
            port = pick_port()
            procs.append(ServiceProc(f"executor-{provider}-{i}", "baton_executor.main", port,
                                     ["--provider", provider, "--port", str(port)]))
    return procs


def run_router_on_vllm(router: ServiceProc, echo=print) -> None:
    """A router whose conductor is vLLM's engine in process runs from the vLLM environment (vLLM's CPU
    build pins torch and transformers apart from the workspace's), which also holds the router's packages."""
    echo("setting up vLLM for the router's conductor (CPU build; cached after the first time)...")
    install = model_servers.ensure_vllm(echo)
    router.python, router.env = str(install.python), dict(model_servers.ENGINE_ENV)
    # Importing vLLM and starting its engine processes takes minutes on a busy small machine.
    router.start_timeout_s = 900


def plan_model_servers(config: BatonConfig, echo=print) -> list[ServiceProc]:
    """One vLLM server per worker with a `local_server` section; installs vLLM on first use."""
    served = model_servers.served_workers(config)
    if not served:
        return []
    for w in served:
        _, port = model_servers.listen_address(w)
        if procs.port_open(port):
            raise RuntimeError(f"worker {w.name!r}: port {port} of its base_url {w.base_url} is already in use "
                               f"(another model server, or a stack still up: `make down`)")
    echo("setting up the local model server (vLLM, CPU build; cached after the first time)...")
    install = model_servers.ensure_vllm(echo)
    servers = []
    for w in served:
        argv, env = model_servers.vllm_command(w, install)
        _, port = model_servers.listen_address(w)
        servers.append(ServiceProc(f"model-{w.name}", "vllm", port, argv=argv, env=env, ready_path="/health",
                                   start_timeout_s=w.local_server.start_timeout_s))
    return servers


class Stack:
    def __init__(self, run_dir: Path, *, config_file: Path | None = None, gateway_port: int | None = None,
                 bootstrap_servers: str | None = None, env: dict[str, str] | None = None,
                 dataset_dir: Path | None = None, console_port: int | None = None,
                 gateway_metrics_port: int | None = None, secure: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.config_file = Path(config_file or config_path()).resolve()
        self.config = load_config(self.config_file)
        self.gateway_port = gateway_port if gateway_port is not None else self.config.gateway.port
        self.console_port = console_port if console_port is not None else self.config.console.port
        # The gateway's /metrics are on a port of their own (gateway.metrics_port), apart from its API.
        self.gateway_metrics_port = (gateway_metrics_port if gateway_metrics_port is not None
                                     else self.config.gateway.metrics_port)
        self.bootstrap_servers = bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None
        self.extra_env = env or {}
        # Secured bus: the stack's broker runs SASL_SSL with ACLs, and each service connects as itself.
        if secure and self.bootstrap_servers is not None:
            raise ValueError("a secured stack runs its own broker: unset KAFKA_BOOTSTRAP_SERVERS")
        self.security = BusSecurity.create(self.run_dir / "kafka-pki", list(acls.table(self.config.providers))) \
            if secure else None
        self.dataset_dir = Path(dataset_dir or self.run_dir / "data").resolve()
        self.kafka: kafka_harness.LocalKafka | None = None
        self.services: list[ServiceProc] = []
        self._children: list[subprocess.Popen] = []
        self._kafka_pidfile: str | None = None  # the broker of a stack attached to (`attach`)

    @property
    def state_file(self) -> Path:
        return self.run_dir / "stack.json"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    @property
    def gateway_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_metrics_port}/metrics"

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    # -- start ---------------------------------------------------------------------------------

    def start(self, *, detach: bool = False, timeout: float = 180, echo=print) -> Stack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        if procs.port_open(self.gateway_port):
            # Another gateway there (a stack still up, or `make k8s-up`'s forward) would answer this
            # stack's readiness checks and clients while this one's gateway failed to bind.
            raise RuntimeError(f"port {self.gateway_port} (gateway.port) is already in use: stop what listens there "
                               "(`make down`, `make k8s-down`) or choose another port")
        if procs.port_open(self.gateway_metrics_port):
            raise RuntimeError(f"port {self.gateway_metrics_port} (gateway.metrics_port) is already in use: stop what "
                               "listens there (`make down`, `make k8s-down`) or choose another port")
        try:
            # Model servers first: they take longest to be ready (importing vLLM alone takes a minute).
            self.services = plan_model_servers(self.config, echo)
            for svc in self.services:
                self._spawn(svc, detach)
            if self.services:
                echo(f"starting {', '.join(s.name for s in self.services)} (vLLM: minutes on a busy "
                     "machine)...")
                self._write_state()
            if self.bootstrap_servers is None:
                echo(f"starting Kafka (KRaft, single node{', SASL_SSL with ACLs' if self.security else ''})...")
                self.kafka = kafka_harness.LocalKafka(data_dir=self.run_dir / "kafka", log_file=self.run_dir / "logs" / "kafka.log",
                                                      security=self.security)
                self.kafka.start(timeout=timeout, detach=detach)
                self.bootstrap_servers = self.kafka.bootstrap_servers
            self._prepare_bus()
            services = plan_services(self.config, self.gateway_port, self.console_port, self.gateway_metrics_port)
            if self.config.conductor.backend == "vllm":
                run_router_on_vllm(next(s for s in services if s.name == "router"), echo)
            self.services += services
            for svc in services:
                self._spawn(svc, detach)
            self._write_state()
            echo(f"starting {len(services)} services...")
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_bus(self) -> None:
        """The suite's topics and, on a secured broker, its ACLs (as `admin`)."""
        options = self.kafka.admin_options() if self.kafka else {"bootstrap_servers": servers(self.bootstrap_servers)}
        counts, configs = topics.topic_plan_for(self.config)
        kafka_harness.run_sync(lambda: create_topics(options, counts, config=configs,
                                                     replication_factor=self.config.kafka.replication_factor))
        if self.security is not None:
            kafka_harness.run_sync(lambda: acls.apply(options, acls.grants(self.config.providers)))
            gateway = self.security.client_options(acls.identity("gateway"), self.bootstrap_servers)
            kafka_harness.run_sync(lambda: wait_until_granted(gateway, topics.REQUESTS))

    def _env(self, svc: ServiceProc) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        if svc.argv:
            return {**env, **svc.env, "PYTHONUNBUFFERED": "1"}
        env.update(svc.env)
        env.update({
            "BATON_CONFIG": str(self.config_file),
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers or "",
            "BATON_GATEWAY__PORT": str(self.gateway_port),
            "BATON_GATEWAY__METRICS_PORT": str(self.gateway_metrics_port),
            "BATON_CONSOLE__PORT": str(self.console_port),
            "BATON_REWARD_LOGGER__DATASET_DIR": str(self.dataset_dir),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("BATON_KAFKA__BOOTSTRAP_SERVERS", None)
        if self.security is not None:
            # executor-<provider>-<i> connects as executor-<provider>; every other service by its name.
            role = svc.name.rsplit("-", 1)[0] if svc.name.startswith("executor-") else svc.name
            env.update(self.security.client_env(acls.identity(role), self.bootstrap_servers or ""))
        section = {"router": "ROUTER", "synthesizer": "SYNTHESIZER", "reward-logger": "REWARD_LOGGER"}.get(svc.name)
        if section:
            env[f"BATON_{section}__PORT"] = str(svc.port)
        return env

    def _spawn(self, svc: ServiceProc, detach: bool) -> None:
        log_path = self.run_dir / "logs" / f"{svc.name}.log"
        svc.log = str(log_path)
        child = procs.Child(svc.name, svc.command, log=log_path, env=self._env(svc), cwd=self.run_dir)
        svc.pid = child.pid
        if not detach:
            self._children.append(child.proc)

    def _wait_ready(self, timeout: float) -> None:
        started = time.monotonic()
        waiting = list(self.services)
        while waiting:
            for svc in list(waiting):
                if not procs.alive(svc.pid):
                    raise RuntimeError(f"{svc.name} exited during start; its log ({svc.log}) ends:\n{procs.tail(svc.log)}")
                if procs.http_ok(svc.ready_url):
                    waiting.remove(svc)
                elif time.monotonic() - started > max(timeout, svc.start_timeout_s or 0):
                    raise TimeoutError(f"not ready after {time.monotonic() - started:.0f} s: {svc.name}; "
                                       f"its log ({svc.log}) ends:\n{procs.tail(svc.log, 10)}")
            time.sleep(0.3)
        # A service that exited at once (its port taken) can look ready while something else answers on
        # its port: every one must still run once all are.
        gone = [svc for svc in self.services if not procs.alive(svc.pid)]
        if gone:
            raise RuntimeError(f"{gone[0].name} exited during start; its log ({gone[0].log}) ends:\n"
                               f"{procs.tail(gone[0].log)}")

    def _write_state(self) -> None:
        state = {
            "bootstrap_servers": self.bootstrap_servers,
            "kafka_pidfile": str(self.kafka.pidfile) if self.kafka else self._kafka_pidfile,
            # What a restart of one service needs to start it as `up` did.
            "config_file": str(self.config_file),
            "dataset_dir": str(self.dataset_dir),
            "gateway_port": self.gateway_port,
            "gateway_metrics_port": self.gateway_metrics_port,
            "console_port": self.console_port,
            "secure": self.security is not None,
            "services": [asdict(s) for s in self.services],
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, timeout: float = 20) -> None:
        procs.stop_groups([s.pid for s in self.services if s.pid], timeout)
        for proc in self._children:
            proc.poll()
        if self.kafka is not None:
            self.kafka.stop()
        self.state_file.unlink(missing_ok=True)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> ServiceProc:
        svc = next(s for s in self.services if s.name == name)
        procs.signal_group(svc.pid, sig)
        return svc

    def restart(self, name: str, timeout: float = 60, detach: bool = False) -> ServiceProc:
        """Start service `name` again (stopping it first if it still runs), same port and arguments,
        and wait until it is ready. The state file, if there is one, records its new process."""
        svc = next((s for s in self.services if s.name == name), None)
        if svc is None:
            raise KeyError(f"no service {name!r} in this stack; its services: {', '.join(s.name for s in self.services)}")
        if procs.alive(svc.pid):
            procs.stop_groups([svc.pid])
        self._spawn(svc, detach=detach)
        if self.state_file.exists():
            self._write_state()
        procs.wait_http_ok(svc.ready_url, svc.pid, name, svc.log, max(timeout, svc.start_timeout_s or 0))
        return svc

    @classmethod
    def attach(cls, run_dir: Path) -> Stack:
        """The detached stack recorded in run_dir (by `baton up`), to restart one of its services."""
        state_file = Path(run_dir) / "stack.json"
        if not state_file.exists():
            raise FileNotFoundError(f"no running stack recorded in {state_file}")
        state = json.loads(state_file.read_text())
        stack = cls(run_dir, config_file=Path(state["config_file"]) if state.get("config_file") else None,
                    gateway_port=state["gateway_port"], bootstrap_servers=state["bootstrap_servers"],
                    console_port=state.get("console_port"), gateway_metrics_port=state.get("gateway_metrics_port"),
                    dataset_dir=Path(state["dataset_dir"]) if state.get("dataset_dir") else None)
        stack.services = [ServiceProc(**s) for s in state["services"]]
        if state.get("secure"):
            stack.security = BusSecurity.create(stack.run_dir / "kafka-pki", [])
        stack._kafka_pidfile = state.get("kafka_pidfile")
        return stack


def down(run_dir: Path) -> bool:
    """Stop a detached stack recorded in run_dir; True when there was one."""
    state_file = Path(run_dir) / "stack.json"
    if not state_file.exists():
        return False
    state = json.loads(state_file.read_text())
    procs.stop_groups([s["pid"] for s in state["services"] if s.get("pid")])
    if state.get("kafka_pidfile"):
        kafka_harness.stop_pidfile(Path(state["kafka_pidfile"]))
    state_file.unlink(missing_ok=True)
    return True
