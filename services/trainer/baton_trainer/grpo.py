"""GRPO fine-tuning of the LLM conductor with a LoRA adapter (TRL + PEFT), from logged outcomes.

For each training query the conductor samples `num_generations` plans; each plan is scored by the
logged outcome of the worker its last step names (`grpo_reward.PlanOutcomeReward`), so the group's
rewards differ exactly where the plans differ, and GRPO moves the policy toward the plans that did
better. No worker is called during training: the episode dataset or a replay matrix stands in for the
pool, which is what makes the training offline and free.

Plans are sampled under the router's own plan grammar by default (`constraint="grammar"`), as the
router decodes when it serves: every sample is a plan the router would run, so each group's spread is
in the workers and instructions chosen, and no step is spent on samples that ramble until the token
limit (a 135M model sampled unconstrained at temperature 1 wrote no valid plan in its first 16 samples,
at 225 s per step on this CPU). `constraint="none"` samples freely and lets the reward teach the format.

The Conductor paper's settings are the defaults where they carry over: no KL term (beta = 0), reward
0 / 0.5 / 1. Only the LoRA adapter is trained and saved; vLLM serves it next to the base model
(`conductor.vllm.adapters`).

    python -m baton_trainer grpo --episodes DATA_DIR --config baton.yaml --model BASE_MODEL_DIR \
        --out OUT_DIR [--matrix replay.csv] [--steps 200] [--num-generations 8] ...

torch, transformers, trl, peft and datasets come with the `grpo` extra and are imported only when
training starts, so the trainer's other commands do not need them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from baton_conductor import ADAPTER_MANIFEST

from .grpo_data import OutcomeTable, PromptSet, load_training_data
from .grpo_reward import UNKNOWN, PlanOutcomeReward

ADAPTER_DIR = "adapter"


def _load_model(model, tokenizer, use_cpu: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, (str, os.PathLike)):
        path = str(model)
        dtype = torch.float32 if use_cpu else "auto"
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    elif tokenizer is None:
        raise ValueError("a tokenizer is needed when the model is given as an object")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: the conductor's prompts are chat messages")
    return model, tokenizer


def _sample_under_the_grammar(model, tokenizer, bounds, max_new_tokens: int) -> None:
    """Make `model.generate` (which TRL calls for every group) decode under the router's plan grammar.

    xgrammar's processor keeps per-sequence matchers, so each call gets a fresh one. The log-probs GRPO
    optimises are the model's own (TRL recomputes them with a forward pass), so training raises the
    probability of the plans that scored well under the same constraint that serves them."""
    import xgrammar
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    from baton_conductor import plan_grammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
    budgeted = dataclasses.replace(bounds, token_budget=max_new_tokens)
    grammar = xgrammar.GrammarCompiler(info).compile_grammar(plan_grammar(budgeted))
    generate = model.generate

    def constrained(*args, **kwargs):
        kwargs["logits_processor"] = LogitsProcessorList([LogitsProcessor(grammar)])
        return generate(*args, **kwargs)

    model.generate = constrained


def _time_limit(deadline: float):
    """A TRL callback that stops training after the step that ends past `deadline` (time.monotonic)."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() >= deadline:
                control.should_training_stop = True
            return control

    return TimeLimit()


