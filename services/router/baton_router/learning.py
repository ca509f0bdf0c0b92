"""Online learning from baton.rewards: graded episodes teach the policy conductor new workers.

Every replica reads the whole topic from its start, without a consumer group, so every replica
applies the same rewards in the same order and routes new workers alike; a restart rebuilds what
it had learned from the retained log.
"""

from __future__ import annotations

from baton.v1 import rewards_pb2
from baton_platform import topics
from baton_platform.consumer import Record
from baton_platform.service import Service
from baton_router.metrics import LearningMetrics


def register_rewards(service: Service, backend) -> None:
    if not hasattr(backend, "learn"):
        return
    metrics = LearningMetrics(service.registry)

    async def on_reward(reward: rewards_pb2.Reward, record: Record) -> None:
        if backend.learn(reward):
            metrics.learned.inc()

    service.consumer(topics.REWARDS, rewards_pb2.Reward, on_reward, description="Graded episodes to learn from.")
