"""A check of the 'vllm' conductor on a GPU machine, with nothing downloaded (`make gpu-check`).

Two parts, one JSON document:

- load: the conductor backend on the largest causal LM available offline (the Hugging Face cache,
  then Baton's model cache, where tools/vllm/setup.sh converts SmolLM2-135M), planning real
  questions at concurrency 1, 8 and 64 under the plan grammar: plan latency p50/p99 per level,
  output tokens/s, the parse rate and the share of plans passing the router's validation.
- plumbing (`--plumbing`): a tiny randomly initialised Qwen2 model with its own small byte-level BPE
  tokenizer (trained here on the conductor's prompt text) and two LoRA adapters with random weights;
  it plans concurrent queries, switches the default adapter at run time and plans again. A random
  model writes nonsense, so what this checks is that structured outputs bound every plan, log-probs
  come back, and adapters are picked per policy and switched live.

    python -m baton_eval.gpu_check [--model DIR] [--concurrency 1,8,64] [--requests 64] \
        [--plumbing] [--out result.json]

It runs on vLLM's CPU build too (slowly): the same code path, the CPU's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from baton.v1 import common_pb2, requests_pb2
from baton_conductor.prompt import EXAMPLE, SYSTEM
from baton_platform.config import BatonConfig
from baton_workflow import plan_problems

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTIONS = [
    "What is the derivative of x^3 * sin(x)?",
    "Which amendment to the US constitution abolished slavery?",
    "A train travels 300 km in 2.5 hours. What is its average speed?",
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that reverses a linked list.",
    "What is the pKa of acetic acid, roughly?",
    "Who wrote 'The Brothers Karamazov'?",
    "Solve for x: 3x + 7 = 22.",
]
WORKERS = [
    {"name": "strong", "card": "Strongest on hard reasoning; slowest and most expensive."},
    {"name": "fast", "card": "Fast and cheap; good general knowledge."},
    {"name": "coder", "card": "Best at writing and fixing code."},
]


def build_tokenizer(directory: Path):
    """A byte-level BPE tokenizer trained on the conductor's own prompt text: any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [SYSTEM, EXAMPLE, *QUESTIONS, *(w["card"] for w in WORKERS),
              '{"model_id": [0, 1, 2], "subtasks": ["Solve.", "Check."], "access_list": [[], [0], "all"]}'] * 20
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def build_model(directory: Path, tokenizer) -> dict:
    """A 2-layer Qwen2 with random weights; head size 64 so every attention backend takes it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    vocab = math.ceil(len(tokenizer) / 64) * 64
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=eos, bos_token_id=None,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id).save_pretrained(directory)
    return {"hidden": config.hidden_size, "kv": config.num_key_value_heads * (config.hidden_size // 4),
            "layers": config.num_hidden_layers}


def build_adapter(directory: Path, base: Path, shape: dict, seed: int, rank: int = 8, scale: float = 0.05) -> None:
    """A PEFT-format LoRA adapter on q/k/v/o with random A and B (B times `scale`): it changes the
    model's output, except at scale 0, where it reproduces the base model."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    outs = {"q_proj": shape["hidden"], "k_proj": shape["kv"], "v_proj": shape["kv"], "o_proj": shape["hidden"]}
    tensors = {}
    for layer in range(shape["layers"]):
        for module, out in outs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, shape["hidden"], generator=generator) * 0.05
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * scale
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": list(outs), "bias": "none",
        "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }))


def model_shape(model_dir: Path) -> dict:
    """What `build_adapter` needs to know of a Llama- or Qwen2-style model, from its config.json."""
    config = json.loads((model_dir / "config.json").read_text())
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {"hidden": config["hidden_size"], "kv": config["num_key_value_heads"] * head,
            "layers": config["num_hidden_layers"]}


def build(workdir: Path) -> tuple[Path, dict[str, Path]]:
    base = workdir / "tiny-qwen2"
    base.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(base)
    shape = build_model(base, tokenizer)
    adapters = {}
    for seed, name in enumerate(("policy-a", "policy-b"), start=1):
        adapters[name] = workdir / name
        build_adapter(adapters[name], base, shape, seed)
    return base, adapters


async def run_once(conductor, workers: list[str], max_steps: int, n: int, policy: str) -> dict:
    def ask(i: int) -> requests_pb2.ChatRequest:
        return requests_pb2.ChatRequest(request_id=f"gpu-{policy}-{i}", policy=policy, messages=[
            common_pb2.ChatMessage(role="user", content=QUESTIONS[i % len(QUESTIONS)])])

    started = time.perf_counter()
    results = await asyncio.gather(*(conductor.propose(ask(i)) for i in range(n)), return_exceptions=True)
    seconds = time.perf_counter() - started
    parsed = [r for r in results if not isinstance(r, BaseException)]
    # Valid as the router judges a user request: the pool, plus the conductor itself when recursion is on.
    valid = [p for p in parsed if not plan_problems(p.plan, conductor.prompter.worker_names, max_steps)]
    return {
        "policy": policy, "plans": n, "seconds": round(seconds, 2), "plans_per_s": round(n / seconds, 1),
        "parse_rate": round(len(parsed) / n, 3), "valid_share": round(len(valid) / n, 3),
        "versions": sorted({p.policy_version for p in parsed}),
        "with_logprobs": sum(1 for p in parsed if p.token_logprobs and all(lp <= 0 for lp in p.token_logprobs)),
        "errors": sorted({f"{type(r).__name__}: {str(r)[:160]}" for r in results if isinstance(r, BaseException)})[:5],
        "sample": parsed[0].plan.model_dump() if parsed else None,
    }


