"""Behaviour every adapter shares, checked against its stand-in over real HTTP."""

from __future__ import annotations

import socket

import pytest

from baton_executor.providers import ProviderCall, ProviderError, ProviderReply
from baton_tools.standins import configure_standin, standin_stats

KINDS = ("openai", "anthropic", "gemini")
STOP = {"openai": "stop", "anthropic": "end_turn", "gemini": "STOP"}
TRUNCATED = {"openai": "length", "anthropic": "max_tokens", "gemini": "MAX_TOKENS"}
OVERLOAD_STATUS = {"openai": 500, "anthropic": 529, "gemini": 503}
ASSISTANT_ROLE = {"openai": "assistant", "anthropic": "assistant", "gemini": "model"}

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And times three?"},
]

both_modes = pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
all_kinds = pytest.mark.parametrize("kind", KINDS)


def call(**overrides) -> ProviderCall:
    values = {"model": "model-a", "messages": CONVERSATION, "timeout_s": 5.0}
    values.update(overrides)
    return ProviderCall(**values)


async def fail(provider, provider_call: ProviderCall) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await provider.complete(provider_call)
    return info.value


@all_kinds
async def test_a_call_with_a_delta_callback_streams_and_hands_over_every_piece(make_provider, standins, kind):
    pieces: list[str] = []
    # The adapter is built for plain calls: the callback alone makes this call stream.
    reply = await make_provider(kind, stream=False).complete(call(on_delta=pieces.append))
    assert len(pieces) > 1 and "".join(pieces) == reply.text
    assert standin_stats(standins[kind])["streamed"] == 1


@all_kinds
@both_modes
async def test_reply_reveals_context_and_maps_usage(make_provider, kind, stream):
    reply = await make_provider(kind, stream=stream).complete(call())

    assistant = ASSISTANT_ROLE[kind]
    expected = (
        "[model-a] saw: system: You are terse. | user: What is two plus two? | "
        f"{assistant}: Four. | user: And times three?"
    )
    assert isinstance(reply, ProviderReply)
    assert reply.text == expected
    assert reply.model == "model-a"
    assert reply.finish_reason == STOP[kind]
    assert reply.input_tokens == sum(len(m["content"].split()) for m in CONVERSATION)
    assert reply.output_tokens == len(expected.split())


@all_kinds
@both_modes
async def test_max_tokens_is_sent_and_honoured(make_provider, kind, stream):
    reply = await make_provider(kind, stream=stream).complete(call(max_tokens=3, temperature=0.5))

    assert reply.text == "[model-a] saw: system:"
    assert reply.output_tokens == 3
    assert reply.finish_reason == TRUNCATED[kind]


@all_kinds
@both_modes
async def test_rate_limit_429_is_retryable_with_retry_after(make_provider, standins, kind, stream, assert_no_secret):
    configure_standin(standins[kind], rpm=1, window_s=30)
    provider = make_provider(kind, stream=stream)
    await provider.complete(call())

    error = await fail(provider, call())

    assert error.retryable is True
    assert error.status == 429
    assert error.retry_after_s is not None and 25 <= error.retry_after_s <= 30
    assert "rate limited" in error.reason
    assert_no_secret(error)
    assert standin_stats(standins[kind])["rate_limited"] == 1


@all_kinds
@both_modes
async def test_injected_overload_is_retryable_then_recovers(make_provider, standins, kind, stream):
    configure_standin(standins[kind], fail_first=1)
    provider = make_provider(kind, stream=stream)

    error = await fail(provider, call())
    assert error.retryable is True
    assert error.status == OVERLOAD_STATUS[kind]

    reply = await provider.complete(call())
    assert reply.text.startswith("[model-a] saw:")


@all_kinds
@pytest.mark.parametrize("status", [500, 503, 529])
async def test_every_server_error_status_is_retryable(make_provider, standins, kind, status):
    configure_standin(standins[kind], fail_first=1, fail_status=status)

    error = await fail(make_provider(kind), call())

    assert error.retryable is True
    assert error.status == status


@all_kinds
async def test_failure_after_stream_started_is_retryable(make_provider, standins, kind):
    configure_standin(standins[kind], fail_first=1, fail_mid_stream=True)

    error = await fail(make_provider(kind, stream=True), call())

    assert error.retryable is True
    assert error.status is None
    assert "in stream" in error.reason
    assert standin_stats(standins[kind])["injected_failures"] == 1


@all_kinds
@both_modes
async def test_wrong_key_is_final_and_not_leaked(make_provider, kind, stream, assert_no_secret):
    wrong_key = "sk-wrong-0000-SECRET-9999zzzz"
    error = await fail(make_provider(kind, stream=stream, api_key=wrong_key), call())

    assert error.retryable is False
    assert error.status == (400 if kind == "gemini" else 401)  # Gemini reports a bad key as INVALID_ARGUMENT
    assert "API key rejected" in error.reason
    assert_no_secret(error, wrong_key)


@all_kinds
async def test_missing_key_is_final(make_provider, kind):
    error = await fail(make_provider(kind, api_key=None), call())

    assert error.retryable is False
    assert error.status == (403 if kind == "gemini" else 401)


@all_kinds
@both_modes
async def test_context_too_long_is_final_with_clear_reason(make_provider, standins, kind, stream):
    configure_standin(standins[kind], context_window=10)

    error = await fail(make_provider(kind, stream=stream), call())

    assert error.retryable is False
    assert error.status == 400
    assert "exceeds the model's context window" in error.reason


@all_kinds
async def test_invalid_request_is_final_with_provider_message(make_provider, kind):
    # 5 is out of range for every API (Anthropic allows 0..1, the others 0..2).
    error = await fail(make_provider(kind), call(temperature=5.0))

    assert error.retryable is False
    assert error.status == 400
    assert "bad request (HTTP 400)" in error.reason
    assert "temperature" in error.reason


@all_kinds
async def test_unknown_model_is_final(make_provider, standins, kind):
    configure_standin(standins[kind], models=["model-a"])

    error = await fail(make_provider(kind), call(model="model-b"))

    assert error.retryable is False
    assert error.status == 404
    assert "model-b" in error.reason


@all_kinds
@both_modes
async def test_timeout_is_retryable(make_provider, standins, kind, stream, assert_no_secret):
    configure_standin(standins[kind], latency_ms=400)

    error = await fail(make_provider(kind, stream=stream), call(timeout_s=0.1))

    assert error.retryable is True
    assert error.status is None
    assert "0.1s" in error.reason
    assert_no_secret(error)


@all_kinds
async def test_slow_stream_hits_the_overall_deadline(make_provider, standins, kind):
    # Each chunk arrives well within the read timeout; only the total deadline catches this.
    configure_standin(standins[kind], chunk_delay_ms=60)

    error = await fail(make_provider(kind, stream=True), call(timeout_s=0.3))

    assert error.retryable is True
    assert "no complete reply within 0.3s" in error.reason


@all_kinds
async def test_connection_refused_is_retryable(make_provider, kind, assert_no_secret):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call: nothing listens there
    base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")

    error = await fail(make_provider(kind, base_url=base), call())

    assert error.retryable is True
    assert error.status is None
    assert "connection failed" in error.reason
    assert_no_secret(error)


@all_kinds
async def test_unsupported_role_is_rejected_before_sending(make_provider, standins, kind):
    error = await fail(make_provider(kind), call(messages=[{"role": "function", "content": "x"}]))

    assert error.retryable is False
    assert standin_stats(standins[kind])["requests"] == 0
