"""Which reply partitions a gateway replica offers around a rebalance, and which it must hand over."""

from __future__ import annotations

from aiokafka import TopicPartition

from baton_gateway.replies import Replies


def tps(*partitions: int) -> set[TopicPartition]:
    return {TopicPartition("baton.responses", p) for p in partitions}


async def test_during_a_rebalance_requests_still_ask_on_the_partitions_held_before():
    replies = Replies()
    await replies.assigned(tps(0, 1))
    await replies.revoked(tps(0, 1))
    assert replies.ready and {replies.reply_partition() for _ in range(4)} == {0, 1}


async def test_only_partitions_that_went_elsewhere_with_requests_waiting_on_them_are_handed_over():
    replies, lost = Replies(), []
    replies.on_lost = lost.append
    await replies.assigned(tps(0, 1, 2, 3))
    replies.expect("a", 1)
    replies.expect("b", 2)
    replies.expect("c", 3)
    replies.abandon("c")
    await replies.revoked(tps(0, 1, 2, 3))
    await replies.assigned(tps(0, 2))
    assert lost == [{1}], "1 went elsewhere with 'a' waiting; 2 stayed; nothing waits on 3 or 0"
    assert replies.oldest_on({1}) is not None and replies.oldest_on({0, 3}) is None
    await replies.revoked(tps(0, 2))
    await replies.assigned(tps(0, 1, 2, 3))
    assert lost == [{1}], "nothing was taken this time"
