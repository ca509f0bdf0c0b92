"""OpenAI's Responses API, used as its clients use it, against the gateway: every service its own
process on a real Kafka broker, the plan's two steps on an OpenAI-compatible stand-in that speaks the
real wire format of tool calls and JSON mode. The official `openai` client's `responses` calls, and
`openai-agents` in its default configuration (which speaks the Responses API)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from pydantic import BaseModel
from testbed import two_step_standin_stack

from baton_tools.standins.server import reset_standin, standin_requests

DRAFT = "Draft what the answer needs."
ANSWER = "Give the final answer."
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    with two_step_standin_stack(kafka_bootstrap, tmp_path_factory.mktemp("responses"), (DRAFT, ANSWER)) as st:
        yield st


@pytest.fixture
def client(stack):
    reset_standin(stack.standin_url)
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)


def answering_bodies(stack) -> list[dict]:
    return [r["body"] for r in standin_requests(stack.standin_url) if r["body"]["model"] == "answerer-model"]


def test_a_response_answers_with_the_workflow_and_reaches_the_answering_step(stack, client):
    r = client.responses.create(model="baton", input="Tell me about Paris.", instructions="Answer in one line.",
                                temperature=0.5)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens > 0
    assert [s["worker"] for s in r.model_extra["baton"]["steps"]] == ["drafter", "answerer"]
    (body,) = answering_bodies(stack)
    assert body["temperature"] == 0.5
    assert any(m["role"] == "system" and "Answer in one line." in json.dumps(m) for m in body["messages"])

    cut = client.responses.create(model="baton", input="Tell me about Paris.", max_output_tokens=5)
    assert (cut.status, cut.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert answering_bodies(stack)[-1]["max_tokens"] == 5 and len(cut.output_text.split()) <= 5


def test_a_function_tool_round_trip_continues_the_stored_conversation(stack, client):
    first = client.responses.create(model="baton", input="What is the weather in Paris?", tools=[WEATHER_TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    # The next turn sends only the tool's result: the gateway holds the rest of the conversation.
    second = client.responses.create(model="baton", previous_response_id=first.id, tools=[WEATHER_TOOL], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C in Paris"}])
    assert "Sunny, 24 C in Paris" in second.output_text
    last = answering_bodies(stack)[-1]["messages"]
    assert [m["role"] for m in last][-3:] == ["user", "assistant", "tool"]
    assert "What is the weather in Paris?" in json.dumps(last)

    assert client.responses.retrieve(second.id).output_text == second.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:  # what it continued is gone, so is the conversation
        client.responses.create(model="baton", previous_response_id=second.id, input="And tomorrow?")
    assert err.value.body["param"] == "previous_response_id"


def test_a_stored_conversation_outlives_a_gateway_killed_and_started_again(stack, client):
    first = client.responses.create(model="baton", input="My name is Ada. Tell me about Paris.")
    stack.kill("gateway")
    stack.restart("gateway")
    again = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    assert again.responses.retrieve(first.id).output_text == first.output_text
    second = again.responses.create(model="baton", previous_response_id=first.id, input="What is my name?")
    assert second.previous_response_id == first.id
    assert "My name is Ada." in json.dumps(answering_bodies(stack)[-1]["messages"])


def test_an_unstored_response_cannot_be_read_back(stack, client):
    r = client.responses.create(model="baton", input="Tell me about Paris.", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_streaming_sends_the_typed_events_in_order(stack, client):
    with client.responses.stream(model="baton", input="Tell me about Paris.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for opened, closed in (("response.output_item.added", "response.output_item.done"),
                           ("response.content_part.added", "response.content_part.done")):
        assert types.index(opened) < types.index("response.output_text.delta") < types.index(closed)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and final.output_text
    assert final.usage.total_tokens > 0

    with client.responses.stream(model="baton", input="What is the weather in Paris?", tools=[WEATHER_TOOL]) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in types
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"}


class Forecast(BaseModel):
    city: str
    days: int


def test_a_json_schema_text_format_reaches_the_answering_step(stack, client):
    r = client.responses.parse(model="baton", input="What is the weather in Paris for 3 days?", text_format=Forecast)
    assert r.output_parsed == Forecast(city="Paris", days=3)
    assert answering_bodies(stack)[-1]["response_format"]["type"] == "json_schema"


def test_what_no_workflow_can_honour_is_a_400_naming_it(stack, client):
    cases = [({"reasoning": {"effort": "high"}}, "reasoning"),
             ({"tools": [{"type": "web_search"}]}, "tools.0"),
             ({"background": True}, "background"),
             ({"include": ["reasoning.encrypted_content"]}, "include"),
             ({"max_output_tokens": 0}, "max_output_tokens"),
             ({"frobnicate": 1}, "frobnicate")]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="baton", input="hi", extra_body=extra)
        assert err.value.body["param"] == param, (extra, err.value.body)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="baton", input=[{"type": "function_call_output", "call_id": "c1", "output": "x"}])
    assert err.value.body["param"] == "input", err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="baton", input="hi", previous_response_id="resp_unknown")
    assert err.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")


def test_openai_agents_in_its_default_configuration_runs_the_tool_loop(stack, client):
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    looked_up: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        looked_up.append(city)
        return f"Sunny, 24 C in {city}"

    paths: list[str] = []

    async def record(request: httpx.Request) -> None:
        paths.append(request.url.path)

    async def run(streamed: bool):
        http = httpx.AsyncClient(event_hooks={"request": [record]})
        set_default_openai_client(openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0,
                                                     timeout=60, http_client=http))
        agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather], model="baton")
        if not streamed:
            return (await Runner.run(agent, "What is the weather in Paris?")).final_output
        result = Runner.run_streamed(agent, "What is the weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result.final_output

    for streamed in (False, True):
        reset_standin(stack.standin_url)
        final = asyncio.run(run(streamed))
        assert looked_up[-1] == "Paris"
        assert "Sunny, 24 C in Paris" in final, final
        assert [m["role"] for m in answering_bodies(stack)[-1]["messages"]][-2:] == ["assistant", "tool"]
    assert len(looked_up) == 2
    assert paths and set(paths) == {"/v1/responses"}, paths  # its default: the Responses API, not chat completions
