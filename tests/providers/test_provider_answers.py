"""The answering step's options through each adapter against its stand-in's real wire format: tools
and tool results, structured outputs, stop sequences, log-probabilities; plain and streaming."""

from __future__ import annotations

import json

import jsonschema
import pytest

from baton_executor.answers import check_reply, finish_reason
from baton_executor.providers import ProviderError
from baton_executor.providers.base import AnswerSpec, ProviderCall, ToolSpec
from baton_tools.standins.server import standin_requests

KINDS = ("openai", "openai_compatible", "anthropic", "gemini")
WEATHER = ToolSpec(name="get_weather", description="The weather in a city.", parameters={
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]})
CLOCK = ToolSpec(name="get_time", parameters={"type": "object", "properties": {"zone": {"type": "string"}}})
QUESTION = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather in Paris for 3 days?"}]
both_modes = pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
kinds = pytest.mark.parametrize("kind", KINDS)


def call(spec: AnswerSpec, messages=QUESTION, **kw) -> ProviderCall:
    return ProviderCall(model="model-a", messages=messages, timeout_s=5.0, spec=spec, **kw)


def standin_of(kind: str) -> str:
    return "openai" if kind == "openai_compatible" else kind


@kinds
@both_modes
async def test_a_tool_call_comes_back_in_openai_terms(make_provider, standins, kind, stream):
    pieces: list[str] = []
    spec = AnswerSpec(tools=(CLOCK, WEATHER))
    reply = await make_provider(kind, stream=stream).complete(call(spec, on_delta=pieces.append if stream else None))
    assert [c.name for c in reply.tool_calls] == ["get_weather"]  # the tool the question names
    assert json.loads(reply.tool_calls[0].arguments) == {"city": "Paris", "days": 3}
    assert reply.tool_calls[0].id and finish_reason(reply) == "tool_calls" and reply.text == ""
    check_reply(spec, reply)


@kinds
@both_modes
async def test_the_tool_result_turn_reaches_the_provider_and_it_answers(make_provider, standins, kind, stream):
    first = await make_provider(kind).complete(call(AnswerSpec(tools=(WEATHER,))))
    made = first.tool_calls[0]
    turns = QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": made.id, "name": made.name, "arguments": made.arguments}]},
        {"role": "tool", "tool_call_id": made.id, "name": made.name, "content": "Sunny, 24 C"}]
    reply = await make_provider(kind, stream=stream).complete(call(AnswerSpec(tools=(WEATHER,)), messages=turns))
    assert not reply.tool_calls and "Sunny, 24 C" in reply.text  # the stand-in echoes what it saw
    assert finish_reason(reply) == "stop"


@kinds
async def test_a_forced_tool_is_called_and_tool_choice_none_answers_in_text(make_provider, standins, kind):
    provider = make_provider(kind)
    forced = await provider.complete(call(AnswerSpec(tools=(WEATHER, CLOCK), tool_choice="function",
                                                     tool_choice_name="get_time")))
    assert [c.name for c in forced.tool_calls] == ["get_time"]
    text = await provider.complete(call(AnswerSpec(tools=(WEATHER,), tool_choice="none")))
    assert not text.tool_calls and "Paris" in text.text


@kinds
@both_modes
async def test_json_schema_answers_validate(make_provider, standins, kind, stream):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    spec = AnswerSpec(response_format="json_schema", schema_name="forecast", schema=schema, schema_strict=True)
    reply = await make_provider(kind, stream=stream).complete(call(spec))
    jsonschema.validate(json.loads(reply.text), schema)
    assert json.loads(reply.text) == {"city": "Paris", "days": 3}
    check_reply(spec, reply)


@pytest.mark.parametrize("kind", ["openai", "openai_compatible", "gemini"])
async def test_json_object_mode_answers_an_object(make_provider, standins, kind):
    spec = AnswerSpec(response_format="json_object")
    reply = await make_provider(kind).complete(call(spec))
    assert isinstance(json.loads(reply.text), dict)
    check_reply(spec, reply)


