"""The topic's incarnation, which the reward logger's file names hold, asked of a real broker: the
same while the topic lives, another once it is deleted and created again."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from baton_platform.kafka import topic_incarnation


async def test_a_topic_created_again_is_another_incarnation(kafka_bootstrap):
    topic = f"baton.test-incarnation-{uuid.uuid4().hex[:8]}"
    options = {"bootstrap_servers": kafka_bootstrap}
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
        first = await topic_incarnation(options, topic)
        assert await topic_incarnation(options, topic) == first
        cluster, topic_id = first.split("/")
        assert cluster and len(topic_id) == 32 and int(topic_id, 16) != 0
        await admin.delete_topics([topic])
        for _ in range(50):  # the deletion completes in the background
            try:
                await admin.create_topics([NewTopic(topic, 1, 1)])
                break
            except Exception:  # noqa: BLE001 - TopicAlreadyExists until it has
                await asyncio.sleep(0.2)
        second = await topic_incarnation(options, topic)
        assert second.split("/")[0] == cluster and second != first
    finally:
        await admin.delete_topics([topic])
        await admin.close()
