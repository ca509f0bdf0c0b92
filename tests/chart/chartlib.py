"""Helpers of the chart tests: Helm built by tools/helm.sh (pinned, never skipped when absent) and
the rendered objects, cached per set of values."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "baton"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
# The values `make k8s-up` installs the chart with on the local cluster.
LOCAL_VALUES = ROOT / "tools" / "k8s" / "values-local.yaml"
RELEASE = "rel"
NAMESPACE = "baton"
# The Kubernetes version the chart is rendered and validated for (the oldest it supports is in Chart.yaml).
KUBE_VERSION = "1.34.0"

# The images' console scripts, by container name, as the chart should run them.
SERVICE_COMMANDS = {
    "gateway": "baton-gateway",
    "router": "baton-router",
    "synthesizer": "baton-synthesizer",
    "executor": "baton-executor",
    "reward-logger": "baton-reward-logger",
    "console": "baton-console",
}


@functools.cache
def helm_binary() -> str:
    """Path of the pinned Helm; builds it on first use (minutes) and fails loudly if it cannot."""
    proc = subprocess.run(["bash", str(ROOT / "tools" / "helm.sh")], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"tools/helm.sh could not provide helm (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                    pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr}", pytrace=False)
    return proc


def template_args(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def render(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> tuple[dict, ...]:
    """The objects `helm template` renders for these values files and --set overrides (cached)."""
    out = run_helm(*template_args(values_files, sets)).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def render_error(values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """The error `helm template` stops with; fails the test if rendering succeeds."""
    proc = run_helm(*template_args(values_files, sets), check=False)
    assert proc.returncode != 0, f"expected rendering to fail for {values_files} {sets}"
    return proc.stderr


def by_kind(objects, kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(obj: dict) -> dict | None:
    """The pod spec of a workload object, or None for other kinds."""
    kind = obj["kind"]
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return obj["spec"]["template"]["spec"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def pod_labels(obj: dict) -> dict:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return obj["spec"]["template"]["metadata"]["labels"]


def baton_config(objects) -> dict:
    """The BATON_CONFIG file of the release, parsed."""
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == RELEASE + "-baton"]
    return yaml.safe_load(cm["data"]["baton.yaml"])
