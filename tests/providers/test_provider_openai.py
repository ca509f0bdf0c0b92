from __future__ import annotations

import httpx
import pytest

from baton_executor.providers import ProviderCall, ProviderError, build_provider
from baton_tools.standins import run_standin, standin_requests


def call(**overrides) -> ProviderCall:
    values = {"model": "gpt-test", "messages": [{"role": "user", "content": "Hi"}], "timeout_s": 5.0}
    values.update(overrides)
    return ProviderCall(**values)


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sends_max_completion_tokens_and_stream_options(make_provider, standins, stream):
    await make_provider("openai", stream=stream).complete(call(max_tokens=9))

    body = standin_requests(standins["openai"])[-1]["body"]
    assert body["max_completion_tokens"] == 9
    assert "max_tokens" not in body
    if stream:
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert "stream" not in body


async def test_compatible_sends_max_tokens(make_provider, standins):
    await make_provider("openai_compatible").complete(call(max_tokens=9))

    body = standin_requests(standins["openai"])[-1]["body"]
    assert body["max_tokens"] == 9
    assert "max_completion_tokens" not in body


async def test_compatible_works_without_a_key():
    with run_standin("openai") as base_url:
        async with httpx.AsyncClient() as client:
            provider = build_provider("openai_compatible", base_url=base_url, api_key=None, client=client)
            reply = await provider.complete(call())

    assert reply.text == "[gpt-test] saw: user: Hi"


def test_compatible_needs_base_url_and_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="base_url"):
        build_provider("openai_compatible", base_url=None, api_key=None)
    with pytest.raises(ValueError, match="unknown provider kind 'mistral'"):
        build_provider("mistral", base_url=None, api_key=None)


def _mock(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def _complete(handler, *, stream=False, kind="openai"):
    async with _mock(handler) as client:
        provider = build_provider(kind, base_url="http://openai.test/v1", api_key="sk-k", stream=stream, client=client)
        return await provider.complete(call())


def _error(status, message, type_, code=None, headers=None):
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return httpx.Response(status, json=body, headers=headers)


async def test_insufficient_quota_429_is_final():
    def handler(request):
        return _error(429, "You exceeded your current quota, please check your plan and billing details.",
                      "insufficient_quota", "insufficient_quota")  # fmt: skip

    with pytest.raises(ProviderError) as info:
        await _complete(handler)

    assert info.value.retryable is False
    assert info.value.status == 429


async def test_retry_after_falls_back_to_ratelimit_reset_headers():
    def handler(request):
        headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m30s",
                   "x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "5s"}  # fmt: skip
        return _error(429, "Rate limit reached", "requests", "rate_limit_exceeded", headers)

    with pytest.raises(ProviderError) as info:
        await _complete(handler)

    assert info.value.retry_after_s == 90.0


async def test_vllm_style_context_error_is_final():
    def handler(request):
        message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
        body = {"object": "error", "type": "BadRequestError", "code": 400, "message": message}
        return httpx.Response(400, json=body)

    with pytest.raises(ProviderError) as info:
        await _complete(handler, kind="openai_compatible")

    assert info.value.retryable is False
    assert "context window" in info.value.reason


async def test_server_that_ignores_stream_flag_still_works():
    def handler(request):
        body = {"model": "m", "choices": [{"message": {"content": "plain"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1}}  # fmt: skip
        return httpx.Response(200, json=body)

    reply = await _complete(handler, stream=True)

    assert reply.text == "plain"


async def test_stream_without_done_marker_is_retryable():
    def handler(request):
        body = b'data: {"model":"m","choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}\n\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(ProviderError) as info:
        await _complete(handler, stream=True)

    assert info.value.retryable is True


async def test_standin_validates_like_the_api(standins, api_key):
    url = f"{standins['openai']}/chat/completions"
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient() as client:
        bot = {"model": "m", "messages": [{"role": "bot", "content": "x"}]}
        bad_role = await client.post(url, headers=headers, json=bot)
        empty = await client.post(url, headers=headers, json={"model": "m", "messages": []})
        unknown = await client.post(url, headers=headers, json={"model": "m", "messages": [], "foo": 1})
        options = await client.post(
            url, headers=headers,
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}},
        )  # fmt: skip

    assert bad_role.status_code == 400
    assert bad_role.json()["error"]["param"] == "messages[0].role"
    assert bad_role.json()["error"]["code"] == "invalid_value"
    assert empty.json()["error"]["code"] == "empty_array"
    assert unknown.json()["error"]["message"] == "Unrecognized request argument supplied: foo"
    assert options.status_code == 400
