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


async def test_after_a_rebalance_the_requests_waiting_on_revoked_partitions_are_reported_moved_or_not():
    replies, reported = Replies(), []
    replies.on_rebalanced = reported.append
    await replies.assigned(tps(0, 1, 2, 3))
    replies.expect("a", 1)
    replies.expect("b", 2)
    replies.expect("c", 3)
    replies.abandon("c")
    await replies.revoked(tps(0, 1, 2, 3))
    await replies.assigned(tps(0, 2))
    assert [{r: p for r, (p, _) in w.items()} for w in reported] == [{"a": 1, "b": 2}], \
        "1 went elsewhere, 2 stayed (it may restart from its end); nothing waits on 0 or 3"
    assert replies.is_waiting("a") and not replies.is_waiting("c")
    await replies.revoked(tps(0))
    await replies.assigned(tps(0, 1, 3))
    assert len(reported) == 1, "nothing waits on the revoked partition 0"


def test_every_client_waiting_on_a_request_gets_its_replies_and_each_may_stop_alone():
    from baton.v1 import responses_pb2

    replies = Replies()
    first, repeat = replies.expect("a", 0), replies.expect("a", 0)  # a repeat with the first's Idempotency-Key
    replies.deliver(responses_pb2.Response(request_id="a", delta=responses_pb2.Delta(text="x")))
    replies.abandon("a", first)  # the first client went away: the repeat still waits
    assert replies.is_waiting("a") and first.qsize() == 1 and repeat.qsize() == 1
    assert replies.deliver(responses_pb2.Response(request_id="a", answer="done"))
    assert repeat.qsize() == 2 and first.qsize() == 1 and not replies.is_waiting("a")
