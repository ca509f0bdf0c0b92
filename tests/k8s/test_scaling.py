"""The README's capacity table, checked at a small scale on the cluster: the rate a one-step workflow is
held at grows when the gateway and the executor go from 1 to 2 replicas.

On this 2-core node the whole stack, the broker, the control plane and the load generator share the
same cores, so a replica of an unlimited service is never what binds. Here each gateway and sim
executor replica gets a CPU limit of `LIMIT` instead, as a replica gets a core in the table: a replica
is then the bottleneck, and a second one should nearly double the rate, as far as the rest of the node
keeps up. The load is closed-loop (`Load` with no rate): as many requests a second as answers come.

Alongside, the containers' CPU counters give each service's CPU per workflow on the cluster, to read
against the table's (which were measured with tracing at 10% and on an `openai_compatible` executor;
this cluster exports no traces and the step runs on the `sim` one). Runs after test_learning.py and
before test_uninstall.py, which removes what this upgrade changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from .cluster import (
    KAFKA_NAMESPACE,
    NAMESPACE,
    RELEASE,
    VALUES,
    Load,
    kubectl,
    kubectl_json,
    ready_replicas,
    release_deployments,
    upgrade_release,
    wait_until,
)

GATEWAY, EXECUTOR = f"{RELEASE}-gateway", f"{RELEASE}-executor-sim"
SCALED = (GATEWAY, EXECUTOR)
LIMIT_CORES = 0.1
CGROUP = Path("/sys/fs/cgroup/cpuacct/k8s.io")  # the kubelet's cgroupfs layout (tools/k8s/up.sh)
LIMIT = f"{int(LIMIT_CORES * 1000)}m"
WORKER = "gemini-flash"
WARMUP, WINDOW = 5, 20  # seconds of load before the rate is counted, and seconds it is counted over
IDLE = 10  # seconds the idle stack is read over
THREADS = 32  # closed-loop clients: enough to keep the throttled replicas busy (48 held no more)
GAIN = 1.2  # the least rate ratio (2 replicas / 1) that counts as scaling: 1.42-1.75 measured in ten runs


def limited_one_step() -> dict:
    """One sim step on `WORKER` (no provider rpm in the way: its limit is raised), and each gateway and
    sim-executor pod limited to `LIMIT` of CPU, one replica each."""
    workers = yaml.safe_load(VALUES.read_text())["config"]["workers"]
    for worker in workers:
        if worker["name"] == WORKER:
            worker["limits"] = {"rpm": 600_000, "concurrency": 64}
    limited = {"requests": {"cpu": LIMIT, "memory": "128Mi"}, "limits": {"cpu": LIMIT, "memory": "512Mi"}}
    return {
        "config": {"workers": workers, "conductor": {"plan": {
            "workers": [WORKER], "subtasks": ["Answer the question with a single option letter."], "access": [[]]}}},
        "gateway": {"replicaCount": 1, "resources": limited},
        "executors": {"sim": {"replicaCount": 1, "resources": limited, "autoscaling": {"enabled": False}}},
    }  # fmt: skip


def cpu_seconds() -> dict[str, float]:
    """CPU seconds each pod of the release and the broker has used, from its containers' cgroups on this
    machine, the cluster's one node (the API server does not proxy to a node on a loopback address, so
    the kubelet's summary is out of reach)."""
    used: dict[str, float] = {}
    for namespace in (NAMESPACE, KAFKA_NAMESPACE):
        for pod in kubectl_json("get", "pods", "--namespace", namespace)["items"]:
            for container in pod["status"].get("containerStatuses") or []:
                usage = CGROUP / container.get("containerID", "").removeprefix("containerd://") / "cpuacct.usage"
                if container.get("state", {}).get("running") and usage.is_file():
                    name = pod["metadata"]["name"]
                    used[name] = used.get(name, 0.0) + int(usage.read_text()) / 1e9
    return used


def service_of(pod: str, deployments: list[str]) -> str | None:
    """The Deployment (without the release's prefix) or the broker a pod belongs to."""
    if pod.startswith("kafka"):
        return "kafka broker"
    owners = [d for d in deployments if pod.startswith(d + "-")]
    return max(owners, key=len).removeprefix(f"{RELEASE}-") if owners else None


def node_busy() -> float:
    """CPU seconds the node has spent busy since it booted, every process on it together."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def used_over(seconds: float) -> dict[str, float]:
    """CPU seconds each pod uses over the next `seconds`, and the whole node's under "node"."""
    before, node = cpu_seconds(), node_busy()
    time.sleep(seconds)
    after, node = cpu_seconds(), node_busy() - node
    return {pod: after[pod] - before[pod] for pod in after if pod in before} | {"node": node}


def by_service(used: dict[str, float], per: float, deployments: list[str]) -> dict[str, float]:
    """CPU milliseconds by service, divided by `per`."""
    total: dict[str, float] = {}
    for pod, seconds in used.items():
        if service := service_of(pod, deployments):
            total[service] = total.get(service, 0.0) + seconds
    return {service: round(1000 * seconds / per, 2) for service, seconds in sorted(total.items())}


def pods_of(deployment: str, used: dict[str, float]) -> dict[str, float]:
    return {pod: round(s, 2) for pod, s in used.items() if pod.startswith(deployment + "-")}


def measure(what: str, deployments: list[str]) -> tuple[float, dict[str, float]]:
    """The rate held over WINDOW seconds of closed-loop load (after WARMUP), and CPU seconds by pod."""
    with Load(workers=THREADS) as load:
        time.sleep(WARMUP)
        answered = load.ok
        used = used_over(WINDOW)
        answered = load.ok - answered
    load.report(what)
    assert not load.failures, load.failures[:5]
    print(
        f"{what}: {answered / WINDOW:.1f} answers/s held, the node {used['node'] / WINDOW:.2f} cores busy; "
        f"CPU ms per workflow: {by_service(used, answered, deployments)}"
    )
    return answered / WINDOW, used


@pytest.mark.timeout(1500)
def test_two_cpu_limited_replicas_of_the_gateway_and_executor_hold_a_higher_rate_than_one(tmp_path):
    upgrade_release(limited_one_step(), tmp_path / "scaling.yaml")
    deployments = release_deployments()
    wait_until(lambda: all(ready_replicas(d) == 1 for d in SCALED), 120, "one replica of the gateway and executor")
    # What a replica uses with no traffic: Kafka polls, heartbeats, the executors' limit reports.
    print(f"idle, CPU millicores by service: {by_service(used_over(IDLE), IDLE, deployments)}")
    one, _ = measure(f"1 replica each, {LIMIT} CPU", deployments)

    for deployment in SCALED:
        kubectl("scale", f"deployment/{deployment}", "--replicas=2")
    for deployment in SCALED:
        wait_until(lambda d=deployment: ready_replicas(d) == 2, 300, f"{deployment} at 2 Ready replicas")
    two, used = measure(f"2 replicas each, {LIMIT} CPU", deployments)

    print(f"rate held, 2 replicas / 1: {two / one:.2f}")
    for deployment in SCALED:
        busy = pods_of(deployment, used)
        print(f"{deployment}: CPU seconds over {WINDOW}s by pod {busy}")
        # Each replica did its share: at least a fifth of what its limit allows over the window.
        assert len(busy) == 2 and min(busy.values()) > 0.2 * LIMIT_CORES * WINDOW, f"a replica idled: {busy}"
    assert two >= GAIN * one, f"2 replicas held {two:.1f}/s, 1 held {one:.1f}/s"
