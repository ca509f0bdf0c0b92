"""Warm start of the LLM conductor: supervised fine-tuning on the plans an outcome matrix rewards.

GRPO with one question per step samples a few plans of a 135M model and learns from their spread; the
outcome matrix already knows, for every training question, how every worker did. This step writes
that knowledge into the model directly (reward-filtered imitation, with the matrix as the filter), so
the conductor starts from plans that choose workers and GRPO can refine them afterwards.

Targets, with no hand labels: each training question's target is a one-step plan on the worker whose
recorded reward is highest on the question's group (its `eval_name`, e.g. the MMLU-Pro subject) over
the training rows, reward being the mean score minus `cost_weight` times the mean cost over the dearest
worker's. A per-group mean is the outcome the text can predict: a single row's right or wrong is
mostly noise the prompt does not show. Workers without a column in the matrix (a local model) are
never targets. The prompt is the router's own (`baton_conductor.Prompter`) for the config's pool.

With `--evidence` the prompt also shows the router's estimate of each worker's chance on the question
(`baton_policy.evidence`), as the router will show it when serving, and the target is the worker that
estimate puts first. A subject's best worker is only right on average: the estimate reads the question
itself. The estimates shown are out of fold (fitted without the question), so the model learns from
estimates as good as those it is served; the estimate fitted on every row is written to OUT/evidence
for the config's `conductor.evidence`.

Questions are taken from each target worker in turn (`balanced`), and the token that names the
worker weighs more than the plan's other tokens in the loss (`train`).

Training is LoRA on the top `layers` decoder layers. The bottom of the model is frozen, so its output
for each question is computed once, not once per epoch; and every prompt opens with the same system
message, whose keys and values the bottom layers compute once in all and the top layers once per
batch. Only the tokens after that prefix (the question and the plan) are run per example.

    python -m baton_trainer warm-start --config baton.yaml --matrix train.csv --model BASE_DIR --out OUT

torch, transformers and peft come with the trainer's `grpo` extra and are imported when training starts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from baton.v1 import common_pb2, requests_pb2
from baton_conductor import ADAPTER_MANIFEST, Prompter, render_plan
from baton_platform.config import BatonConfig, ConfigError, load_config
from baton_policy.evidence import Evidence, out_of_fold
from baton_policy.matrix import OutcomeMatrix, load_matrix

from .grpo_data import matrix_column, pool_matrix

ADAPTER_DIR = "adapter"
EVIDENCE_DIR = "evidence"
# The instruction of the target plan's one step: the workers answer the question as asked.
INSTRUCTION = "Answer the question. End with the final answer."


@dataclass(frozen=True)
class Example:
    messages: list[dict[str, str]]
    target: str  # the plan's text, as the grammar spells it
    worker: str
    other: str  # the same plan on another worker: where their tokens part is where the worker is chosen


def group_targets(matrix: OutcomeMatrix, cost_weight: float) -> dict[str, str]:
    """Per group (eval_name): the worker (a column of `matrix`, a `pool_matrix`) with the highest mean
    score minus `cost_weight` x its mean cost over the dearest worker's mean cost; ties go to the cheaper."""
    scale = float(matrix.costs.mean(0).max()) or 1.0
    rows: dict[str, list[int]] = defaultdict(list)
    for i, group in enumerate(matrix.eval_names):
        rows[group or ""].append(i)
    out = {}
    for group, idx in rows.items():
        value = matrix.scores[idx].mean(0) - cost_weight * matrix.costs[idx].mean(0) / scale
        best = max(range(len(matrix.models)), key=lambda j: (round(float(value[j]), 9), -matrix.costs[idx, j].mean()))
        out[group] = matrix.models[best]
    return out


