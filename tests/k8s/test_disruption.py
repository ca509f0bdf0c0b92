"""What a running deployment goes through, under steady load through the gateway's port-forward (the
official openai client, no retries): a `helm upgrade` that changes the configuration rolls every
Deployment, then one pod of each Deployment is deleted in turn. Not one request may fail. Runs after
test_cluster.py on the same cluster; each test prints what it measured."""

from __future__ import annotations

import time

from .cluster import Load, kubectl, kubectl_json, release_deployments, rolled_out, upgrade_release, wait_until

# The configuration change: plan with the sim worker alone, without the stand-in's 40 requests a
# minute, so the load can run at several requests a second once the new router plans.
ONE_STEP_PLAN = {"config": {"conductor": {"plan": {
    "workers": ["llama-70b"], "subtasks": ["Answer the question with a single option letter."], "access": [[]]}}}}
LOAD = {"workers": 8, "rate": 6.0}


def generation(deployment: str) -> int:
    return kubectl_json("get", "deployment", deployment)["metadata"]["generation"]


def pods_of(deployment: str) -> list[str]:
    selector = kubectl_json("get", "deployment", deployment)["spec"]["selector"]["matchLabels"]
    labels = ",".join(f"{k}={v}" for k, v in selector.items())
    return sorted(p["metadata"]["name"] for p in kubectl_json("get", "pods", "-l", labels)["items"])


def test_a_helm_upgrade_that_changes_the_configuration_rolls_every_deployment_under_load_and_loses_nothing(tmp_path):
    deployments = release_deployments()
    before = {d: generation(d) for d in deployments}
    pods_before = {d: pods_of(d) for d in deployments}
    with Load(**LOAD) as load:
        time.sleep(15)
        started = time.monotonic()
        upgrade_release(ONE_STEP_PLAN, tmp_path / "one-step-plan.yaml")
        wait_until(lambda: all(rolled_out(d) for d in deployments), 600, "every Deployment rolled out")
        rolled = time.monotonic() - started
        time.sleep(15)
    load.report("helm upgrade")
    print(f"roll of {len(deployments)} Deployments ({', '.join(deployments)}): {rolled:.0f}s")
    assert [d for d in deployments if generation(d) == before[d]] == [], "a Deployment did not roll"
    kept = {d: set(pods_of(d)) & set(pods_before[d]) for d in deployments}
    assert not any(kept.values()), f"pods from before the upgrade still run: {kept}"
    assert not load.failures, load.failures[:5]
    assert load.ok == load.sent > 0


def test_deleting_one_pod_of_each_deployment_under_load_loses_nothing():
    deployments = release_deployments()
    recovered: dict[str, float] = {}
    with Load(**LOAD) as load:
        time.sleep(10)
        for deployment in deployments:
            victim = pods_of(deployment)[0]
            started = time.monotonic()
            kubectl("delete", "pod", victim, "--wait=false")
            wait_until(lambda d=deployment, v=victim: v not in pods_of(d) and rolled_out(d), 300,
                       f"{deployment} back at full strength without {victim}")
            recovered[deployment] = time.monotonic() - started
        time.sleep(10)
    load.report("one pod of each Deployment deleted")
    print("back at full strength after: " + ", ".join(f"{d} {s:.0f}s" for d, s in recovered.items()))
    assert not load.failures, load.failures[:5]
    assert load.ok == load.sent > 0
