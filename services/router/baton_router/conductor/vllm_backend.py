"""The conductor run in process by vLLM's async engine (the router's GPU image, or vLLM's CPU build).

Every `propose` is one `engine.generate` call: vLLM batches concurrent requests continuously, so
nothing is gathered here. Decoding is constrained with `StructuredOutputsParams` (the bounded plan
JSON schema, or the EBNF grammar that also enforces equal lengths and earlier-only access), and the
sampled tokens' log-probs come back with the output: vLLM's default `raw_logprobs`, computed after
the structured-output mask and before temperature (see `llm`). At temperature 1 (top-p 1, no
top-k) they are the sampling distribution's, so the propensity's log is their sum; at other
temperatures it is unknown, except log 1 = 0 under greedy decoding.

The structured-output backend is an engine setting, not a request's: vLLM 0.32 reads
`disable_any_whitespace` only from the engine's `structured_outputs_config`, and its two backends
fail in different places (xgrammar lets raw control characters into JSON strings, so schema-bound
plans often do not parse; guidance refuses some EBNF the plan grammar uses). Hence guidance for the
JSON schema and xgrammar for the grammar, unless configured.

Policy versions are LoRA adapters: `request.policy` names one (`v3`, or `baton@v3` as a client asks
for a policy's version); an unknown or default policy gets `default_adapter`, or the base model when
none is set. Adapters are added and the default switched at run time with `serve_policy` when the
trainer publishes a version on baton.policy (or rolls back to an older one); an adapter the engine
does not take leaves the version being served as it was.

Loading the engine takes seconds to minutes (importing vLLM alone takes seconds), all of it
synchronous: `start` runs it in a thread, so the router's event loop (Kafka heartbeats, liveness)
never waits on it. vLLM is imported only then: it pins its own torch and transformers, so this module
must import without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import logging
import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from baton.v1 import requests_pb2
from baton_conductor import plan_grammar, plan_json_schema
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_router.conductor.base import Proposal
from baton_router.conductor.llm import ConductorUnavailable, PlanPrompter, log_propensity

log = logging.getLogger(__name__)


POLICY_SEPARATOR = "@"  # `baton@v3`: version v3 of the policy named baton


def default_model() -> Path:
    """SmolLM2-135M-Instruct where tools/vllm/setup.sh converts it, so that `vllm: {}` runs as is."""
    cache = os.environ.get("BATON_MODEL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "baton" / "models"
    return Path(cache) / "smollm2-135m-instruct"


def vllm_api() -> SimpleNamespace:
    """The parts of vLLM the backend uses, imported on first use with a clear error when missing."""
    try:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        raise ConductorUnavailable(
            "conductor.backend 'vllm' needs the `vllm` package, which is not installed here "
            f"({e}). It ships in the router's GPU image (baton-router[vllm]); locally, `baton up` and the tests "
            "run the router from the environment tools/vllm/setup.sh builds (vLLM's CPU build)."
        ) from e
    return SimpleNamespace(AsyncEngineArgs=AsyncEngineArgs, SamplingParams=SamplingParams, LoRARequest=LoRARequest,
                           RequestOutputKind=RequestOutputKind, StructuredOutputsParams=StructuredOutputsParams,
                           AsyncLLM=AsyncLLM, on_cpu=current_platform.is_cpu())


def adapter_name(policy: str) -> str:
    """The adapter a request's policy names: `baton@v3` and `v3` both name v3."""
    return policy.rpartition(POLICY_SEPARATOR)[2]


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as vLLM knows it: a name, an integer id unique per loaded weights, and a path."""

    name: str
    int_id: int
    path: str


class AdapterRejected(RuntimeError):
    """The engine did not take a LoRA adapter; the version served before stays."""


class VllmConductor:
    name = "vllm"
    policy_kind = "lora"  # the PolicyUpdate kind this backend serves

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig], *, engine: Any = None,
                 api: SimpleNamespace | None = None) -> None:
        settings = conductor.vllm
        if settings is None:
            raise ValueError("conductor.vllm settings are missing")
        self.settings = settings
        self.prompter = PlanPrompter(conductor, workers)
        # One constraint for user requests and one (admitting the empty plan) for inner calls; grammars
        # are bounded by the token limit, so that no plan can be cut off mid-way.
        bounds = (self.prompter.bounds, self.prompter.inner_bounds)
        self._schemas = {b: plan_json_schema(b) for b in bounds}
        self._grammars = {b: plan_grammar(dataclasses.replace(b, token_budget=settings.max_tokens)) for b in bounds}
        self._engine = engine
        self._api = api
        self._tokenizer = None
        self._ids = itertools.count(1)  # vLLM's LoRA ids must be positive
        self._adapters: dict[str, Adapter] = {}
        for name, path in settings.adapters.items():
            self._adapters[name] = Adapter(name, next(self._ids), str(path))
        self._default: str | None = settings.default_adapter
        self._starting: asyncio.Task | None = None
        self._started = False
        self.model = settings.model or str(default_model())
        self.base_version = Path(self.model).name or self.model

    # -- policy versions -------------------------------------------------------------------------

    @property
    def adapters(self) -> dict[str, Adapter]:
        return dict(self._adapters)

    @property
    def default_adapter(self) -> str | None:
        return self._default

    def adapter_for(self, policy: str) -> Adapter | None:
        """The adapter a request's policy selects: its own, else the default, else None (the base model)."""
        name = adapter_name(policy)
        if name in self._adapters:
            return self._adapters[name]
        if self._default is not None:
            return self._adapters[self._default]
        return None

    async def load_adapter(self, name: str, path: str | Path) -> Adapter:
        """Register (or replace) the adapter `name`. A replaced adapter gets a new id, because vLLM caches
        weights by id; requests already running keep the old weights. AdapterRejected (or the engine's
        own error) when the engine does not take it; then nothing changes."""
        adapter = Adapter(name, next(self._ids), str(path))
        old = self._adapters.get(name)
        if self._started:
            # Loading first surfaces a bad adapter here, not in the next request that picks it.
            await self._add(adapter)
        self._adapters[name] = adapter
        if old is not None and self._started:
            await self._engine.remove_lora(old.int_id)
        log.info("conductor adapter %s loaded from %s (id %d)", name, path, adapter.int_id)
        return adapter

    async def _add(self, adapter: Adapter) -> None:
        try:
            loaded = await self._engine.add_lora(self._lora_request(adapter))
        except Exception as e:  # noqa: BLE001 - the engine's reason, said of the version it refused
            raise AdapterRejected(f"vLLM refused the LoRA adapter {adapter.name} from {adapter.path}: {e}") from e
        if not loaded:
            raise AdapterRejected(f"vLLM did not load the LoRA adapter {adapter.name} from {adapter.path}")

    async def serve_policy(self, uri: str, version: str) -> None:
        """Serve a version published on baton.policy to every request that names no other: load its adapter
        (once; a rollback names one already loaded) and make it the default."""
        await self.start()
        known = self._adapters.get(version)
        if known is None or known.path != str(local_path(uri)):
            await self.load_adapter(version, local_path(uri))
        self.set_default(version)
        log.info("conductor serves policy version %s", version)

    def set_default(self, name: str | None) -> None:
        """Serve `name` to requests that name no known policy; None serves the base model."""
        if name is not None and name not in self._adapters:
            raise KeyError(f"no adapter named {name!r}; loaded: {sorted(self._adapters)}")
        self._default = name

    def _lora_request(self, adapter: Adapter | None):
        if adapter is None:
            return None
        return self.api.LoRARequest(adapter.name, adapter.int_id, adapter.path)

    # -- engine ----------------------------------------------------------------------------------

    @property
    def api(self) -> SimpleNamespace:
        if self._api is None:
            self._api = vllm_api()
        return self._api

    @property
    def ready(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Start the engine (loads the model and captures CUDA graphs; minutes) and preload the adapters."""
        if self._started:
            return
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        except BaseException:
            self._starting = None
            raise

    async def _start(self) -> None:
        if self._engine is None:
            started = asyncio.get_running_loop().time()
            self._engine = await asyncio.to_thread(self._build_engine)
            log.info("vLLM engine for %s loaded in %.1f s", self.model, asyncio.get_running_loop().time() - started)
        tokenizer = self._engine.get_tokenizer()
        self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        for adapter in self._adapters.values():
            await self._add(adapter)
        self._started = True

    def engine_args(self) -> dict[str, Any]:
        s, api = self.settings, self.api
        eager = api.on_cpu if s.enforce_eager is None else s.enforce_eager
        structured = s.structured_outputs_backend or ("guidance" if s.constraint == "json_schema" else "xgrammar")
        args = {"model": self.model, "enable_lora": s.enable_lora, "gpu_memory_utilization": s.gpu_memory_utilization,
                "max_model_len": s.max_model_len, "dtype": s.dtype, "enforce_eager": eager,
                "structured_outputs_config": {"backend": structured, "disable_any_whitespace": True}}
        if s.enable_lora:
            args.update(max_loras=s.max_loras, max_lora_rank=s.max_lora_rank)
        if s.seed is not None:  # unset keeps vLLM's own default
            args["seed"] = s.seed
        return args

    def _build_engine(self):
        """Runs in a worker thread: the import and the engine's start are synchronous."""
        api = self.api
        return api.AsyncLLM.from_engine_args(api.AsyncEngineArgs(**self.engine_args()))

    def sampling_params(self, request: requests_pb2.ChatRequest | None = None):
        s, api = self.settings, self.api
        bounds = self.prompter.bounds if request is None else self.prompter.bounds_for(request)
        if s.constraint == "grammar":
            structured = api.StructuredOutputsParams(grammar=self._grammars[bounds])
        else:
            # Whitespace is off engine-wide (see engine_args): free whitespace lets a model pad the JSON until
            # max_tokens.
            structured = api.StructuredOutputsParams(json=self._schemas[bounds])
        return api.SamplingParams(
            # top-p and top-k stated, so that a model's generation_config cannot narrow sampling unseen
            # (the propensity at temperature 1 assumes the full masked distribution).
            temperature=s.temperature, top_p=1.0, top_k=0, max_tokens=s.max_tokens, structured_outputs=structured,
            logprobs=0,  # the sampled token's own log-prob only
            output_kind=api.RequestOutputKind.FINAL_ONLY,
        )

    def prompt_ids(self, request: requests_pb2.ChatRequest) -> list[int]:
        assert self._tokenizer is not None, "the engine is not started"
        ids = self._tokenizer.apply_chat_template(self.prompter.messages(request), tokenize=True,
                                                  add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding under Transformers 5
            ids = ids["input_ids"]
        return list(ids)

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        await self.start()
        adapter = self.adapter_for(request.policy)
        version = adapter.name if adapter is not None else self.base_version
        final = None
        async for output in self._engine.generate(
            {"prompt_token_ids": self.prompt_ids(request)},
            self.sampling_params(request),
            f"{request.request_id or 'plan'}-{uuid.uuid4().hex[:12]}",
            lora_request=self._lora_request(adapter),
        ):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for the plan")
        completion = final.outputs[0]
        logprobs = sampled_logprobs(completion)
        # Only at temperature 1 is the masked distribution the one the tokens were drawn from.
        drawn_from = math.fsum(logprobs) if self.settings.temperature == 1.0 and logprobs else None
        return self.prompter.proposal(completion.text, logprobs, log_propensity(drawn_from, self.settings.temperature),
                                      version, self.prompter.bounds_for(request))

    async def aclose(self) -> None:
        if self._starting is not None and not self._starting.done():
            # The engine thread cannot be interrupted; shut the engine down once it is up.
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._engine is not None and hasattr(self._engine, "shutdown"):
            self._engine.shutdown()
        self._started = False


def local_path(uri: str) -> Path:
    """A local directory holding the adapter at `uri` (the policy store: a path, file:// or an fsspec URL)."""
    from baton_policy import local_copy

    return local_copy(uri)


def sampled_logprobs(completion) -> list[float]:
    """The log-prob of each emitted token, from vLLM's per-position {token_id: Logprob} maps."""
    if completion.logprobs is None:
        return []
    values = []
    for token_id, position in zip(completion.token_ids, completion.logprobs):
        entry = position[token_id]
        values.append(float(getattr(entry, "logprob", entry)))
    return values

