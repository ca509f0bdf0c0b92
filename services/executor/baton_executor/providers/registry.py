"""The provider registry: which adapter answers for each provider the configuration names.

One entry per name of `baton_platform.config.PROVIDERS` (a test checks they agree): the HTTP APIs,
each built by `build_provider`, and `sim`, which answers from a recorded outcome matrix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import httpx

from baton_executor.providers.anthropic import AnthropicProvider
from baton_executor.providers.base import Provider
from baton_executor.providers.gemini import GeminiProvider
from baton_executor.providers.openai import OpenAIProvider
from baton_executor.providers.sim import OutcomeMatrix, SimProvider
from baton_executor.transport import Client
from baton_platform.config import WorkerConfig

# The providers that speak an HTTP API (every configured provider but `sim`), and their adapters.
HTTP_ADAPTERS: dict[str, Callable[..., Provider]] = {
    "openai": partial(OpenAIProvider, compatible=False),
    "openai_compatible": partial(OpenAIProvider, compatible=True),
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
}
PROVIDER_KINDS = tuple(HTTP_ADAPTERS)


def build_provider(
    kind: str,
    *,
    base_url: str | None,
    api_key: str | None,
    stream: bool = False,
    client: Client | httpx.AsyncClient | None = None,
    max_output_tokens_default: int | None = 1024,
) -> Provider:
    """Create the adapter for ``kind``.

    ``client`` (the executor's `ProviderClient`, or any httpx client) is
    borrowed, never closed by the adapter; without one the adapter owns a
    private `ProviderClient` that ``aclose`` releases.
    ``max_output_tokens_default`` applies when a call has no ``max_tokens``;
    ``None`` leaves the provider's own default where the API allows that
    (Anthropic requires the field, so it falls back to 1024 there).
    """
    adapter = HTTP_ADAPTERS.get(kind)
    if adapter is None:
        raise ValueError(f"unknown provider kind {kind!r}; expected one of {', '.join(PROVIDER_KINDS)}")
    if kind == "openai_compatible" and not base_url:
        raise ValueError("provider kind 'openai_compatible' needs a base_url (e.g. http://vllm:8000/v1)")
    return adapter(base_url=base_url, api_key=api_key, stream=stream, client=client,
                   max_output_tokens_default=max_output_tokens_default)


class MissingApiKey(ValueError):
    pass


def _http(worker: WorkerConfig, client: Client | None, matrices: dict[Path, OutcomeMatrix]) -> Provider:
    return build_provider(worker.provider, base_url=worker.base_url, api_key=_api_key(worker), client=client)


def _sim(worker: WorkerConfig, client: Client | None, matrices: dict[Path, OutcomeMatrix]) -> Provider:
    # Workers of one matrix file share it: it is loaded once.
    dataset = worker.sim.dataset
    matrix = matrices.get(dataset) or matrices.setdefault(dataset, OutcomeMatrix(dataset))
    return SimProvider(matrix, worker.sim.column or worker.model, worker.sim.latency_ms)


REGISTRY: dict[str, Callable[[WorkerConfig, Client | None, dict[Path, OutcomeMatrix]], Provider]] = {
    **{kind: _http for kind in PROVIDER_KINDS},
    "sim": _sim,
}


def build_workers(workers: Sequence[WorkerConfig], provider: str, client: Client | None) -> dict[str, Provider]:
    """Clients for every worker of `provider`."""
    matrices: dict[Path, OutcomeMatrix] = {}
    out = {w.name: REGISTRY[w.provider](w, client, matrices) for w in workers if w.provider == provider}
    if not out:
        raise ValueError(f"no configured worker uses provider {provider!r}")
    return out


def _api_key(worker: WorkerConfig) -> str | None:
    if worker.api_key_env is None:
        if worker.provider == "openai_compatible":
            return None
        raise MissingApiKey(f"worker {worker.name!r}: set api_key_env to the variable holding its API key")
    key = os.environ.get(worker.api_key_env)
    if not key:
        # Names the variable, never a value.
        raise MissingApiKey(f"worker {worker.name!r}: environment variable {worker.api_key_env} is not set")
    return key
