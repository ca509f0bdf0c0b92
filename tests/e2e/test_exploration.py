"""Exploration end to end: one client request, a group of candidate workflows, every episode logged."""

from __future__ import annotations

import openai
from testbed import dataset_rows, default_config_data, running_stack, wait_for, wait_for_episodes


def exploring_stack(kafka_bootstrap, tmp_path, **sections):
    """Every service as a process, every request explored by a group of three candidates."""
    data = default_config_data()
    data["router"] = {"explore_share": 1.0, "explore_group_size": 3}
    data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["reward_logger"] = {**data.get("reward_logger", {}), "flush_interval_s": 0.5}
    data.update(sections)
    return running_stack(data, tmp_path / "run", kafka_bootstrap)


def test_an_explored_request_answers_once_and_logs_its_whole_group(kafka_bootstrap, tmp_path):
    import csv
    import sys

    from testbed import MMLU_PRO

    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        # A question the sim workers' matrix holds: one it lacks fails its step (no local model here).
        prompt = next(csv.DictReader(f))["prompt"]
    with exploring_stack(kafka_bootstrap, tmp_path) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(
            model="baton", messages=[{"role": "user", "content": prompt}])
        rid = raw.headers["x-baton-request-id"]
        assert raw.parse().choices[0].message.content

        group = wait_for_episodes(stack.dataset_dir, {rid, f"{rid}.1", f"{rid}.2"}, 30)
    rows = sorted(group, key=lambda r: r["candidate"])
    assert [(r["request_id"], r["candidate"], r["group_size"]) for r in rows] == [
        (rid, 0, 3), (f"{rid}.1", 1, 3), (f"{rid}.2", 2, 3)]
    assert all(r["plan_propensity"] == 1.0 for r in rows), "the static conductor's plan is certain"


def test_the_judge_chooses_the_answer_of_a_group_and_its_scores_are_logged(kafka_bootstrap, tmp_path):
    import csv
    import json
    import sys

    from testbed import MMLU_PRO

    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        # A question the judge's model answered right: its scores then say which candidates are right.
        row = next(r for r in csv.DictReader(f) if r["gemini-1.5-pro-002|answer"] == r["answer"])
    # Before any training the policy conductor picks a uniformly random worker per candidate.
    with exploring_stack(kafka_bootstrap, tmp_path, conductor={"backend": "policy"},
                         synthesizer={"group_answer": "judge"}, judge={"worker": "gemini-pro"}) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        completion = client.chat.completions.create(
            model="baton", messages=[{"role": "user", "content": row["prompt"]}],
            metadata={"baton_eval": f"mmlu_pro:{row['sample_id']}"})
        rid = completion.model_extra["baton"]["request_id"]
        judge = completion.model_extra["baton"]["judge"]

        group = wait_for_episodes(stack.dataset_dir, {rid, f"{rid}.1", f"{rid}.2"}, 30)

        def feedback_rows():
            rows = dataset_rows(str(stack.dataset_dir / "feedback"))
            return rows if len(rows) >= 3 else None

        feedback = wait_for(feedback_rows, 30) or []
    episodes = {r["request_id"]: r for r in group}
    assert judge["candidates"] == [rid, f"{rid}.1", f"{rid}.2"] and len(judge["scores"]) == 3
    own = {i: json.loads(episodes[i]["judge_json"])["own_answer"] if i == rid else episodes[i]["answer"]
           for i in judge["candidates"]}
    # Each candidate is graded on its own answer, and this judge knows the right one: score = quality.
    assert [episodes[i]["quality"] for i in judge["candidates"]] == judge["scores"]
    assert judge["chosen"] == max(range(3), key=lambda k: (judge["scores"][k], -k))
    assert completion.choices[0].message.content == own[judge["candidates"][judge["chosen"]]]
    assert {(r["response_id"], r["score"], r["source"]) for r in feedback} == {(i, s, "judge") for i, s in zip(judge["candidates"], judge["scores"])}
