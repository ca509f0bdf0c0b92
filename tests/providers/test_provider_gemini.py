from __future__ import annotations

import httpx
import pytest

from baton_executor.providers import ProviderCall, ProviderError, build_provider
from baton_tools.standins import standin_requests

MESSAGES = [
    {"role": "system", "content": "Answer in French."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Salut"},
    {"role": "user", "content": "Bye"},
]


def call(**overrides) -> ProviderCall:
    values = {"model": "gemini-test", "messages": MESSAGES, "timeout_s": 5.0}
    values.update(overrides)
    return ProviderCall(**values)


@pytest.mark.parametrize("stream", [False, True])
async def test_request_shape_system_instruction_roles_and_config(make_provider, standins, stream):
    await make_provider("gemini", stream=stream).complete(call(max_tokens=64, temperature=0.2))

    seen = standin_requests(standins["gemini"])[-1]
    method = "streamGenerateContent" if stream else "generateContent"
    assert seen["path"] == f"/v1beta/models/gemini-test:{method}"
    assert seen["key_in_query"] is False
    assert seen["sse"] is stream
    assert seen["body"] == {
        "contents": [
            {"role": "user", "parts": [{"text": "Hi"}]},
            {"role": "model", "parts": [{"text": "Salut"}]},
            {"role": "user", "parts": [{"text": "Bye"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Answer in French."}]},
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.2},
    }


async def test_models_prefix_is_accepted(make_provider, standins):
    reply = await make_provider("gemini").complete(call(model="models/gemini-test"))

    assert reply.model == "gemini-test"
    assert standin_requests(standins["gemini"])[-1]["path"] == "/v1beta/models/gemini-test:generateContent"


def _mock(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def _complete(handler, *, stream=False, key="AIza-test-key"):
    async with _mock(handler) as client:
        provider = build_provider("gemini", base_url="http://gemini.test", api_key=key, stream=stream, client=client)
        return await provider.complete(call())


async def test_retry_delay_from_retry_info_when_no_header():
    def handler(request):
        error = {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12.5s"}],
        }
        return httpx.Response(429, json={"error": error})

    with pytest.raises(ProviderError) as info:
        await _complete(handler)

    assert info.value.retryable is True
    assert info.value.retry_after_s == 12.5


async def test_key_is_sent_only_as_header():
    seen = {}

    def handler(request):
        seen["request"] = request
        candidate = {"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}
        return httpx.Response(200, json={"candidates": [candidate]})

    await _complete(handler, key="AIza-secret")

    assert "AIza-secret" not in str(seen["request"].url)
    assert seen["request"].headers["x-goog-api-key"] == "AIza-secret"


async def test_blocked_prompt_is_final():
    def handler(request):
        return httpx.Response(200, json={"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {}})

    with pytest.raises(ProviderError) as info:
        await _complete(handler)

    assert info.value.retryable is False
    assert "SAFETY" in info.value.reason


async def test_thought_parts_are_dropped_and_thinking_tokens_billed_as_output():
    def handler(request):
        parts = [{"text": "pondering", "thought": True}, {"text": "answer"}]
        usage = {"promptTokenCount": 4, "candidatesTokenCount": 1, "thoughtsTokenCount": 9}
        body = {"candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP"}],
                "usageMetadata": usage, "modelVersion": "gemini-2.5-flash-001"}  # fmt: skip
        return httpx.Response(200, json=body)

    reply = await _complete(handler)

    assert (reply.text, reply.input_tokens, reply.output_tokens) == ("answer", 4, 10)
    assert reply.model == "gemini-2.5-flash-001"


async def test_stream_without_finish_reason_is_retryable():
    def handler(request):
        body = b'data: {"candidates":[{"content":{"parts":[{"text":"par"}],"role":"model"}}]}\r\n\r\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(ProviderError) as info:
        await _complete(handler, stream=True)

    assert info.value.retryable is True


async def test_standin_rejects_unknown_fields_and_bad_roles(standins, api_key):
    url = f"{standins['gemini']}/v1beta/models/g:generateContent"
    headers = {"x-goog-api-key": api_key}
    async with httpx.AsyncClient() as client:
        unknown = await client.post(url, headers=headers, json={"contents": [], "system": "x"})
        bad_role = await client.post(
            url, headers=headers, json={"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}
        )
        array = await client.post(
            url.replace(":generateContent", ":streamGenerateContent"),
            headers=headers,
            json={"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
        )

    assert unknown.status_code == 400
    assert unknown.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert 'Unknown name "system"' in unknown.json()["error"]["message"]
    assert bad_role.json()["error"]["message"] == "Please use a valid role: user, model."
    # Without alt=sse the stream method answers one JSON array.
    chunks = array.json()
    assert isinstance(chunks, list) and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