def examples(config: BatonConfig, matrix: OutcomeMatrix, *, cost_weight: float, limit: int | None,
             seed: int, instruction: str = INSTRUCTION, evidence: bool = False,
             ) -> tuple[Prompter, list[Example], dict[str, str] | None, Evidence | None]:
    """The training examples for the config's pool on `matrix` (RouterBench layout): the router's prompt
    for each question and its target plan, on its group's worker (`group_targets`) or, with `evidence`,
    on the worker the router's estimate puts first, the prompt showing that estimate out of fold. Returns
    the group targets (None with `evidence`) and the estimate fitted on every row (None without)."""
    prompter = Prompter(config.conductor, config.workers)
    scored = [w for w in config.workers if matrix_column(w, matrix.models) is not None]
    pool = pool_matrix(matrix, scored)
    groups, fitted, chances = None, None, None
    if evidence:
        chances = out_of_fold(pool, seed=seed)
        targets = [pool.models[j] for j in chances.argmax(1)]
        fitted = Evidence.fit(pool, seed=seed)
    else:
        groups = group_targets(pool, cost_weight)
        targets = [groups[g or ""] for g in pool.eval_names]
    out = []
    for i in balanced(targets, limit, seed):
        worker = targets[i]
        shown = dict(zip(pool.models, chances[i].tolist(), strict=True)) if chances is not None else None
        request = requests_pb2.ChatRequest(request_id=f"warm-{i}", policy="baton",
                                           messages=[common_pb2.ChatMessage(role="user", content=pool.prompts[i])])
        index = prompter.worker_names.index(worker)
        plan, other = (render_plan([k], [instruction], [[]]) for k in (index, (index + 1) % len(prompter.worker_names)))
        out.append(Example(prompter.messages(request, shown), plan, worker, other))
    return prompter, out, groups, fitted


def balanced(targets: Sequence[str], limit: int | None, seed: int) -> list[int]:
    """Rows (indices of `targets`, each row's target worker) taken from each target worker in turn (seeded
    order), so that a worker that is the target of few rows is not drowned by the majority; once a
    worker's rows run out the others go on."""
    queues: dict[str, list[int]] = defaultdict(list)
    order = list(range(len(targets)))
    random.Random(seed).shuffle(order)
    for i in order:
        queues[targets[i]].append(i)
    out: list[int] = []
    while any(queues.values()) and (limit is None or len(out) < limit):
        for worker in sorted(queues):
            if queues[worker] and (limit is None or len(out) < limit):
                out.append(queues[worker].pop(0))
    return out


# ---------------------------------------------------------------- the model


class _Stack:
    """The decoder's layers run by hand over hidden states, with a cache holding a shared prefix."""

    def __init__(self, model) -> None:
        import torch
        from transformers.cache_utils import DynamicCache

        self.torch, self.DynamicCache = torch, DynamicCache
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()

    def run(self, layers, hidden, mask, cache, past: int):
        """`hidden` [B, T, D] through `layers`, after `past` cached positions; `mask` [B, T] marks real tokens."""
        torch = self.torch
        batch, length = hidden.shape[:2]
        positions = torch.arange(past, past + length).unsqueeze(0).expand(batch, -1)
        # Built here, not from the cache: a cache of the top layers alone has no length in its first layer.
        keys = torch.cat([torch.ones(batch, past, dtype=torch.bool), mask.bool()], dim=1)
        causal = torch.arange(past + length).view(1, -1) <= (past + torch.arange(length)).view(-1, 1)
        causal = (causal.unsqueeze(0) & keys.unsqueeze(1)).unsqueeze(1)  # [B, 1, T, past + T]
        rotary = self.decoder.rotary_emb(hidden, position_ids=positions)
        for layer in layers:
            hidden = layer(hidden, attention_mask=causal, position_embeddings=rotary, position_ids=positions,
                           cache=cache, use_cache=True)
        return hidden

    def prefix_cache(self, layers, hidden):
        """Run the prefix [1, P, D] through `layers`; its output and the cache of their keys and values."""
        cache = self.DynamicCache(config=self.decoder.config)
        mask = self.torch.ones(1, hidden.shape[1], dtype=self.torch.long)
        return self.run(layers, hidden, mask, cache, 0), cache

    def expanded(self, cache, layer_ids: Sequence[int], batch: int):
        """A fresh cache holding `cache`'s prefix for each of `batch` rows (a view: no copy until appended)."""
        out = self.DynamicCache(config=self.decoder.config)
        for i in layer_ids:
            layer = cache.layers[i]
            out.update(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1), i)
        return out


def _pad(rows: Sequence[list[int]], value: int):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


