"""A worker the served policy was not trained with, added to a running stack's configuration and
the router restarted (the executors and the synthesizer read the changed file themselves), end to
end: it gets traffic among the first requests, its propensities are in the episodes, its graded
rewards reach the routers, and taking it out of the configuration (the router restarted) takes its
traffic away."""

from __future__ import annotations

import csv
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pyarrow.dataset as ds
import yaml
from testbed import MMLU_PRO, default_config_data, running_stack

from baton_policy.fastpolicy import Policy
from baton_policy.matrix import load_matrix, without
from baton_policy.workflows import candidate_workflows

NEW_MODEL = "Qwen1.5-110B"


def test_a_worker_added_to_a_running_stack_serves_at_once_learns_and_is_gone_once_removed(kafka_bootstrap, tmp_path):
    data = default_config_data()
    served = {w["sim"]["column"] if w["sim"].get("column") else w["model"] for w in data["workers"]}
    # The policy knows the three sim workers of the default pool only (a small singles-only fit).
    matrix = load_matrix(MMLU_PRO)
    known = without(matrix.subset(range(400)), [m for m in matrix.models if m not in served])
    flows = candidate_workflows(known, vote_sizes=(), panel_sizes=(), escalate=())
    policy_dir = Policy.fit_matrix(known, flows, tune_trust_folds=0).save(tmp_path / "policy")
    newcomer = {"name": "qwen-110b", "provider": "sim", "model": NEW_MODEL,
                "sim": {"dataset": str(MMLU_PRO), "latency_ms": 20},
                "price": {"input_per_mtok": 0.9, "output_per_mtok": 0.9},
                "card": "Strengths: open weights. Weaknesses: untested here. Price: medium."}
    data["conductor"] = {"backend": "policy", "policy": {"path": str(policy_dir), "version": "v0", "epsilon": 0.0,
                                                         "new_worker_share": 0.2}}
    data["kafka"] = {"partitions": 2}
    data["reward_logger"] = {**data["reward_logger"], "flush_interval_s": 0.5}

    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        every = list(csv.DictReader(f))
    rows, later = every[400:500], every[500:600]
    with running_stack(data, tmp_path, kafka_bootstrap) as stack:

        def reconfigure(*services: str) -> None:
            """What a user of `make up` does: edit the configuration, restart those services."""
            stack.config_file.write_text(yaml.safe_dump(data))
            for svc in services:
                stack.restart(svc)

        # Added to the running stack's configuration, only the router restarted: it chooses the new
        # worker; the synthesizer and the sim executors, started without it, read the file again
        # when a step names it.
        data["workers"].append(newcomer)
        started = {s.name: s.pid for s in stack.services}
        reconfigure("router")
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)

        def ask(row):
            raw = client.chat.completions.with_raw_response.create(
                model="baton", messages=[{"role": "user", "content": row["prompt"]}],
                metadata={"baton_eval": f"mmlu_pro:{row['sample_id']}"})
            return raw.headers["x-baton-request-id"]

        with ThreadPoolExecutor(8) as pool:
            ids = set(pool.map(ask, rows))

        def episodes():
            root = stack.dataset_dir / "episodes"
            if not any(root.rglob("*.parquet")):
                return []
            return [r for r in ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pylist()
                    if r["request_id"] in ids]

        router = next(s for s in stack.services if s.name == "router")

        def learned() -> float:
            text = httpx.get(f"http://127.0.0.1:{router.port}/metrics", timeout=5).text
            return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("baton_rewards_learned_total"))

        def wait_for(until) -> None:
            deadline = time.monotonic() + 60
            while not until() and time.monotonic() < deadline:
                time.sleep(0.5)

        wait_for(lambda: len(episodes()) >= len(ids) and learned() > 0)
        logged, taught = episodes(), learned()
        same = {s.name for s in stack.services if s.name != "router" and started[s.name] == s.pid}

        # Taken out of the configuration, the router restarted: the new worker and two of the known
        # ones get no more traffic, though the executors, started with them, could still serve them,
        # and the policy now explores (it would send the known ones a third of the queries each).
        kept = data["workers"][0]
        removed = {w["name"] for w in data["workers"]} - {kept["name"]}
        data["workers"] = [kept]
        data["conductor"]["policy"]["epsilon"] = 1.0
        reconfigure("router")
        with ThreadPoolExecutor(8) as pool:
            ids = set(pool.map(ask, later))
        wait_for(lambda: len(episodes()) >= len(ids))
        after_removal = episodes()
    assert same == set(started) - {"router"}, "only the router was restarted"
    assert len(logged) == 100
    assert all(r["error_code"] in (None, "") for r in logged), {r["error_code"] for r in logged}
    new = [r for r in logged if r["plan_action"] == NEW_MODEL]
    assert new, "the new worker got traffic among the first 100 requests"
    assert all(r["steps"][0]["worker"] == "qwen-110b" for r in new)
    # Its share of each choice: 1 where its optimistic quality beats the policy's choice, the
    # exploration share where only its upper bound does.
    assert all(0 < r["plan_propensity"] <= 1 for r in new), "its share of each choice is logged"
    assert all(r["plan_policy_version"] == "v0" for r in logged)
    graded_new = [r for r in new if r["quality"] is not None]
    assert graded_new and taught >= 1, "graded rewards of its episodes reached the router over baton.rewards"
    assert len(after_removal) == 100 and "qwen-110b" in removed and len(removed) == 3
    assert {r["plan_action"] for r in after_removal} == {kept["model"]}, "removed workers get no traffic"
    assert {step["worker"] for r in after_removal for step in r["steps"]} == {kept["name"]}