async def plumbing(workdir: Path, requests: int) -> dict:
    from baton_router.conductor.vllm_backend import VllmConductor

    t = time.perf_counter()
    base, adapters = build(workdir)
    build_s = time.perf_counter() - t
    config = BatonConfig(
        workers=[{"name": w["name"], "provider": "sim", "model": w["name"], "card": w["card"],
                  "sim": {"dataset": str(workdir / "unused.csv")}} for w in WORKERS],
        # Short instructions keep the longest possible plan (4 steps) well inside max_tokens.
        conductor={"backend": "vllm", "max_steps": 4, "max_subtask_chars": 60, "vllm": {
            "model": str(base), "adapters": {"policy-a": str(adapters["policy-a"])}, "default_adapter": "policy-a",
            "gpu_memory_utilization": 0.3, "max_model_len": 2048, "max_loras": 2, "max_lora_rank": 8,
            "max_tokens": 512, "temperature": 1.0, "seed": 0, "enforce_eager": True}},
    )
    workers = [w["name"] for w in WORKERS]
    conductor = VllmConductor(config.conductor, config.workers)
    t = time.perf_counter()
    await conductor.start()
    start_s = time.perf_counter() - t
    runs = [await run_once(conductor, workers, 4, requests, "baton")]
    await conductor.load_adapter("policy-b", adapters["policy-b"])
    conductor.set_default("policy-b")
    runs.append(await run_once(conductor, workers, 4, requests, "baton"))
    runs.append(await run_once(conductor, workers, 4, requests // 4, "policy-a"))
    conductor.set_default(None)
    runs.append(await run_once(conductor, workers, 4, requests // 4, "baton"))
    await conductor.aclose()
    return {"build_s": round(build_s, 1), "engine_start_s": round(start_s, 1), "runs": runs,
            "switched": [r["versions"] for r in runs]}


def offline_models() -> list[tuple[int, Path]]:
    """Causal LMs on this machine as (bytes of weights, folder), largest first: snapshots in the Hugging
    Face cache and folders in Baton's model cache."""
    from baton_router.conductor.vllm_backend import default_model

    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")
    candidates = [*hub.glob("models--*/snapshots/*"), *default_model().parent.glob("*")]
    found = []
    for folder in candidates:
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if not any(a.endswith("ForCausalLM") for a in config.get("architectures") or []):
            continue
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        if size:
            found.append((size, folder))
    return sorted(found, reverse=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def load(model: Path, levels: list[int], requests: int) -> dict:
    from baton_router.conductor.vllm_backend import VllmConductor

    config = BatonConfig(
        workers=[{"name": w["name"], "provider": "openai_compatible", "model": w["name"], "card": w["card"],
                  "base_url": "http://127.0.0.1:9/v1"} for w in WORKERS],
        conductor={"backend": "vllm", "max_steps": 4, "vllm": {
            "model": str(model), "constraint": "grammar", "temperature": 0.7, "max_model_len": 4096,
            "gpu_memory_utilization": 0.8, "max_tokens": 320}})
    conductor = VllmConductor(config.conductor, config.workers)
    t = time.perf_counter()
    await conductor.start()
    out: dict[str, Any] = {"model": str(model), "engine_start_s": round(time.perf_counter() - t, 1), "levels": []}
    workers = [w["name"] for w in WORKERS]
    for level in levels:
        gate = asyncio.Semaphore(level)
        latencies: list[float] = []

        async def one(i: int, gate: asyncio.Semaphore = gate, level: int = level, latencies: list[float] = latencies):
            async with gate:
                started = time.perf_counter()
                try:
                    return await conductor.propose(requests_pb2.ChatRequest(
                        request_id=f"load-{level}-{i}", messages=[
                            common_pb2.ChatMessage(role="user", content=QUESTIONS[i % len(QUESTIONS)])]))
                finally:
                    latencies.append(time.perf_counter() - started)

        n = max(requests, level)
        started = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        seconds = time.perf_counter() - started
        parsed = [r for r in results if not isinstance(r, BaseException)]
        valid = [p for p in parsed if not plan_problems(p.plan, workers, 4)]
        tokens = sum(len(p.token_logprobs) for p in parsed)
        out["levels"].append({
            "concurrency": level, "plans": n, "seconds": round(seconds, 2),
            "latency_p50_s": round(statistics.median(latencies), 3), "latency_p99_s": round(percentile(latencies, 0.99), 3),
            "tokens_per_s": round(tokens / seconds, 1), "parse_rate": round(len(parsed) / n, 3),
            "valid_share": round(len(valid) / n, 3),
            "errors": sorted({f"{type(r).__name__}: {str(r)[:160]}" for r in results if isinstance(r, BaseException)})[:5],
            "sample": parsed[0].plan.model_dump() if parsed else None})
    await conductor.aclose()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the largest offline)")
    parser.add_argument("--concurrency", default="1,8,64", help="concurrency levels, comma-separated")
    parser.add_argument("--requests", type=int, default=64, help="plans per level (at least the level)")
    parser.add_argument("--plumbing", action="store_true", help="also run the tiny-model LoRA plumbing check")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)
    models = offline_models()
    model = args.model or (models[0][1] if models else None)
    if model is None:
        raise SystemExit("gpu_check: no causal LM found offline (Hugging Face cache or Baton's model cache); "
                         "run tools/vllm/setup.sh or pass --model")
    levels = [int(x) for x in args.concurrency.split(",")]
    result = {"offline_models": [{"path": str(p), "gib": round(b / 2**30, 2)} for b, p in models],
              "load": asyncio.run(load(model, levels, args.requests))}
    if args.plumbing:
        with tempfile.TemporaryDirectory(prefix="baton-gpu-check-") as tmp:
            result["plumbing"] = asyncio.run(plumbing(args.workdir or Path(tmp), args.requests))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
