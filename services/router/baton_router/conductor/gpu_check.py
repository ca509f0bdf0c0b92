"""A check of the 'vllm' conductor on a GPU machine, with nothing downloaded.

It builds, in a scratch directory, a tiny randomly initialised Qwen2 model with its own small
byte-level BPE tokenizer (trained here on the conductor's prompt text) and two LoRA adapters with
random weights, starts the vllm backend on them, plans 64 concurrent queries, switches the default
adapter at run time and plans again, then repeats with the EBNF grammar constraint. It prints plans/s,
the parse rate and the share of plans passing validation for each run, as one JSON document.

A random model writes nonsense, so what this checks is the plumbing: the engine starts, structured
outputs bound every plan, log-probs come back, and LoRA adapters are picked per policy and switched
live. Parse rate is the meaningful number (the constraint must make every plan parse).

    python -m baton_router.conductor.gpu_check --requests 64 [--workdir DIR] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path

from baton.v1 import common_pb2, requests_pb2

from baton_platform.config import BatonConfig
from baton_conductor.prompt import EXAMPLE, SYSTEM
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


async def check(workdir: Path, requests: int) -> dict:
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
    conductor = VllmConductor(config)
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
    conductor.settings = conductor.settings.model_copy(update={"constraint": "grammar"})
    grammar_run = await run_once(conductor, workers, 4, requests, "baton")
    grammar_run["constraint"] = "grammar"
    runs.append(grammar_run)
    await conductor.aclose()
    return {"build_s": round(build_s, 1), "engine_start_s": round(start_s, 1), "runs": runs,
            "switched": [r["versions"] for r in runs]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="baton-gpu-check-") as tmp:
        result = asyncio.run(check(args.workdir or Path(tmp), args.requests))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
