"""The local cluster `make k8s-up` started: kubectl against its kubeconfig, the gateway's address,
the provider stand-in's counters, and steady load through the official openai client."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
import yaml

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".baton" / "k8s"
KUBECONFIG = STATE / "kubeconfig"
# The pinned kubectl tools/k8s/build.sh makes (tools/k8s/env.sh's BIN), not the machine's own.
KUBECTL = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "baton" / "k8s" / "bin" / "kubectl"
NAMESPACE = "baton"
KAFKA_NAMESPACE = "baton-kafka"  # tools/k8s/manifests/kafka.yaml
RELEASE = "baton"
CHART = ROOT / "charts" / "baton"
VALUES = ROOT / "tools" / "k8s" / "values-local.yaml"  # the release as tools/k8s/up.sh installs it


def kubectl(*args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(KUBECTL), "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def helm(*args: str, timeout: float = 1200) -> str:
    done = subprocess.run([str(ROOT / ".tools" / "bin" / "helm"), "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE,
                           *args], capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def upgrade_release(values: dict, path: Path) -> None:
    """`helm upgrade --wait` of the release: the local values with `values` over them (written to `path`)."""
    path.write_text(yaml.safe_dump(values))
    helm("upgrade", RELEASE, str(CHART), "-f", str(VALUES), "-f", str(path), "--wait", "--timeout", "15m")


def release_deployments() -> list[str]:
    """The Deployments the chart made (not the stand-in's)."""
    items = kubectl_json("get", "deployments", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    return sorted(d["metadata"]["name"] for d in items)


def rolled_out(deployment: str) -> bool:
    """Every replica runs the Deployment's current template and is Ready; no old pod is left."""
    d = kubectl_json("get", "deployment", deployment)
    want, status = d["spec"].get("replicas", 1), d["status"]
    return (status.get("observedGeneration", 0) >= d["metadata"]["generation"]
            and status.get("updatedReplicas", 0) == want and status.get("readyReplicas", 0) == want
            and status.get("replicas", 0) == want)  # fmt: skip


def gateway_url() -> str:
    return (STATE / "gateway-url").read_text().strip()


def client(timeout: float = 150, key: str = "api-key") -> openai.OpenAI:
    """The official client on the forwarded gateway, with the developer's key or the `eval-key`."""
    return openai.OpenAI(base_url=gateway_url(), api_key=(STATE / key).read_text().strip(),
                         timeout=timeout, max_retries=0)  # fmt: skip


def standin_stats() -> dict:
    """The stand-in's counters, read through the API server's service proxy."""
    raw = kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/services/baton-standin:8000/proxy/_standin/stats")
    return json.loads(raw)


def matrix_prompts() -> list[str]:
    """Questions the sim workers know: the slice of the routing matrix the cluster was given."""
    csv.field_size_limit(sys.maxsize)
    with (STATE / "matrix.csv").open(newline="", encoding="utf-8") as f:
        return [row["prompt"] for row in csv.DictReader(f)]


def ready_replicas(deployment: str) -> int:
    return kubectl_json("get", "deployment", deployment)["status"].get("readyReplicas", 0)


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


@dataclass
class Load:
    """Steady load: `workers` threads each send one chat request after another until stopped, together
    at most `rate` requests a second (None: as fast as answers come). Every request is counted: sent,
    then answered or failed; none is retried."""

    workers: int = 3
    rate: float | None = None
    sent: int = 0
    ok: int = 0
    started: float = 0.0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        prompts = matrix_prompts()
        for n in range(self.workers):
            thread = threading.Thread(target=self._run, args=(prompts[n::self.workers] or prompts,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, prompts: list[str]) -> None:
        chat = client()
        gap = self.workers / self.rate if self.rate else 0.0
        i = 0
        while not self._stop.is_set():
            prompt = prompts[i % len(prompts)]
            i += 1
            began = time.monotonic()
            with self._lock:
                self.sent += 1
            try:
                reply = chat.chat.completions.create(model="baton", messages=[{"role": "user", "content": prompt}])
                text = reply.choices[0].message.content or ""
                if not text.strip():
                    raise ValueError("empty answer")
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with self._lock:
                    cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}{cause}"[:300])
            self._stop.wait(max(0.0, gap - (time.monotonic() - began)))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=200)
        self.seconds = time.monotonic() - self.started

    def report(self, what: str) -> str:
        line = (f"{what}: {self.sent} sent, {self.ok} answered, {len(self.failures)} failed "
                f"in {self.seconds:.0f}s ({self.sent / self.seconds:.1f} req/s)")
        print(line)
        return line
