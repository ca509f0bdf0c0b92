"""The transformers conductor (SmolLM2-135M on CPU) plans real workflows that run end to end."""

from __future__ import annotations

import csv
import sys

import openai
from testbed import MMLU_PRO, default_config_data, running_stack, wait_for_episodes

from baton_conductor import copies_example
from baton_router.planning import COPIED_EXAMPLE


def test_the_cpu_conductor_plans_and_the_plans_run(kafka_bootstrap, tmp_path):
    data = default_config_data()
    data["conductor"] = {"backend": "transformers", "max_steps": 3,
                         "transformers": {"batch_size": 4, "max_new_tokens": 160, "seed": 0},
                         "plan": data["conductor"]["plan"]}
    data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["reward_logger"] = {"flush_interval_s": 0.5}
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        questions = [r for _, r in zip(range(3), csv.DictReader(f))]
    with running_stack(data, tmp_path / "run", kafka_bootstrap, start_timeout=300) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=240)
        infos = []
        for r in questions:
            c = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": r["prompt"]}])
            assert c.choices[0].message.content
            infos.append(c.model_extra["baton"])
        rows = wait_for_episodes(stack.dataset_dir, {i["request_id"] for i in infos}, 30)
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