async def test_anthropic_has_no_json_object_mode_so_the_answer_is_checked(make_provider, standins):
    spec = AnswerSpec(response_format="json_object")
    reply = await make_provider("anthropic").complete(call(spec))
    # The stand-in answers in text, as Claude may: the check refuses it, retryably.
    with pytest.raises(ProviderError) as err:
        check_reply(spec, reply)
    assert err.value.retryable and "not the JSON" in err.value.reason


@kinds
async def test_stop_sequences_and_sampling_options_reach_the_wire(make_provider, standins, kind):
    spec = AnswerSpec(stop=("Paris",), top_p=0.5)
    reply = await make_provider(kind).complete(call(spec))
    assert "Paris" not in reply.text and "weather in" in reply.text
    body = standin_requests(standins[standin_of(kind)])[-1]["body"]
    flat = json.dumps(body)
    assert "Paris" in flat and "0.5" in flat  # the stop sequence and top_p, in the API's own fields


@pytest.mark.parametrize("kind", ["openai", "gemini"])
@both_modes
async def test_logprobs_come_back_per_token(make_provider, standins, kind, stream):
    reply = await make_provider(kind, stream=stream).complete(call(AnswerSpec(logprobs=True, top_logprobs=2)))
    assert reply.logprobs and "".join(t.token for t in reply.logprobs).strip() == reply.text.strip()
    assert all(len(t.top) == 2 for t in reply.logprobs)


@pytest.mark.parametrize("kind, param", [("anthropic", "logprobs"), ("anthropic", "seed"),
                                         ("gemini", "logit_bias")])
async def test_a_parameter_the_api_lacks_fails_the_call_naming_it(make_provider, standins, kind, param):
    spec = AnswerSpec(logprobs=True) if param == "logprobs" else AnswerSpec(seed=1) if param == "seed" else \
        AnswerSpec(logit_bias={"1": 5})
    with pytest.raises(ProviderError) as err:
        await make_provider(kind).complete(call(spec))
    assert not err.value.retryable and param in err.value.reason


def test_a_reply_that_breaks_the_schema_or_calls_an_unknown_tool_is_refused():
    from baton_executor.providers.base import ProviderReply, ToolCall

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    spec = AnswerSpec(response_format="json_schema", schema=schema)
    for text, fragment in (('{"n": "x"}', "schema at n"), ("not json", "not the JSON"), ("{}", "schema")):
        with pytest.raises(ProviderError, match=fragment):
            check_reply(spec, ProviderReply(text=text, input_tokens=1, output_tokens=1, model="m"))
    with pytest.raises(ProviderError, match="not among the request's tools"):
        check_reply(AnswerSpec(tools=(WEATHER,)), ProviderReply(text="", input_tokens=1, output_tokens=1, model="m",
                                                                tool_calls=(ToolCall("c", "rm_rf", "{}"),)))
    with pytest.raises(ProviderError, match="called no tool"):
        check_reply(AnswerSpec(tools=(WEATHER,), tool_choice="required"),
                    ProviderReply(text="hi", input_tokens=1, output_tokens=1, model="m"))


@pytest.mark.timeout(60)
def test_a_catastrophic_pattern_in_the_schema_cannot_stall_the_executor():
    """`^(a+)+$` against 34 a's and a "!" kept an executor's event loop busy for minutes under Python's
    `re`; matched in linear time, the answer is refused at once and can be retried."""
    from baton_executor.providers.base import ProviderReply

    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}}}
    spec = AnswerSpec(response_format="json_schema", schema=schema)
    reply = ProviderReply(text=json.dumps({"word": "a" * 5000 + "!"}), input_tokens=1, output_tokens=1, model="m")
    with pytest.raises(ProviderError, match="schema at word") as err:
        check_reply(spec, reply)
    assert err.value.retryable
    # A task whose schema the gateway would have refused fails for good, saying why.
    refused = AnswerSpec(response_format="json_schema", schema={"type": "string", "pattern": "(?=a)"})
    with pytest.raises(ProviderError, match="linear time") as err:
        check_reply(refused, ProviderReply(text='"a"', input_tokens=1, output_tokens=1, model="m"))
    assert not err.value.retryable
