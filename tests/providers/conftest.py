from __future__ import annotations

import contextlib
import traceback

import httpx
import pytest

from baton_executor.providers import ProviderError, build_provider
from baton_executor.transport import ProviderClient
from baton_tools.standins import reset_standin, run_standin

# Shaped like a real key so that any masking or echoing by a provider would show up.
API_KEY = "sk-test-9f8e7d6c5b4a-SECRET-0123456789abcdef"
KINDS = ("openai", "anthropic", "gemini")


@pytest.fixture(scope="session")
def _standins():
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(run_standin(kind, require_key=API_KEY)) for kind in KINDS}


@pytest.fixture
def standins(_standins):
    """Base URLs of the three stand-ins, each reset to its startup config before the test."""
    for url in _standins.values():
        reset_standin(url)
    return _standins


@pytest.fixture(params=["executor-client", "httpx-client"])
async def make_provider(standins, request):
    """Build adapters pointed at the stand-ins; closed after the test. Each test runs through the
    executor's client (straight on aiohttp's pool) and through an httpx client, which an adapter
    may be given instead: the adapters behave alike on both."""
    built = []
    # A borrowed client per test: building one with CA verification costs ~30 ms,
    # and the stand-ins are plain HTTP anyway. test_provider_base covers owned clients.
    client = (ProviderClient(verify=False, trust_env=False) if request.param == "executor-client"
              else httpx.AsyncClient(verify=False, trust_env=False))

    def make(kind, *, stream=False, api_key=API_KEY, base_url=None, **kwargs):
        standin_kind = "openai" if kind == "openai_compatible" else kind
        kwargs.setdefault("client", client)
        provider = build_provider(
            kind,
            base_url=base_url or standins[standin_kind],
            api_key=api_key,
            stream=stream,
            **kwargs,
        )
        built.append(provider)
        return provider

    yield make
    for provider in built:
        await provider.aclose()
    await client.aclose()


@pytest.fixture
def api_key() -> str:
    return API_KEY


@pytest.fixture
def assert_no_secret():
    """Checks that an error, rendered every usual way, does not leak the key."""
    return _assert_no_secret


def _assert_no_secret(error: BaseException, secret: str = API_KEY) -> None:
    rendered = [str(error), repr(error), "".join(traceback.format_exception(error))]
    if isinstance(error, ProviderError):
        rendered.append(error.reason)
    for text in rendered:
        assert secret not in text
        # Providers echo rejected keys partly starred out; no fragment may survive either.
        assert "****" not in text
        assert secret[-8:] not in text
