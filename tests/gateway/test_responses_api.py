"""The Responses API's translation into chat requests, its response objects and events, and the store
of responses, without a broker (the end-to-end suite, tests/e2e/test_responses.py, runs them on one)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from baton.v1 import responses_pb2
from baton_gateway.api import ApiError
from baton_gateway.responses_api import chat_request_for, parse_responses_request, response_body, turn_messages
from baton_gateway.responses_routes import Events
from baton_gateway.stored import StoredResponses


def chat(data: dict, history: list | None = None):
    return chat_request_for(parse_responses_request({"model": "baton", **data}), history or [], {"baton"})


def error_of(data: dict) -> ApiError:
    with pytest.raises(ApiError) as err:
        chat(data)
    return err.value


def test_input_items_become_the_chat_turns_they_mean():
    req = chat({"instructions": "Be brief.", "input": [
        {"role": "user", "content": "Weather in Paris and Rome?"},  # the SDK's short form: no type
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Rain"}]}]})
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "tool"]
    assistant = req.messages[2]
    assert assistant.text() == "Let me look." and [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert [m.text() for m in req.messages[3:]] == ["Sunny", "Rain"]


def test_parameters_map_onto_the_answering_steps_options():
    req = chat({"input": "hi", "max_output_tokens": 7, "temperature": 0.2, "top_p": 0.5, "metadata": {"k": "v"},
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False,
                "text": {"format": {"type": "json_schema", "name": "Out", "schema": {"type": "object"}, "strict": True}}})
    assert (req.max_completion_tokens, req.temperature, req.top_p, req.metadata) == (7, 0.2, 0.5, {"k": "v"})
    assert req.tools[0].function.name == "f" and req.tool_choice.function.name == "f"
    assert req.parallel_tool_calls is False
    assert req.response_format.json_schema.name == "Out" and req.response_format.json_schema.strict


def test_history_comes_before_this_turn_and_instructions_first():
    history = [{"role": "user", "content": "I am Ada."}, {"role": "assistant", "content": "Hello Ada."}]
    req = chat({"input": "Who am I?", "instructions": "Be kind."}, history)
    assert [m.text() for m in req.messages] == ["Be kind.", "I am Ada.", "Hello Ada.", "Who am I?"]


@pytest.mark.parametrize(("data", "param"), [
    ({"input": "hi", "reasoning": {"effort": "low"}}, "reasoning"),
    ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools.0"),
    ({"input": "hi", "tools": 7}, "tools"),  # the fuzz found a 500 here: tools was iterated before its type was checked
    ({"input": "hi", "tools": {"type": "function"}}, "tools"),
    ({"input": "hi", "include": ["file_search_call.results"]}, "include"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "stream": "yes"}, "stream"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0"),
    ({"input": [{"type": "message", "role": "user", "content": "hi", "colour": 1}]}, "input.0.colour"),
    ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "input"),
    ({"input": "  "}, "input"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}},
     "text.format.schema"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(data, param):
    err = error_of(data)
    assert (err.status, err.param) == (400, param), err.message
    assert "messages" not in err.message and "response_format" not in err.message, err.message


def test_an_unknown_model_is_a_404():
    with pytest.raises(ApiError) as err:
        chat_request_for(parse_responses_request({"model": "other", "input": "hi"}), [], {"baton"})
    assert err.value.status == 404


def answered(answer: str = "", calls=(), finish: str = "stop") -> responses_pb2.Response:
    r = responses_pb2.Response(request_id="r1", answer=answer, finish_reason=finish)
    for call_id, name, arguments in calls:
        r.tool_calls.add(id=call_id, name=name, arguments=arguments)
    r.episode.total.input_tokens, r.episode.total.output_tokens = 10, 4
    return r


def test_the_response_object_says_completed_incomplete_or_calls_a_function():
    req = parse_responses_request({"model": "baton", "input": "hi", "store": False})
    body = response_body("r1", req, 0, answered("Hello."))
    assert (body["status"], body["id"], body["store"]) == ("completed", "resp_r1", False)
    assert body["output"][0]["content"][0]["text"] == "Hello."
    assert body["usage"]["total_tokens"] == 14
    cut = response_body("r1", req, 0, answered("Hel", finish="length"))
    assert (cut["status"], cut["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    called = response_body("r1", req, 0, answered(calls=[("c1", "f", "{}")]))
    assert [(i["type"], i.get("call_id")) for i in called["output"]] == [("function_call", "c1")]
    assert turn_messages(req, answered(calls=[("c1", "f", "{}")]))[-1]["tool_calls"][0]["id"] == "c1"


def events_of(stream: list[str]) -> list[dict]:
    return [json.loads(e.split("data: ", 1)[1]) for e in stream]


def test_streamed_events_open_the_message_at_its_first_text_and_number_every_event():
    events = Events("r1")
    sent = [events.send("response.created"), *events.text("Hel"), *events.finish(answered("Hello.", [("c1", "f", "{}")]), "lo.")]
    got = events_of(sent)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [e["type"] for e in got] == [
        "response.created", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == "Hello."
    assert got[8]["output_index"] == 1 and got[-1]["item"]["call_id"] == "c1"


class _Out:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, body: bytes, *, key: str) -> None:
        self.sent.append((key, body))


def test_stored_responses_are_the_tenants_own_and_chain_into_a_conversation():
    async def run():
        out = _Out()
        store = StoredResponses(None, out, retention_s=3600)  # type: ignore[arg-type]
        store.table.catch_up = lambda: asyncio.sleep(0)  # type: ignore[method-assign] - no broker: nothing to read
        await store.put("a", "team", {"id": "resp_a"}, [{"role": "user", "content": "1"}], None)
        await store.put("b", "team", {"id": "resp_b"}, [{"role": "user", "content": "2"}], "a")
        assert [m["content"] for m in await store.history("b", "team")] == ["1", "2"]
        assert await store.get("a", "others") is None  # another tenant's id is not found
        assert await store.history("b", "others") is None
        store._take("c", b'{"tenant": "team", "body": [], "messages": "x"}')  # malformed: skipped
        store._take("d", b"not json")
        assert await store.get("c", "team") is None and await store.get("d", "team") is None
        await store.delete("a", "team")
        assert await store.get("a", "team") is None and await store.history("b", "team") is None
        assert json.loads(out.sent[-1][1])["deleted"] is True
        stale = {"tenant": "team", "body": {}, "messages": [], "previous": None, "stored_at": time.time() - 7200}
        store._take("old", json.dumps(stale).encode())
        assert await store.get("old", "team") is None  # past the retention

    asyncio.run(run())
