"""The local cluster `make k8s-up` started: kubectl against its kubeconfig, the gateway's address,
the provider stand-in's counters, and steady load through the official openai client."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".baton" / "k8s"
KUBECONFIG = STATE / "kubeconfig"
NAMESPACE = "baton"
RELEASE = "baton"


def kubectl(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def gateway_url() -> str:
    return (STATE / "gateway-url").read_text().strip()


def client(timeout: float = 150) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url(), api_key=(STATE / "api-key").read_text().strip(),
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
    """Steady load: `workers` threads each send one chat request after another until stopped."""

    workers: int = 3
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        prompts = matrix_prompts()
        for n in range(self.workers):
            thread = threading.Thread(target=self._run, args=(prompts[n::self.workers],), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, prompts: list[str]) -> None:
        chat = client()
        i = 0
        while not self._stop.is_set():
            prompt = prompts[i % len(prompts)]
            i += 1
            try:
                reply = chat.chat.completions.create(model="baton", messages=[{"role": "user", "content": prompt}])
                text = reply.choices[0].message.content or ""
                if not text.strip():
                    raise ValueError("empty answer")
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}"[:300])

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=200)

    def report(self, what: str) -> str:
        line = f"{what}: {self.ok} answered, {len(self.failures)} failed"
        print(line)
        return line
