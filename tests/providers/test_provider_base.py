from __future__ import annotations

import email.utils
import logging
import pickle

import httpx
import pytest

from baton_executor.providers import Provider, ProviderCall, ProviderError, build_provider
from baton_executor.providers.base import parse_go_duration, parse_retry_after, redact
from baton_platform.logs import configure_logging
from baton_tools.standins import run_standin


def test_retry_after_headers():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "garbage"}) is None
    assert parse_retry_after({}) is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=1_000_000) == 30.0


def test_go_durations():
    assert parse_go_duration("20ms") == 0.02
    assert parse_go_duration("6m0s") == 360.0
    assert parse_go_duration("1h2m3.5s") == 3723.5
    assert parse_go_duration("soon") is None


def test_redact_removes_key_and_masked_fragments():
    text = redact("bad key sk-abc123 and sk-ab****c123 here", "sk-abc123")
    assert "sk-abc123" not in text and "****" not in text
    assert text == "bad key [redacted] and [redacted] here"


def test_error_survives_pickling_and_reprs_cleanly():
    error = ProviderError("anthropic: overloaded", retryable=True, status=529, retry_after_s=2.0)
    clone = pickle.loads(pickle.dumps(error))

    assert (clone.reason, clone.retryable, clone.status) == ("anthropic: overloaded", True, 529)
    assert clone.retry_after_s == 2.0
    assert str(clone) == "anthropic: overloaded"
    assert repr(clone) == "ProviderError('anthropic: overloaded', retryable=True, status=529, retry_after_s=2.0)"


@pytest.mark.parametrize("kind", ["openai", "openai_compatible", "anthropic", "gemini"])
def test_provider_repr_hides_key(kind):
    provider = build_provider(kind, base_url="http://x.test", api_key="sk-very-secret", stream=True)
    assert isinstance(provider, Provider)
    assert "sk-very-secret" not in repr(provider)
    assert "sk-very-secret" not in str(provider)


async def test_owned_client_is_closed_and_borrowed_client_is_not():
    with run_standin("anthropic") as base_url:
        owned = build_provider("anthropic", base_url=base_url, api_key=None)
        reply = await owned.complete(ProviderCall(model="m", messages=[{"role": "user", "content": "x"}]))
        assert reply.text == "[m] saw: user: x"
        await owned.aclose()
        await owned.aclose()  # idempotent

        async with httpx.AsyncClient() as client:
            borrowed = build_provider("anthropic", base_url=base_url, api_key=None, client=client)
            await borrowed.aclose()
            assert not client.is_closed


async def test_bad_base_url_is_final():
    provider = build_provider("openai_compatible", base_url="vllm:8000/v1", api_key=None)
    try:
        with pytest.raises(ProviderError) as info:
            await provider.complete(ProviderCall(model="m", messages=[{"role": "user", "content": "x"}]))
    finally:
        await provider.aclose()

    assert info.value.retryable is False
    assert "base_url" in info.value.reason


@pytest.mark.parametrize("kind", ["openai_compatible", "gemini"])
async def test_calls_reuse_their_parsed_url_and_log_no_line_per_request(kind, caplog):
    """The executor's client parses each URL once, and no line is logged per request through it or
    through an httpx client (httpx logs every request with its URL at INFO: the services' logging
    keeps it at WARNING)."""
    configure_logging("test")
    try:
        with caplog.at_level(logging.INFO), run_standin("openai" if kind == "openai_compatible" else kind) as base_url:
            async with httpx.AsyncClient() as given:
                owned = build_provider(kind, base_url=base_url, api_key="sk-secret-1")
                borrowed = build_provider(kind, base_url=base_url, api_key="sk-secret-1", client=given)
                try:
                    for provider in (owned, borrowed):
                        for model in ("m1", "m1", "m2"):
                            call = ProviderCall(model=model, messages=[{"role": "user", "content": "x"}])
                            assert model in (await provider.complete(call)).text
                    # One parsed URL per distinct URL: the same for every model on an OpenAI-compatible
                    # server, one per model on Gemini's.
                    assert len(owned.client._urls) == (1 if kind == "openai_compatible" else 2)
                finally:
                    await owned.aclose()
                    await borrowed.aclose()
        assert not [r for r in caplog.records if r.name.startswith(("httpx", "aiohttp"))]
    finally:
        logging.getLogger("httpx").setLevel(logging.NOTSET)
        for handler in [h for h in logging.getLogger().handlers if getattr(h, "baton", False)]:
            logging.getLogger().removeHandler(handler)
