"""Baton on a real single-node Kubernetes cluster (`make k8s-test` starts it with tools/k8s/up.sh):
every request goes through the gateway's port-forward with the official openai client. The tests
run in file order on one cluster; each prints the figure it measured."""

from __future__ import annotations

import time

from .cluster import (
    NAMESPACE,
    Load,
    client,
    kubectl,
    kubectl_json,
    matrix_prompts,
    ready_replicas,
    standin_stats,
    wait_until,
)

STANDIN_EXECUTOR = "baton-executor-openai-compatible"


def test_every_baton_pod_is_ready():
    pods = kubectl_json("get", "pods")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running, "no pod runs in the baton namespace"
    not_ready = [p["metadata"]["name"] for p in running
                 if not all(c.get("ready") for c in p["status"].get("containerStatuses", []))]  # fmt: skip
    assert not not_ready, f"pods not Ready: {not_ready}"
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in running}
    assert {"gateway", "router", "synthesizer", "reward-logger"} <= components, components
    print(f"{len(running)} pods Ready in {NAMESPACE}")


def test_answers_come_back_from_the_sim_workers_and_the_standin():
    before = standin_stats()["requests"]
    chat = client()
    prompts = matrix_prompts()[:6]
    started = time.monotonic()
    for prompt in prompts:
        reply = chat.chat.completions.create(model="baton", messages=[{"role": "user", "content": prompt}])
        text = reply.choices[0].message.content or ""
        # The plan: a sim worker drafts (it knows only the matrix's questions), the stand-in checks
        # the draft; the stand-in's echo shows the question and the draft it was given.
        assert "[standin-gpt] saw:" in text, text[:300]
        assert prompt.split()[0] in text, text[:300]
    served = standin_stats()["requests"] - before
    assert served >= len(prompts), f"the stand-in served {served} calls for {len(prompts)} requests"
    print(f"{len(prompts)} answers in {time.monotonic() - started:.1f}s; stand-in served {served} calls")


def test_scaling_an_executor_from_1_to_3_under_load_loses_nothing_and_keeps_the_limit():
    assert ready_replicas(STANDIN_EXECUTOR) == 1
    limited_before = standin_stats()["rate_limited"]
    with Load(workers=3) as load:
        time.sleep(10)
        kubectl("scale", f"deployment/{STANDIN_EXECUTOR}", "--replicas=3")
        wait_until(lambda: ready_replicas(STANDIN_EXECUTOR) == 3, 180, f"{STANDIN_EXECUTOR} at 3 Ready replicas")
        time.sleep(20)
    load.report("scale 1->3")
    stats = standin_stats()
    print(f"stand-in: {stats['requests']} calls, {stats['rate_limited'] - limited_before} answered 429 during the scale")
    assert not load.failures, load.failures[:5]
    assert load.ok > 0
    assert stats["rate_limited"] == limited_before, "the executors together went over the provider's rpm limit"
    kubectl("scale", f"deployment/{STANDIN_EXECUTOR}", "--replicas=1")
    wait_until(lambda: ready_replicas(STANDIN_EXECUTOR) == 1, 180, f"{STANDIN_EXECUTOR} back at 1 replica")
