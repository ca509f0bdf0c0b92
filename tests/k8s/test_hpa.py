"""Autoscaling on a real signal: the sim executor's HorizontalPodAutoscaler (the chart's, on CPU) reads
its pods' CPU from the resource metrics API, which metrics-server serves from the kubelet's
measurements, and scales the Deployment out under load. Runs after test_disruption.py on the same
cluster, with a plan of two sim steps so the load is not held back by the stand-in's limit.

An idle executor is not idle: it exchanges limit-sharing reports four times a second and polls Kafka,
which costs a third to four fifths of its 50m request on this node, about as much as this load adds.
So the test first reads the idle pod with the target out of reach, then sets the target (through the
chart, as an operator would) a little above what it read, and only then applies the load."""

from __future__ import annotations

import time

import pytest

from .cluster import RELEASE, Load, kubectl_json, ready_replicas, upgrade_release, wait_until

EXECUTOR = f"{RELEASE}-executor-sim"
LOAD = {"workers": 14, "rate": 14.0}
OUT_OF_REACH = 1000  # percent of the CPU request: no reading comes near it
HEADROOM = 20  # target = the idle pod's highest reading + this; the load adds about 50
TWO_SIM_STEPS = {
    "workers": ["llama-70b", "gemini-flash"],
    "subtasks": ["Answer the question with a single option letter.", "Check the draft and give the final letter."],
    "access": [[], [0]],
}


def upgrade(tmp_path, target: int) -> None:
    upgrade_release({
        "config": {"conductor": {"plan": TWO_SIM_STEPS}},
        "executors": {"sim": {"autoscaling": {
            "enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetCPUUtilizationPercentage": target}}},
    }, tmp_path / f"autoscaled-{target}.yaml")  # fmt: skip


def cpu_utilization() -> int | None:
    """The HPA's latest reading of its pods' average CPU (percent of their request), if it has one."""
    for metric in kubectl_json("get", "hpa", EXECUTOR)["status"].get("currentMetrics") or []:
        current = (metric.get("resource") or {}).get("current") or {}
        if metric.get("type") == "Resource" and "averageUtilization" in current:
            return int(current["averageUtilization"])
    return None


def replicas() -> int:
    return kubectl_json("get", "deployment", EXECUTOR)["spec"]["replicas"]


def hpa_target() -> int:
    return kubectl_json("get", "hpa", EXECUTOR)["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"]


@pytest.mark.timeout(900)
def test_the_executor_hpa_scales_out_on_the_cpu_its_pods_use(tmp_path):
    upgrade(tmp_path, OUT_OF_REACH)
    # Pods just started use more CPU than idle ones: wait for one replica (the local cluster scales
    # down after 30 s of lower readings), then take the idle pod's readings over four windows.
    wait_until(lambda: cpu_utilization() is not None and ready_replicas(EXECUTOR) == 1 == replicas(), 300,
               f"the HPA of {EXECUTOR} to read its pod's CPU on one replica")  # fmt: skip
    time.sleep(30)
    idle = []
    for _ in range(4):
        idle.append(cpu_utilization() or 0)
        time.sleep(15)
    target = max(idle) + HEADROOM
    upgrade(tmp_path, target)
    assert hpa_target() == target and replicas() == 1

    readings: list[int] = []
    with Load(**LOAD) as load:
        started = time.monotonic()

        def scaled_out() -> bool:
            readings.append(cpu_utilization() or 0)
            return ready_replicas(EXECUTOR) == 2

        try:
            wait_until(scaled_out, 300, f"the HPA to scale {EXECUTOR} to 2 Ready replicas")
            took = time.monotonic() - started
            time.sleep(10)
        finally:
            print(f"{EXECUTOR} CPU, percent of its request: idle {idle}, target {target}, under load {readings[::5]}")
    load.report("load while the HPA scaled out")
    conditions = {c["type"]: c["status"] for c in kubectl_json("get", "hpa", EXECUTOR)["status"]["conditions"]}
    print(f"2 Ready replicas {took:.0f}s after the load began; highest reading {max(readings)}%; conditions {conditions}")
    assert conditions.get("ScalingActive") == "True", conditions
    assert max(readings) > target
    assert not load.failures, load.failures[:5]
