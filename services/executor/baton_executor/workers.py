"""One provider client per configured worker of this executor's provider."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from baton_platform.config import BatonConfig, WorkerConfig
from baton_executor.providers.base import Provider, build_provider
from baton_executor.sim import OutcomeMatrix, SimProvider


class MissingApiKey(ValueError):
    pass


def build_workers(config: BatonConfig, provider: str, client: httpx.AsyncClient) -> dict[str, Provider]:
    """Clients for every worker of `provider`. Matrices are loaded once per file."""
    matrices: dict[Path, OutcomeMatrix] = {}
    out: dict[str, Provider] = {}
    for w in config.workers:
        if w.provider != provider:
            continue
        if w.provider == "sim":
            matrix = matrices.get(w.sim.dataset) or matrices.setdefault(w.sim.dataset, OutcomeMatrix(w.sim.dataset))
            out[w.name] = SimProvider(matrix, w.sim.column or w.model, w.sim.latency_ms)
        else:
            out[w.name] = build_provider(w.provider, base_url=w.base_url, api_key=_api_key(w), client=client)
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
