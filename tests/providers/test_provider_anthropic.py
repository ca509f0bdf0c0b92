from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from baton_executor.providers import ProviderCall, ProviderError, build_provider
from baton_tools.standins import configure_standin, standin_requests


def call(**overrides) -> ProviderCall:
    values = {
        "model": "claude-test",
        "messages": [
            {"role": "system", "content": "Rule one."},
            {"role": "user", "content": "Hello"},
            {"role": "system", "content": "Rule two."},
        ],
        "timeout_s": 5.0,
    }
    values.update(overrides)
    return ProviderCall(**values)


@pytest.mark.parametrize("stream", [False, True])
async def test_system_messages_go_to_top_level_system_field(make_provider, standins, stream):
    reply = await make_provider("anthropic", stream=stream).complete(call())

    body = standin_requests(standins["anthropic"])[-1]["body"]
    assert body["system"] == "Rule one.\n\nRule two."
    assert body["messages"] == [{"role": "user", "content": "Hello"}]
    assert reply.text == "[claude-test] saw: system: Rule one.\n\nRule two. | user: Hello"


async def test_max_tokens_always_sent(make_provider, standins):
    await make_provider("anthropic", max_output_tokens_default=77).complete(call())
    await make_provider("anthropic", max_output_tokens_default=None).complete(call())
    await make_provider("anthropic").complete(call(max_tokens=5))

    sent = [r["body"]["max_tokens"] for r in standin_requests(standins["anthropic"])]
    assert sent == [77, 1024, 5]


async def test_default_overload_is_529_overloaded_error(make_provider, standins):
    configure_standin(standins["anthropic"], fail_first=1)

    with pytest.raises(ProviderError) as info:
        await make_provider("anthropic").complete(call())

    assert info.value.status == 529
    assert info.value.retryable is True
    assert "overloaded" in info.value.reason


async def test_mid_stream_error_event_is_classified_by_type(make_provider, standins):
    configure_standin(standins["anthropic"], fail_first=1, fail_mid_stream=True)

    with pytest.raises(ProviderError) as info:
        await make_provider("anthropic", stream=True).complete(call())

    assert info.value.retryable is True
    assert "Overloaded" in info.value.reason


def _mock(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _error_response(status: int, type_: str, message: str, headers=None, **extra) -> httpx.Response:
    error = {"type": type_, "message": message, **extra}
    return httpx.Response(status, json={"type": "error", "error": error, "request_id": "req_x"}, headers=headers)


async def test_spend_limit_429_is_final():
    def handler(request):
        return _error_response(429, "rate_limit_error", "You have reached your specified API usage limits.",
                               details={"error_code": "enforced_spend_limit_reached"})  # fmt: skip

    async with _mock(handler) as client:
        provider = build_provider("anthropic", base_url="http://anthropic.test", api_key="k", client=client)
        with pytest.raises(ProviderError) as info:
            await provider.complete(call())

    assert info.value.retryable is False
    assert info.value.status == 429


async def test_retry_after_falls_back_to_ratelimit_reset_header():
    reset = (datetime.now(UTC) + timedelta(seconds=20)).isoformat().replace("+00:00", "Z")

    def handler(request):
        headers = {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": reset}
        return _error_response(429, "rate_limit_error", "Too many tokens", headers=headers)

    async with _mock(handler) as client:
        provider = build_provider("anthropic", base_url="http://anthropic.test", api_key="k", client=client)
        with pytest.raises(ProviderError) as info:
            await provider.complete(call())

    assert info.value.retryable is True
    assert 15 < info.value.retry_after_s <= 20


async def test_prompt_caching_counts_toward_input_tokens_and_v1_suffix_is_tolerated():
    seen = {}

    def handler(request):
        seen["url"] = str(request.url)
        seen["headers"] = request.headers
        usage = {"input_tokens": 3, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 100,
                 "output_tokens": 2}  # fmt: skip
        content = [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "ok"}]
        return httpx.Response(200, json={"type": "message", "model": "claude-x-20250101", "content": content,
                                         "stop_reason": "end_turn", "usage": usage})  # fmt: skip

    async with _mock(handler) as client:
        provider = build_provider("anthropic", base_url="http://anthropic.test/v1", api_key="k", client=client)
        reply = await provider.complete(call())

    assert seen["url"] == "http://anthropic.test/v1/messages"
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert seen["headers"]["x-api-key"] == "k"
    assert (reply.text, reply.input_tokens, reply.output_tokens, reply.model) == ("ok", 113, 2, "claude-x-20250101")


async def test_stream_cut_before_message_stop_is_retryable():
    events = (
        'event: message_start\ndata: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":1}}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"par"}}\n\n'
    )

    def handler(request):
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=events.encode(), headers={"content-type": "text/event-stream"})

    async with _mock(handler) as client:
        provider = build_provider("anthropic", base_url="http://a.test", api_key="k", stream=True, client=client)
        with pytest.raises(ProviderError) as info:
            await provider.complete(call())

    assert info.value.retryable is True
    assert "stream ended" in info.value.reason


async def test_standin_requires_max_tokens_and_rejects_system_role(standins, api_key):
    url = f"{standins['anthropic']}/v1/messages"
    headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        no_max = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        missing = await client.post(url, headers=headers, json=no_max)
        system_role = await client.post(
            url, headers=headers,
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        )  # fmt: skip
        no_version = await client.post(
            url, headers={"x-api-key": headers["x-api-key"]},
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )  # fmt: skip

    assert missing.status_code == 400
    assert missing.json()["error"] == {"type": "invalid_request_error", "message": "max_tokens: Field required"}
    assert missing.json()["type"] == "error"
    assert system_role.status_code == 400
    assert "top-level `system` parameter" in system_role.json()["error"]["message"]
    assert no_version.status_code == 400


async def test_standin_stream_has_the_documented_event_sequence(standins, api_key):
    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "a b"}]}
    headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{standins['anthropic']}/v1/messages", headers=headers, json=body)

    names = [line.split(": ", 1)[1] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["anthropic-ratelimit-requests-remaining"].isdigit()
