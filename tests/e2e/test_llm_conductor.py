"""The transformers conductor (SmolLM2-135M on CPU) plans real workflows that run end to end."""

from __future__ import annotations

import csv
import sys
import time

import openai
import pyarrow.dataset as ds
import yaml
from testbed import MMLU_PRO, default_config_data

from baton_conductor import copies_example
from baton_router.planning import COPIED_EXAMPLE
from baton_tools.procs import free_port
from baton_tools.stack import Stack


def wait_for_episodes(root, count, timeout=30):
    deadline = time.monotonic() + timeout
    rows = []
    while time.monotonic() < deadline:
        if any(root.rglob("*.parquet")):
            rows = ds.dataset(root, format="parquet", partitioning="hive").to_table(
                columns=["plan_backend", "plan_fallback", "plan_invalid_reason", "plan_token_logprobs"]).to_pylist()
            if len(rows) >= count:
                break
        time.sleep(0.3)
    return rows


def test_the_cpu_conductor_plans_and_the_plans_run(kafka_bootstrap, tmp_path):
    data = default_config_data()
    data["conductor"] = {"backend": "transformers", "max_steps": 3,
                         "transformers": {"batch_size": 4, "max_new_tokens": 160, "seed": 0},
                         "plan": data["conductor"]["plan"]}
    data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["reward_logger"] = {"flush_interval_s": 0.5}
    cfg = tmp_path / "baton.yaml"
    cfg.write_text(yaml.safe_dump(data))
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        rows = [r for _, r in zip(range(3), csv.DictReader(f))]
    stack = Stack(tmp_path / "run", config_file=cfg, gateway_port=free_port(), bootstrap_servers=kafka_bootstrap)
    stack.start(echo=lambda *_: None, timeout=300)
    try:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=240)
        infos = []
        for r in rows:
            c = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": r["prompt"]}])
            assert c.choices[0].message.content
            infos.append(c.model_extra["baton"])
        rows = wait_for_episodes(stack.dataset_dir / "episodes", 3)
    finally:
        stack.stop()
    names = {w["name"] for w in data["workers"]}
    for info in infos:
        assert info["plan"]["backend"] == "transformers"
        assert 1 <= len(info["plan"]["steps"]) <= 3 and {s["worker"] for s in info["plan"]["steps"]} <= names
    print("plans:", [[(s["worker"], s["instruction"][:40], s["access"]) for s in i["plan"]["steps"]] for i in infos])
    written = [r for r in rows if r["plan_backend"] == "transformers"]
    assert len(written) == 3
    # The model's own plans: those that ran, and those refused for copying the prompt's worked example
    # (the untrained 135M model copies it in most plans). A refused copy never reaches the workers: the
    # safe plan runs instead, and the episode keeps the copy's log-probs, so training can give it reward 0.
    own = [r for r in written if not r["plan_fallback"] or COPIED_EXAMPLE in (r["plan_invalid_reason"] or "")]
    assert own, [r["plan_invalid_reason"] for r in written]
    assert all(r["plan_token_logprobs"] and max(r["plan_token_logprobs"]) <= 0 for r in own)
    assert not [s for i in infos for s in i["plan"]["steps"] if copies_example([s["instruction"]])]