def _resumed(adapter_dir: str | Path, worker_names: list[str]) -> dict:
    """The manifest of an adapter to go on training; refused when its model numbers mean other workers."""
    try:
        manifest = json.loads((Path(adapter_dir) / ADAPTER_MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{adapter_dir} is not an adapter saved by this trainer: {exc}") from exc
    if manifest.get("worker_names") != list(worker_names):
        raise ValueError(f"{adapter_dir} was trained on the pool {manifest.get('worker_names')}, "
                         f"not {list(worker_names)}: its model numbers would mean other workers")
    return manifest


def train_grpo(
    model_path_or_model,
    tokenizer,
    dataset: PromptSet,
    outcomes: OutcomeTable,
    *,
    output_dir: str | Path,
    steps: int = 200,
    num_generations: int = 8,
    prompts_per_step: int = 1,
    learning_rate: float = 1e-5,
    lora_r: int = 16,
    lora_alpha: int | None = None,
    lora_dropout: float = 0.0,
    target_modules: str | Sequence[str] = "all-linear",
    max_completion_length: int = 320,
    temperature: float = 1.0,
    constraint: str = "grammar",
    cost_weight: float = 0.0,
    unknown_reward: float = UNKNOWN,
    seed: int = 0,
    time_limit_s: float | None = None,
    use_cpu: bool | None = None,
    logging_steps: int = 1,
    progress: bool = True,
    grpo_args: dict | None = None,
    resume: str | Path | None = None,
) -> Path:
    """Train a LoRA adapter on the conductor with GRPO; return the adapter's directory.

    `model_path_or_model` is a local model directory or a loaded causal LM (then `tokenizer` is
    required). `dataset` holds the prompts (with the pool's worker order and plan bounds) and
    `outcomes` the logged outcomes that score the sampled plans. Each optimizer step takes
    `prompts_per_step` prompts x `num_generations` samples. `use_cpu` defaults to "no GPU visible".
    `grpo_args` passes further `GRPOConfig` fields through (they win over the ones set here).
    `time_limit_s` ends training after the first step that ends past it (the adapter is saved as usual).
    `resume` is the directory of an adapter this function saved before: training goes on from its
    weights (its own rank and targets win over `lora_r`), and the manifest counts the steps and seconds
    of both runs, so a budget ("an hour of training") covers the whole history of the adapter.

    The adapter (adapter_config.json + weights) goes to `<output_dir>/adapter`, with `baton_grpo.json`
    beside it recording the pool order, the reward settings and the training summary.
    """
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    if not len(dataset):
        raise ValueError("the prompt set is empty")
    if steps < 1 or num_generations < 2 or prompts_per_step < 1:
        raise ValueError("steps and prompts_per_step must be at least 1, num_generations at least 2 "
                         "(a group of one has no spread to learn from)")
    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if constraint not in ("grammar", "none"):
        raise ValueError(f"constraint must be 'grammar' or 'none', got {constraint!r}")
    model, tokenizer = _load_model(model_path_or_model, tokenizer, use_cpu)
    before = _resumed(resume, dataset.worker_names) if resume else {}
    if resume:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(resume), is_trainable=True)
    if constraint == "grammar":
        _sample_under_the_grammar(model, tokenizer, dataset.bounds, max_completion_length)
    reward = PlanOutcomeReward(outcomes, dataset.worker_names, dataset.bounds, cost_weight=cost_weight,
                               unknown=unknown_reward)
    settings = _grpo_settings(out, steps=steps, prompts_per_step=prompts_per_step, num_generations=num_generations,
                              max_completion_length=max_completion_length, temperature=temperature,
                              learning_rate=learning_rate, use_cpu=use_cpu, logging_steps=logging_steps,
                              progress=progress, seed=seed)
    settings.update(grpo_args or {})
    config = GRPOConfig(**settings)
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha or 2 * lora_r, lora_dropout=lora_dropout,
                      target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
                      task_type="CAUSAL_LM")
    started = time.monotonic()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset.to_dataset(),
                          processing_class=tokenizer, peft_config=None if resume else lora,
                          callbacks=[_time_limit(started + time_limit_s)] if time_limit_s else None)
    result = trainer.train()
    seconds = time.monotonic() - started
    adapter_dir = out / ADAPTER_DIR
    trainer.model.save_pretrained(str(adapter_dir))
    manifest = {
        "base_model": str(model_path_or_model) if isinstance(model_path_or_model, (str, os.PathLike))
        else getattr(model.config, "_name_or_path", ""),
        "worker_names": dataset.worker_names,
        "max_steps": dataset.bounds.max_steps,
        "max_subtask_chars": dataset.bounds.max_subtask_chars,
        "prompts": len(dataset),
        "steps": trainer.state.global_step + before.get("steps", 0),
        "step_limit": steps,
        "resumed_from": str(resume) if resume else None,
        "num_generations": num_generations,
        "prompts_per_step": prompts_per_step,
        "learning_rate": learning_rate,
        "lora_r": lora_r,
        "constraint": constraint,
        "cost_weight": cost_weight,
        "unknown_reward": unknown_reward,
        "train_seconds": round(seconds + before.get("train_seconds", 0.0), 2),
        "train_loss": result.training_loss,
        **_reward_summary([h for h in trainer.state.log_history if "reward" in h]),
    }
    (adapter_dir / ADAPTER_MANIFEST).write_text(json.dumps(manifest, indent=2))
    return adapter_dir


def _grpo_settings(out: Path, *, steps: int, prompts_per_step: int, num_generations: int,
                   max_completion_length: int, temperature: float, learning_rate: float, use_cpu: bool,
                   logging_steps: int, progress: bool, seed: int) -> dict:
    """GRPOConfig's fields for one run (the caller's `grpo_args` go over them)."""
    import torch

    bf16 = (not use_cpu) and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return {
        "output_dir": str(out / "trainer"),
        "max_steps": steps,
        # One optimizer step per generation round: the batch is whole groups of one prompt's samples,
        # which is also what GRPO's divisibility rule asks for.
        "per_device_train_batch_size": prompts_per_step * num_generations,
        "gradient_accumulation_steps": 1,
        "num_generations": num_generations,
        "max_completion_length": max_completion_length,
        "temperature": temperature,
        "learning_rate": learning_rate,
        "beta": 0.0,
        "use_vllm": False,
        "use_cpu": use_cpu,
        "bf16": bf16,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": logging_steps,
        "disable_tqdm": not progress,
        "seed": seed,
        "data_seed": seed,
    }


