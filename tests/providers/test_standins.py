"""The stand-in servers themselves: rate window, counters, runtime config, runners."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from baton_tools.standins import (
    configure_standin,
    reset_standin,
    run_standin,
    standin_stats,
)
from baton_tools.standins.__main__ import main as cli_main
from baton_tools.standins.core import limit_words, split_for_stream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


async def test_sliding_window_rate_limit_and_counters():
    with run_standin("openai", rpm=2, window_s=0.5) as url:
        async with httpx.AsyncClient() as client:
            def post():
                return client.post(f"{url}/chat/completions", json=BODY)

            first, second, third = [await post() for _ in range(3)]

            assert [r.status_code for r in (first, second, third)] == [200, 200, 429]
            assert first.headers["x-ratelimit-remaining-requests"] == "1"
            assert second.headers["x-ratelimit-remaining-requests"] == "0"
            assert third.headers["retry-after"] == "1"
            assert 0 < int(third.headers["retry-after-ms"]) <= 500
            assert third.json()["error"]["code"] == "rate_limit_exceeded"

            await asyncio.sleep(int(third.headers["retry-after-ms"]) / 1000 + 0.05)
            assert (await post()).status_code == 200

        stats = standin_stats(url)
    assert stats["requests"] == 4
    assert stats["served"] == 3
    assert stats["rate_limited"] == 1
    assert stats["by_status"] == {"200": 3, "429": 1}


@pytest.mark.parametrize(
    ("kind", "path", "status_field"),
    [
        ("anthropic", "/v1/messages", ("error", "type")),
        ("gemini", "/v1beta/models/m:generateContent", ("error", "status")),
    ],
)
async def test_rate_limit_bodies_and_headers(kind, path, status_field):
    bodies = {
        "anthropic": {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
    }
    with run_standin(kind, rpm=0) as url:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{url}{path}", json=bodies[kind], headers={"anthropic-version": "2023-06-01"}
            )
    outer, inner = status_field
    assert response.status_code == 429
    assert response.json()[outer][inner] in ("rate_limit_error", "RESOURCE_EXHAUSTED")
    assert response.headers["retry-after"] == "60"
    if kind == "anthropic":
        assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert response.json()["type"] == "error"


def test_runtime_config_and_reset():
    with run_standin("gemini", latency_ms=5) as url:
        assert configure_standin(url, rpm=3, fail_first=2)["rpm"] == 3
        with pytest.raises(ValueError, match="unknown stand-in option"):
            configure_standin(url, rpn=3)
        assert standin_stats(url)["failures_left"] == 2
        reset_standin(url)
        stats = standin_stats(url)
        assert stats["failures_left"] == 0
        config = httpx.get(f"{url}/_standin/config").json()
        assert (config["rpm"], config["latency_ms"]) == (None, 5)


def test_subprocess_mode_keeps_key_out_of_argv(api_key):
    with run_standin("openai", mode="subprocess", require_key=api_key, rpm=100) as url:
        ok = httpx.post(f"{url}/chat/completions", json=BODY, headers={"authorization": f"Bearer {api_key}"})
        denied = httpx.post(f"{url}/chat/completions", json=BODY, headers={"authorization": "Bearer nope"})
        stats = standin_stats(url)
        config = httpx.get(f"{url}/_standin/config").json()

    assert ok.status_code == 200
    assert ok.json()["choices"][0]["message"]["content"] == "[m] saw: user: hello there"
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_api_key"
    assert stats["served"] == 1 and stats["rejected"] == 1
    assert config["require_key"] == "(set)"  # the key itself is never served back
    assert config["rpm"] == 100


def test_cli_rejects_bad_options(capsys):
    assert cli_main(["openai", "--window-s", "0"]) == 2
    assert "window_s" in capsys.readouterr().err


def test_stream_split_and_word_limit_are_exact():
    text = "[m] saw: user: a  b\nc | assistant: d"
    assert "".join(split_for_stream(text)) == text
    assert "".join(split_for_stream(text, max_chunks=2)) == text
    assert limit_words(text, 3) == ("[m] saw: user:", 3, True)
    assert limit_words(text, 100) == (text, 9, False)


def test_thread_runner_stops_promptly():
    started = time.monotonic()
    with run_standin("anthropic") as url:
        assert url.startswith("http://127.0.0.1:")
    assert time.monotonic() - started < 3


def test_tool_turns_are_checked_as_the_real_apis_check_them():
    # A tool result must answer a call of the turn before, in each API's own terms.
    with run_standin("openai") as openai_url, run_standin("anthropic") as anthropic_url:
        stray = httpx.post(f"{openai_url}/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "r"}]})
        assert stray.status_code == 400 and "'tool_calls'" in stray.json()["error"]["message"]
        forced = httpx.post(f"{openai_url}/chat/completions", json={**BODY, "tool_choice": "required"})
        assert forced.status_code == 400 and forced.json()["error"]["param"] == "tool_choice"
        orphan = httpx.post(f"{anthropic_url}/v1/messages", headers={"anthropic-version": "2023-06-01"}, json={
            "model": "m", "max_tokens": 5, "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]})
        assert orphan.status_code == 400 and "tool_use_id" in orphan.json()["error"]["message"]


def test_a_stand_in_model_picks_the_tool_the_question_names_and_fills_arguments_from_it():
    from baton_tools.standins.behaviour import Wants, instance, tool_calls

    wants = Wants(tools=[("get_time", {}), ("get_weather", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["C", "F"]}}})])
    (call,) = tool_calls(wants, [("user", "Weather in Oslo for 4 days?")], 7)
    assert (call.name, call.arguments, call.id) == ("get_weather", {"city": "Oslo", "days": 4, "units": "C"},
                                                    "call_standin000007")
    assert tool_calls(wants, [("user", "Weather?"), ("tool", "rain")], 8) == []  # it answers the result
    assert instance({"$defs": {"P": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                     "$ref": "#/$defs/P"}, "age 36") == {"n": 36}
    assert instance({"type": "object", "properties": []}, "x") == {}  # not a schema: still an answer
