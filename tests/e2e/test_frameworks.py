"""Agent and structured-output frameworks, used as their users use them, against the gateway: every
service its own process on a real Kafka broker, both plan steps on an OpenAI-compatible stand-in that
speaks the real wire format of tool calls and JSON mode.

The plan has a drafting step before the answering one, so each test also shows that only the answering
step gets the client's tools and response format, and that the drafting step still sees a tool turn's
results (as text).
"""

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


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    with two_step_standin_stack(kafka_bootstrap, tmp_path_factory.mktemp("frameworks"), (DRAFT, ANSWER)) as st:
        yield st


@pytest.fixture
def standin(stack):
    reset_standin(stack.standin_url)
    yield stack.standin_url


def provider_bodies(standin_url: str) -> tuple[list[dict], list[dict]]:
    """The request bodies the drafting and the answering steps sent to the provider."""
    bodies = [r["body"] for r in standin_requests(standin_url)]
    return ([b for b in bodies if b["model"] == "drafter-model"], [b for b in bodies if b["model"] == "answerer-model"])


def assert_only_the_answering_step_had(standin_url: str, *fields: str) -> None:
    drafts, answers = provider_bodies(standin_url)
    assert drafts and answers
    for body in drafts:
        assert not set(fields) & set(body), body
        assert all(m["role"] in ("system", "user", "assistant") and "tool_calls" not in m for m in body["messages"])
    for body in answers:
        assert set(fields) <= set(body), body


# -- openai-agents ------------------------------------------------------------------------------


def test_openai_agents_runs_the_tool_loop_to_a_final_answer(stack, standin):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    looked_up: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        looked_up.append(city)
        return f"Sunny, 24 C in {city}"

    async def run(streamed: bool):
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather],
                      model=OpenAIChatCompletionsModel(model="baton", openai_client=client))
        if not streamed:
            return (await Runner.run(agent, "What is the weather in Paris?")).final_output
        result = Runner.run_streamed(agent, "What is the weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result.final_output

    for streamed in (False, True):
        reset_standin(standin)
        final = asyncio.run(run(streamed))
        assert looked_up[-1] == "Paris"
        # The answering step's second turn saw the tool's result and answered with it.
        assert "Sunny, 24 C in Paris" in final, final
        assert_only_the_answering_step_had(standin, "tools")
        drafts, answers = provider_bodies(standin)
        assert [m["role"] for m in answers[-1]["messages"]][-2:] == ["assistant", "tool"]
        # The drafting step of the tool turn saw the result too, as text.
        assert "Sunny, 24 C in Paris" in json.dumps(drafts[-1]["messages"])
    assert len(looked_up) == 2


# -- langchain-openai ---------------------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    days: int


def chat(stack):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="baton", base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)


def test_langchain_bind_tools_gets_tool_calls_plain_and_streamed(stack, standin):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city."""
        return "sunny"

    bound = chat(stack).bind_tools([get_weather])
    message = bound.invoke("What is the weather in Paris for 3 days?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert_only_the_answering_step_had(standin, "tools")

    merged = None
    for chunk in bound.stream("What is the weather in Paris for 3 days?"):
        merged = chunk if merged is None else merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(stack, standin, method):
    result = chat(stack).with_structured_output(Forecast, method=method).invoke("What is the weather in Paris for 3 days?")
    assert result == Forecast(city="Paris", days=3)
    assert_only_the_answering_step_had(standin, "response_format" if method == "json_schema" else "tools")


# -- instructor ---------------------------------------------------------------------------------


class Person(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_extracts_a_pydantic_model(stack, standin, mode):
    import instructor

    client = instructor.from_openai(openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0,
                                                  timeout=60), mode=getattr(instructor.Mode, mode))
    person = client.chat.completions.create(
        model="baton", response_model=Person, max_retries=0,
        messages=[{"role": "user", "content": "Extract the person: Ada Lovelace was 36 years old."}])
    assert isinstance(person, Person) and (person.name, person.age) == ("Lovelace", 36)
    assert_only_the_answering_step_had(standin, "tools" if mode == "TOOLS" else "response_format")


# -- the official client, parameter by parameter ------------------------------------------------


def test_max_tokens_stop_and_logprobs_reach_the_answering_step(stack, standin):
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="baton", max_tokens=5, logprobs=True, top_logprobs=2, seed=3,
                                           messages=[{"role": "user", "content": "Tell me about Paris."}])
    answering = [s for s in reply.model_extra["baton"]["steps"] if s["worker"] == "answerer"][0]
    assert answering["output_tokens"] <= 5 and len(reply.choices[0].message.content.split()) <= 5
    assert reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].logprobs.content) == len(reply.choices[0].message.content.split())
    drafts, answers = provider_bodies(standin)
    assert drafts[-1]["max_tokens"] != 5 and "seed" not in drafts[-1] and "logprobs" not in drafts[-1]
    assert (answers[-1]["max_tokens"], answers[-1]["seed"], answers[-1]["top_logprobs"]) == (5, 3, 2)

    as_json = client.chat.completions.create(model="baton", response_format={"type": "json_object"},
                                             messages=[{"role": "user", "content": "Tell me about Paris in JSON."}])
    assert isinstance(json.loads(as_json.choices[0].message.content), dict)

    stopped = client.chat.completions.create(model="baton", stop=["Paris"],
                                             messages=[{"role": "user", "content": "Tell me about Paris."}])
    assert "Paris" not in stopped.choices[0].message.content


def test_an_unsupported_parameter_is_a_400_naming_it(stack):
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "hi"}],
                                       modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    assert err.value.body["param"] == "audio" and "audio" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "hi"}], n=2)
    assert err.value.body["param"] == "n"
    raw = httpx.post(stack.base_url + "/chat/completions", json={
        "model": "baton", "messages": [{"role": "user", "content": "hi"}], "frobnicate": True})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "frobnicate"
