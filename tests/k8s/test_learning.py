"""The learning loop on the cluster. The release switches to the `policy` conductor over two sim
workers, one strong and one weak, graded with the matrix they replay. Traffic is logged as episodes on
the reward logger's claim; the trainer CronJob runs once (`kubectl create job --from`), trains on
those episodes, gates the candidate and publishes it to a store on the router's model claim; the
router then plans with it without a restart. Runs after test_disruption.py, before test_uninstall.py."""

from __future__ import annotations

import csv
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .cluster import NAMESPACE, RELEASE, STATE, client, kubectl, kubectl_json, upgrade_release, wait_until

MATRIX = {"name": "routing-matrix", "configMap": {"name": "baton-routing-matrix"}}
MOUNT = {"name": "routing-matrix", "mountPath": "/data/routing", "readOnly": True}
SIM = {"dataset": "/data/routing/matrix.csv", "latency_ms": 20}
LEARNING = {
    "config": {
        "workers": [
            {"name": "llama-70b", "provider": "sim", "model": "Meta-Llama-3_1-70B-Instruct", "sim": SIM,
             "limits": {"concurrency": 16}, "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6}},
            {"name": "llama2-7b", "provider": "sim", "model": "Llama-2-7b-hf", "sim": SIM,
             "limits": {"concurrency": 16}, "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.1}},
        ],
        "conductor": {"backend": "policy", "plan": None, "policy": {"epsilon": 0.1}},
        "reward_logger": {"flush_interval_s": 0.5,
                          "eval_sets": {"mmlu_pro": {"path": "/data/routing/matrix.csv", "grader": "choice"}}},
    },
    "rewardLogger": {"extraVolumes": [MATRIX], "extraVolumeMounts": [MOUNT]},
    # The store is a folder on the router's model claim, which both pods mount (one node: ReadWriteOnce
    # is enough).
    "trainer": {
        "enabled": True,
        "mountModelStorage": True,
        "args": ["train-fast", "--episodes", "/data/episodes/episodes", "--store", "/models/policies", "--publish"],
        "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}},
    },
}
ROUNDS = 8  # each question of the cluster's matrix slice is asked this many times


def graded_rows() -> list[dict]:
    csv.field_size_limit(sys.maxsize)
    with (STATE / "matrix.csv").open(newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r.get("answer")]


def router_metrics() -> str:
    return kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-router:9101/proxy/metrics")


def job_ended(job: str) -> bool:
    status = kubectl_json("get", "job", job)["status"]
    return status.get("succeeded", 0) > 0 or status.get("failed", 0) > 0


def summary_line(log: str) -> dict:
    """The trainer's result: the last line of its log that is a JSON object. A container's log
    interleaves stdout with stderr, where libraries may still write after the result (seen once: the
    job succeeded and its last line was not the JSON)."""
    for line in reversed(log.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise AssertionError(f"no JSON result in the trainer's log:\n{log[-3000:]}")


@pytest.mark.timeout(1500)
def test_the_trainer_job_learns_from_the_clusters_episodes_and_the_router_serves_its_policy(tmp_path):
    upgrade_release(LEARNING, tmp_path / "learning.yaml")
    chat = client(key="eval-key")  # graded traffic names its items: the eval scope

    def ask(row: dict) -> dict:
        reply = chat.chat.completions.create(
            model="baton", messages=[{"role": "user", "content": row["prompt"]}],
            metadata={"baton_eval": f"mmlu_pro:{row['sample_id']}", "eval_name": row["eval_name"]})
        return reply.model_extra["baton"]["plan"]

    rows = graded_rows() * ROUNDS
    with ThreadPoolExecutor(8) as pool:
        plans = list(pool.map(ask, rows))
    # Without a trained policy the conductor explores uniformly.
    assert {p["policy_version"] for p in plans} == {"uniform"}, {p["policy_version"] for p in plans}
    time.sleep(5)  # the reward logger flushes every 0.5 s

    job = f"{RELEASE}-trainer-once"
    started = time.monotonic()
    kubectl("create", "job", f"--from=cronjob/{RELEASE}-trainer", job)
    wait_until(lambda: job_ended(job), 900, f"job {job} to end")
    log = kubectl("logs", f"job/{job}")
    assert kubectl_json("get", "job", job)["status"].get("succeeded", 0) == 1, log[-3000:]
    trained = summary_line(log)
    summary = {k: trained.get(k) for k in ("candidate", "train_episodes", "gate", "published", "reason")}
    print(f"{len(rows)} graded requests; trainer job in {time.monotonic() - started:.0f}s: {json.dumps(summary)}")
    assert trained.get("published"), trained

    version = trained["candidate"]
    wait_until(lambda: f'version="{version}"' in router_metrics(), 120, f"the router to load {version}")
    after = [ask(row) for row in graded_rows()[:5]]
    assert {p["policy_version"] for p in after} == {version}, after
    print(f"the router serves {version}: {len(after)} fresh requests planned with it")