def _reward_summary(history: list[dict]) -> dict:
    """The manifest's account of the rewards logged at each step."""
    if not history:
        return {"reward_first": None, "reward_last": None, "reward_std_mean": None,
                **{f"{name}_{end}": None for name in ("valid", "copied") for end in ("first", "last")}}
    return {
        "reward_first": history[0]["reward"],
        "reward_last": history[-1]["reward"],
        # Mean within-group spread of the rewards: 0 means no sample had an advantage over its group.
        "reward_std_mean": sum(h.get("reward_std", 0.0) for h in history) / len(history),
        # Shares of the samples the router could run, and that copied the prompt's example (the reward's metrics).
        **{f"{name}_{end}": history[i].get(f"plan_{name}_share")
           for name in ("valid", "copied") for end, i in (("first", 0), ("last", -1))},
    }


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m baton_trainer grpo",
                                description="GRPO fine-tuning (LoRA) of the LLM conductor from logged outcomes.")
    p.add_argument("--config", required=True, help="Baton YAML config: its workers are the pool the prompts show")
    p.add_argument("--episodes", help="episode dataset directory or URL such as s3://bucket/prefix "
                   "(the reward logger's episodes/ or its parent)")
    p.add_argument("--matrix", help="outcome matrix CSV (RouterBench layout): replay outcomes and prompts")
    p.add_argument("--model", required=True, help="local directory of the base conductor model")
    p.add_argument("--out", required=True, help="output directory; the adapter goes to OUT/adapter")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--num-generations", type=int, default=8, help="plans sampled per prompt (the GRPO group)")
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--max-completion-length", type=int, default=320)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--constraint", choices=["grammar", "none"], default="grammar",
                   help="sample plans under the router's plan grammar (as it serves), or freely")
    p.add_argument("--cost-weight", type=float, default=0.0, help="reward lost per USD of the plan's worker costs")
    p.add_argument("--unknown-reward", type=float, default=UNKNOWN,
                   help="reward of a valid plan whose answering worker has no logged outcome on the query")
    p.add_argument("--final-step-only", action="store_true",
                   help="grade only each episode's final step output, not intermediate steps")
    p.add_argument("--spread-only", action="store_true",
                   help="train only on queries where the workers' logged outcomes differ")
    p.add_argument("--limit", type=int, default=None, help="at most this many training prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="stop after the step that ends past this many minutes of training, and save the adapter")
    p.add_argument("--resume", metavar="ADAPTER_DIR",
                   help="go on training an adapter saved by this command (its steps and time are added up)")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is visible")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from baton_platform.config import ConfigError, load_config
    from baton_policy.matrix import load_matrix

    if not args.episodes and not args.matrix:
        print(json.dumps({"error": "give --episodes, --matrix, or both"}))
        return 2
    try:
        config = load_config(args.config)
        matrix = load_matrix(args.matrix) if args.matrix else None
        data = load_training_data(config, episodes=args.episodes, matrix=matrix,
                                  intermediate=not args.final_step_only, spread_only=args.spread_only,
                                  limit=args.limit)
        if args.resume:
            _resumed(args.resume, data.prompts.worker_names)
    except (OSError, ValueError, ConfigError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    if not args.quiet:
        print(f"[grpo] {len(data.prompts)} prompts, outcomes on {len(data.outcomes)} queries, "
              f"pool {data.prompts.worker_names}", file=sys.stderr, flush=True)
    adapter = train_grpo(
        args.model, None, data.prompts, data.outcomes, output_dir=args.out, steps=args.steps,
        num_generations=args.num_generations, prompts_per_step=args.prompts_per_step,
        learning_rate=args.learning_rate, lora_r=args.lora_r, max_completion_length=args.max_completion_length,
        temperature=args.temperature, constraint=args.constraint, cost_weight=args.cost_weight, unknown_reward=args.unknown_reward,
        seed=args.seed, time_limit_s=args.time_limit * 60 if args.time_limit else None,
        use_cpu=True if args.cpu else None, progress=not args.quiet, resume=args.resume,
    )
    print(json.dumps({"adapter_dir": str(adapter), **json.loads((adapter / ADAPTER_MANIFEST).read_text())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
