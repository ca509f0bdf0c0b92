"""Property tests: every grader and every topic's decoder survives any input.

A grader returns a Grade in [0, 1] or raises ValueError (a bad reference or option) or GradingError
(could not grade), quickly, on any answer and reference; the reward logger's scoring never raises;
decoding arbitrary bytes as any contract message gives that message or a PoisonMessage.
"""

from __future__ import annotations

import importlib
import pkgutil
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.v1 import feedback_pb2, responses_pb2
from baton_graders import EvalItem, EvalRegistry, Grade, GradingError, grade
from baton_platform.messages import PoisonMessage, decode
from baton_reward_logger.handlers import feedback_row_maker, response_row_maker
from baton_reward_logger.rewards import score

# Text with the characters the graders look for, so the search reaches their branches.
SPECIAL = st.sampled_from(["\\boxed{", "}", "{", "\\frac", "####", "answer is", "Answer:", "(", ")", "**", "/",
                           "1e9", "e-", ",", ".", "-", "$", "\\text{", "```python\n", "```", " ", "\n", "A", "c",
                           "9" * 50, "(C)", "option", "\\sqrt", "^{\\circ}", "%", "−"])
TEXT = st.one_of(st.text(max_size=300), st.lists(st.one_of(SPECIAL, st.text(max_size=5)), max_size=80).map("".join))
# Time is bounded by the checks themselves, generously: the machine running the suite may be busy.
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(grader: str, answer: str, reference: str, **opts) -> None:
    started = time.monotonic()
    try:
        g = grade(grader, answer, reference, **opts)
    except (ValueError, GradingError):
        return
    assert isinstance(g, Grade) and 0.0 <= g.score <= 1.0 and isinstance(g.detail, str)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("grader", ["math", "choice", "exact"])
@FAST
@given(answer=TEXT, reference=TEXT)
def test_text_graders_survive_any_input(grader, answer, reference):
    check(grader, answer, reference)


@FAST
@given(answer=TEXT, reference=TEXT, mode=st.sampled_from(["fullmatch", "search"]), ignore_case=st.booleans())
def test_the_regex_grader_survives_any_pattern(answer, reference, mode, ignore_case):
    check("regex", answer, reference, mode=mode, ignore_case=ignore_case, timeout=0.2)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=TEXT, reference=TEXT)
def test_the_code_grader_survives_any_input(answer, reference):
    try:
        g = grade("code", answer, reference, timeout=3)
    except GradingError:  # the sandbox is unavailable here: refused, never run unsandboxed
        return
    assert 0.0 <= g.score <= 1.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=TEXT, metadata=st.dictionaries(st.sampled_from(["baton_eval", "grader", "reference", "x"]),
                                              st.one_of(TEXT, st.sampled_from(["quiz:q1", "quiz:q2", "quiz:"])),
                                              max_size=4))
def test_scoring_never_raises(answer, metadata):
    from baton.v1 import requests_pb2, responses_pb2

    evals = EvalRegistry({"quiz": {"q1": EvalItem("quiz", "q1", "math", "\\frac{1}{2}"),
                                   "q2": EvalItem("quiz", "q2", "regex", "(a+)+$", {"mode": "search", "timeout": 0.2})}})
    r = responses_pb2.Response(request_id="r", answer=answer)
    r.episode.request.CopyFrom(requests_pb2.ChatRequest(request_id="r", metadata=metadata))
    reward = score(r, "conductor", 0.0, evals)
    assert reward.quality is None or 0.0 <= reward.quality <= 1.0
    if metadata.get("baton_eval") not in ("quiz:q1", "quiz:q2"):
        assert reward.quality is None, "only the operator's items are graded"


def _message_types():
    import baton.v1 as package

    kinds = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"baton.v1.{info.name}")
            kinds += [getattr(module, name) for name in module.DESCRIPTOR.message_types_by_name]
    return kinds


MESSAGE_TYPES = _message_types()


def test_every_contract_message_type_is_covered():
    names = {k.DESCRIPTOR.full_name for k in MESSAGE_TYPES}
    assert {"baton.v1.Response", "baton.v1.ChatRequest", "baton.v1.Task", "baton.v1.WorkflowEvent",
            "baton.v1.Feedback", "baton.v1.PolicyUpdate", "baton.v1.DeadLetter"} <= names


@pytest.mark.parametrize("kind", MESSAGE_TYPES, ids=lambda k: k.DESCRIPTOR.full_name)
@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=512), st.lists(st.sampled_from(
    [b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x08", b"\x10", b"\xff", b"\x80", b"\x01", b"\x00", b"\x7f", b"\xc3\x28"]),
    max_size=200).map(b"".join)))
def test_decoding_any_bytes_gives_the_message_or_a_poison_message(kind, raw):
    try:
        value = decode(kind, raw)
    except PoisonMessage:
        return
    assert isinstance(value, kind)


def test_deeply_nested_bytes_are_a_poison_message_not_a_crash():
    from baton.v1 import responses_pb2

    # Field 1 of an Episode is a ChatRequest; nesting length-delimited fields thousands deep.
    raw = b""
    for _ in range(5000):
        raw = b"\x0a" + _varint(len(raw)) + raw
    try:
        decode(responses_pb2.Episode, raw)
    except PoisonMessage:
        pass


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=400))
def test_the_reward_loggers_row_makers_take_any_bytes(raw):
    for kind, make in ((responses_pb2.Response, response_row_maker("conductor", 0.0, EvalRegistry())),
                       (feedback_pb2.Feedback, feedback_row_maker())):
        try:
            made = make(decode(kind, raw), 0, 0)
        except PoisonMessage:
            continue
        assert made is None or isinstance(made[0], dict)
