"""router.direct_single_step, end to end: a one-step workflow goes from the router straight to the
executor, which answers the client; the synthesizer never sees it, and its episode is logged whole.
A streaming request with the same plan still runs through the synthesizer."""

from __future__ import annotations

import asyncio

import openai
from aiokafka import AIOKafkaConsumer, TopicPartition
from testbed import default_config_data, episode_of, first_question, running_stack, wait_for

from baton_platform import topics
from baton_platform.kafka import partition_ids, read_since


async def keys_on(bootstrap: str, topic: str) -> set[str]:
    """The keys of every record on `topic` so far."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await probe.start()
    try:
        parts = [TopicPartition(topic, p) for p in await partition_ids({"bootstrap_servers": bootstrap}, topic)]
        return {r.key.decode() async for r in read_since(probe, parts, 0) if r.key}
    finally:
        await probe.stop()


def test_a_one_step_workflow_is_answered_by_the_executor_and_logged_without_the_synthesizer(kafka_bootstrap, tmp_path):
    data = default_config_data()
    data["router"] = {**data.get("router", {}), "direct_single_step": True}
    data["conductor"]["plan"] = {"workers": ["gemini-pro"], "subtasks": ["Answer the question."], "access": [[]]}
    data["reward_logger"] = {**data["reward_logger"], "flush_interval_s": 0.5}
    question = first_question()
    with running_stack(data, tmp_path, kafka_bootstrap) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        direct = client.chat.completions.with_raw_response.create(
            model="baton", messages=[{"role": "user", "content": question["prompt"]}])
        streamed = client.chat.completions.with_raw_response.create(
            model="baton", messages=[{"role": "user", "content": question["prompt"]}], stream=True)
        answer = direct.parse().choices[0].message.content
        streamed_answer = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
        direct_id, streamed_id = direct.headers["x-baton-request-id"], streamed.headers["x-baton-request-id"]
        assert answer and streamed_answer == answer
        episode = wait_for(lambda: episode_of(stack.dataset_dir, direct_id), timeout=30)
        wait_for(lambda: episode_of(stack.dataset_dir, streamed_id), timeout=30)
        on_workflow = asyncio.run(keys_on(kafka_bootstrap, topics.WORKFLOW))
    assert direct_id not in on_workflow, "the one-step workflow went through the synthesizer"
    assert streamed_id in on_workflow, "a streaming request (progress, deltas) runs through the synthesizer"
    assert episode["answer"] == answer
    assert [s["worker"] for s in episode["steps"]] == ["gemini-pro"]
