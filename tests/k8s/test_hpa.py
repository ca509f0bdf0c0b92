"""Autoscaling on a real signal: the sim executor's HorizontalPodAutoscaler (the chart's, on CPU) reads
its pods' CPU from the resource metrics API, which metrics-server serves from the kubelet's
measurements, and scales the Deployment out under load. Runs after test_disruption.py on the same
cluster, with the one-step plan on the sim worker so the load is not held back by the stand-in's
limit."""

from __future__ import annotations

import time

import pytest
import yaml

from .cluster import RELEASE, ROOT, Load, helm, kubectl_json, ready_replicas, wait_until

CHART = ROOT / "charts" / "baton"
VALUES = ROOT / "tools" / "k8s" / "values-local.yaml"
EXECUTOR = f"{RELEASE}-executor-sim"
# An idle executor uses a third to a half of its 50m CPU request; under this load, about twice it.
TARGET = 75
LOAD = {"workers": 14, "rate": 14.0}
AUTOSCALED = {
    "config": {"conductor": {"plan": {
        "workers": ["llama-70b"], "subtasks": ["Answer the question with a single option letter."], "access": [[]]}}},
    "executors": {"sim": {"autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetCPUUtilizationPercentage": TARGET}}},
}


def cpu_utilization() -> int | None:
    """The HPA's latest reading of its pods' average CPU (percent of their request), if it has one."""
    for metric in kubectl_json("get", "hpa", EXECUTOR)["status"].get("currentMetrics") or []:
        current = (metric.get("resource") or {}).get("current") or {}
        if metric.get("type") == "Resource" and "averageUtilization" in current:
            return int(current["averageUtilization"])
    return None


def replicas() -> int:
    return kubectl_json("get", "deployment", EXECUTOR)["spec"]["replicas"]


@pytest.mark.timeout(900)
def test_the_executor_hpa_scales_out_on_the_cpu_its_pods_use(tmp_path):
    override = tmp_path / "autoscaled.yaml"
    override.write_text(yaml.safe_dump(AUTOSCALED))
    helm("upgrade", RELEASE, str(CHART), "-f", str(VALUES), "-f", str(override), "--wait", "--timeout", "15m")
    # Pods just started use more CPU than idle ones: wait for the HPA to settle on one replica (the local
    # cluster scales down after 30 s of lower readings), below its target.

    def settled() -> bool:
        reading = cpu_utilization()
        return reading is not None and reading < TARGET and ready_replicas(EXECUTOR) == 1 == replicas()

    wait_until(settled, 300, f"the HPA of {EXECUTOR} to read its idle pod's CPU below {TARGET}% on one replica")
    idle = cpu_utilization()
    readings = []
    with Load(**LOAD) as load:
        started = time.monotonic()

        def scaled_out() -> bool:
            readings.append(cpu_utilization())
            return ready_replicas(EXECUTOR) == 2

        wait_until(scaled_out, 300, f"the HPA to scale {EXECUTOR} to 2 Ready replicas")
        took = time.monotonic() - started
        time.sleep(10)
    load.report("load while the HPA scaled out")
    conditions = {c["type"]: c["status"] for c in kubectl_json("get", "hpa", EXECUTOR)["status"]["conditions"]}
    print(f"{EXECUTOR}: CPU {idle}% of its request idle, up to {max(r or 0 for r in readings)}% under load "
          f"(target {TARGET}%); 2 Ready replicas {took:.0f}s after the load began; conditions {conditions}")
    assert conditions.get("ScalingActive") == "True", conditions
    assert max(r or 0 for r in readings) > TARGET
    assert not load.failures, load.failures[:5]