def _tokenize(tokenizer, items: Sequence[Example]) -> tuple[list[int], list[list[int]], list[int], list[int]]:
    """The prompts' shared prefix, each example's remaining tokens (question, then plan and end of text),
    where each example's plan starts within them, and where in them the plan names its worker."""
    prompts = [tokenizer(tokenizer.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"] for e in items]
    shared = len(prompts[0])
    for p in prompts[1:]:
        shared = min(shared, next((k for k, (a, b) in enumerate(zip(prompts[0], p)) if a != b), min(len(p), shared)))
    shared = min(shared, min(len(p) for p in prompts) - 1)  # every example keeps a token of its own
    rest, starts, choices = [], [], []
    for p, e in zip(prompts, items):
        plan = tokenizer(e.target + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        other = tokenizer(e.other, add_special_tokens=False)["input_ids"]
        rest.append(p[shared:] + plan)
        starts.append(len(p) - shared)
        choices.append(starts[-1] + next(k for k, (a, b) in enumerate(zip(plan, other)) if a != b))
    return prompts[0][:shared], rest, starts, choices


def train(model, tokenizer, items: Sequence[Example], *, layers: int = 6, epochs: int = 2, batch_size: int = 16,
          learning_rate: float = 5e-4, lora_r: int = 16, choice_weight: float = 10.0, seed: int = 0, log=print):
    """LoRA-fine-tune the top `layers` of `model` on `items`; returns the PEFT model and the loss per epoch.

    The token that names the worker weighs `choice_weight` times any other plan token in the loss: it is
    the one decision in a plan whose other tokens the model learns in a few steps, and unweighted it
    is one token in thirty and the model settles for the most frequent worker."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    total = model.config.num_hidden_layers
    bottom = total - layers
    if not 0 <= bottom < total:
        raise ValueError(f"--layers must be between 1 and {total}")
    model = get_peft_model(model, LoraConfig(
        r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, layers_to_transform=list(range(bottom, total)),
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    stack = _Stack(model)
    low, high = stack.decoder.layers[:bottom], stack.decoder.layers[bottom:]
    prefix, rest, starts, choices = _tokenize(tokenizer, items)
    embed = stack.decoder.embed_tokens
    log(f"[warm-start] {len(items)} examples, shared prefix {len(prefix)} tokens, "
        f"{sum(map(len, rest)) / len(rest):.0f} tokens each after it; LoRA on layers {bottom}-{total - 1}")
    started = time.monotonic()
    with torch.inference_mode():  # the frozen bottom, once
        low_prefix, low_cache = stack.prefix_cache(low, embed(torch.tensor([prefix])))
        cached = []
        for b in range(0, len(rest), batch_size):
            ids, mask = _pad(rest[b:b + batch_size], tokenizer.pad_token_id)
            cache = stack.expanded(low_cache, range(bottom), len(ids))
            hidden = stack.run(low, embed(ids), mask, cache, len(prefix))
            cached += [hidden[i, :int(mask[i].sum())].clone() for i in range(len(ids))]
        low_prefix = low_prefix.clone()
    log(f"[warm-start] bottom layers run in {time.monotonic() - started:.0f} s")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    order = list(range(len(items)))
    losses = []
    model.train()
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(order)
        total_loss, tokens = 0.0, 0.0
        for b in range(0, len(order), batch_size):
            batch = order[b:b + batch_size]
            width = max(len(rest[i]) for i in batch)
            hidden = torch.zeros(len(batch), width, cached[0].shape[-1])
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            weights = torch.zeros(len(batch), width)
            for r, i in enumerate(batch):
                n = len(rest[i])
                hidden[r, :n], mask[r, :n] = cached[i], 1
                # Position t predicts token t + 1: the plan's tokens are predicted from the position before each.
                labels[r, starts[i] - 1:n - 1] = torch.tensor(rest[i][starts[i]:])
                weights[r, starts[i] - 1:n - 1] = 1.0
                weights[r, choices[i] - 1] = choice_weight
            _, top_cache = stack.prefix_cache(high, low_prefix)
            cache = stack.expanded(top_cache, range(bottom, total), len(batch))
            out = stack.run(high, hidden, mask, cache, len(prefix))
            logits = stack.head(stack.decoder.norm(out))
            per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                          ignore_index=-100, reduction="none")
            loss = (per_token * weights.reshape(-1)).sum()
            weight = float(weights.sum())
            (loss / weight).backward()
            optimizer.step()
            optimizer.zero_grad()
            total_loss, tokens = total_loss + loss.item(), tokens + weight
        losses.append(total_loss / tokens)
        log(f"[warm-start] epoch {epoch + 1}/{epochs}: loss {losses[-1]:.4f} per weighted plan token, "
            f"{time.monotonic() - started:.0f} s")
    model.eval()
    return model, losses


# ---------------------------------------------------------------- CLI


def warm_start(config_path: Path, matrix_path: Path, model_path: Path, out: Path, *, examples_limit: int | None,
               cost_weight: float, layers: int, epochs: int, batch_size: int, learning_rate: float, lora_r: int,
               choice_weight: float, seed: int, instruction: str = INSTRUCTION, evidence: bool = False,
               threads: int | None = None, command: str = "", log=print) -> Path:
    import torch

    from .grpo import _load_model

    if threads:
        torch.set_num_threads(threads)
    config = load_config(config_path)
    matrix = load_matrix(matrix_path)
    prompter, items, targets, fitted = examples(config, matrix, cost_weight=cost_weight, limit=examples_limit,
                                                seed=seed, instruction=instruction, evidence=evidence)
    if fitted is not None:
        fitted.save(out / EVIDENCE_DIR)
    model, tokenizer = _load_model(str(model_path), None, use_cpu=True)
    started = time.monotonic()
    model, losses = train(model, tokenizer, items, layers=layers, epochs=epochs, batch_size=batch_size,
                          learning_rate=learning_rate, lora_r=lora_r, choice_weight=choice_weight, seed=seed, log=log)
    seconds = time.monotonic() - started
    adapter_dir = out / ADAPTER_DIR
    model.save_pretrained(str(adapter_dir))
    # PEFT records the base model's path on this machine; the adapter is shipped, so name the model only.
    peft_config = adapter_dir / "adapter_config.json"
    peft_config.write_text(json.dumps(json.loads(peft_config.read_text()) | {"base_model_name_or_path": model_path.name},
                                      indent=2) + "\n")
    (adapter_dir / "README.md").unlink(missing_ok=True)  # PEFT's blank model card
    manifest = {
        "method": "warm-start",
        "base_model": model_path.name,
        "worker_names": prompter.worker_names,
        "max_steps": prompter.bounds.max_steps,
        "max_subtask_chars": prompter.bounds.max_subtask_chars,
        "command": command,
        "matrix": matrix_path.name,
        "matrix_sha256": hashlib.sha256(matrix_path.read_bytes()).hexdigest(),
        "matrix_rows": len(matrix),
        "prompts": len(items),
        "targets": "the router's estimate's first worker" if evidence else "the group's best worker",
        "group_targets": targets,
        "evidence": EVIDENCE_DIR if evidence else None,
        "target_shares": {w: round(c / len(items), 4) for w, c in Counter(e.worker for e in items).most_common()},
        "cost_weight": cost_weight,
        "instruction": instruction,
        "layers": layers,
        "epochs": epochs,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "lora_r": lora_r,
        "choice_weight": choice_weight,
        "seed": seed,
        "train_loss": [round(x, 5) for x in losses],
        "train_seconds": round(seconds, 1),
        "steps": 0,
    }
    (adapter_dir / ADAPTER_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return adapter_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baton-trainer warm-start", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, type=Path, help="Baton YAML: the pool and the conductor's prompt settings")
    p.add_argument("--matrix", required=True, type=Path, help="training outcome matrix (RouterBench CSV layout)")
    p.add_argument("--model", required=True, type=Path, help="the base model's directory (Transformers layout)")
    p.add_argument("--out", required=True, type=Path, help="writes OUT/adapter with its manifest")
    p.add_argument("--examples", type=int, default=None, help="train on at most this many questions (seeded sample)")
    p.add_argument("--cost-weight", type=float, default=0.0,
                   help="W: a group target's reward is score - W * cost / C (unused with --evidence)")
    p.add_argument("--layers", type=int, default=6, help="LoRA on the top LAYERS decoder layers")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--choice-weight", type=float, default=10.0,
                   help="weight of the token naming the worker, against 1 for the plan's other tokens")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instruction", default=INSTRUCTION, help="the target plan's instruction to its one step")
    p.add_argument("--evidence", action="store_true",
                   help="show the router's estimate of each worker's chance in the prompt (out of fold), target the "
                   "worker it puts first, and write the estimate fitted on every row to OUT/evidence")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.examples is not None and args.examples < 1:
        print(json.dumps({"error": "--examples must be at least 1"}))
        return 2
    try:
        adapter = warm_start(args.config, args.matrix, args.model, args.out, examples_limit=args.examples,
                             cost_weight=args.cost_weight, layers=args.layers, epochs=args.epochs,
                             batch_size=args.batch_size, learning_rate=args.learning_rate, lora_r=args.lora_r,
                             choice_weight=args.choice_weight,
                             seed=args.seed, instruction=args.instruction, evidence=args.evidence,
                             threads=args.threads,
                             # The home directory is the machine's, not the recipe's.
                             command=shlex.join(["baton-trainer", "warm-start", *(argv or [])]).replace(
                                 str(Path.home()), "~"),
                             log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except (OSError, ValueError, ConfigError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"adapter": str(adapter), **json.loads((adapter / ADAPTER_MANIFEST).read_text())}))
    return 0

