"""The gateway's reconciliation of streamed answer text with the final answer: the client never gets a
different answer than the one the workflow settled on."""

from __future__ import annotations

from baton.v1 import responses_pb2
from baton_gateway.streaming import StreamedAnswer


def delta(text: str, offset: int, task_id: str = "r:2:1") -> responses_pb2.Delta:
    return responses_pb2.Delta(text=text, offset=offset, task_id=task_id)


def test_deltas_that_extend_the_text_are_forwarded_and_the_answer_completes_it():
    s = StreamedAnswer()
    assert [s.accept(delta("The ", 0)), s.accept(delta("cat ", 4))] == ["The ", "cat "]
    assert s.finish("The cat sat.") == "sat."
    assert s.finish("The cat ") == ""


def test_a_call_repeated_from_the_start_sends_only_what_is_new():
    s = StreamedAnswer()
    s.accept(delta("The ", 0))
    s.accept(delta("cat ", 4))
    # The provider call broke and was retried (or the task ran again after a rebalance).
    assert s.accept(delta("The c", 0)) == ""
    assert s.accept(delta("at sat.", 5)) == "sat."
    assert s.sent == "The cat sat." and s.finish("The cat sat.") == ""


def test_a_retry_that_says_something_else_is_not_mixed_in_and_the_stream_ends_in_an_error():
    s = StreamedAnswer()
    s.accept(delta("The cat ", 0))
    assert s.accept(delta("A dog ", 0)) == ""
    # Further text of the disagreeing call must not be appended, even where offsets would fit.
    assert s.accept(delta("barked at the cat.", 6)) == ""
    assert s.accept(delta("x", 8)) == ""
    assert s.sent == "The cat "
    assert s.finish("A dog barked at the cat.") is None


def test_only_the_first_tasks_deltas_reach_the_client():
    s = StreamedAnswer()
    s.accept(delta("The ", 0, task_id="r:2:1"))
    assert s.accept(delta("The cat sat.", 0, task_id="r:2:2")) == ""  # a fallback's text
    assert s.sent == "The " and s.finish("The cat sat.") == "cat sat."


def test_a_gap_is_not_bridged():
    s = StreamedAnswer()
    assert s.accept(delta("cat ", 4)) == ""  # the start of the call never arrived
    s2 = StreamedAnswer()
    s2.accept(delta("The ", 0))
    assert s2.accept(delta("sat.", 8)) == "" and s2.accept(delta("more", 12)) == ""
    assert s2.finish("The cat sat.more") == "cat sat.more"
