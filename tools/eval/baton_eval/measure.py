"""Measure a model-backed conductor on real questions: load time, plans per second alone and batched,
how many plans parse and how many pass the planner's validation, and what the plans look like.
With recursion on, each question is then asked again as an inner call (the conductor named as a
step) after a one-step workflow answered it: how often the conductor keeps that answer.

    python -m baton_eval.measure --config config/baton.yaml --questions 16 \\
        --csv data/routing/mmlu_pro_dev.csv --set transformers.temperature=0.7

Prints one JSON document. Plans are written through `propose`, exactly as the router asks for them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import json
import time
from pathlib import Path

import yaml

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import BatonConfig, load_config
from baton_router.conductor import ConductorOutputError, build_backend
from baton_workflow import CONDUCTOR, plan_problems


def read_questions(path: Path, n: int, max_chars: int) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [row for row in csv.DictReader(f) if len(row["prompt"]) <= max_chars][:n]


def with_overrides(config: BatonConfig, backend: str, sets: list[str]) -> BatonConfig:
    data = config.model_dump(mode="json")
    data["conductor"]["backend"] = backend
    for item in sets:
        key, _, raw = item.partition("=")
        target = data["conductor"]
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[leaf] = yaml.safe_load(raw)
    return BatonConfig(**data)


def ask(i: int, text: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id=f"q{i}", policy="baton",
                                    messages=[common_pb2.ChatMessage(role="user", content=text)])


def inner_ask(i: int, row: dict[str, str], worker: str) -> requests_pb2.ChatRequest:
    """The question as an inner call: one earlier step, on the pool's first worker, gave the reference answer."""
    request = ask(i, row["prompt"])
    answer = f"The answer is ({row['answer']})." if row.get("answer") else "I do not know."
    request.parent.CopyFrom(requests_pb2.Parent(
        request_id=f"q{i}", task_id=f"q{i}:1:1", step=1, attempt=1, depth=1, last_answer=answer,
        steps=[requests_pb2.PriorStep(worker=worker, instruction="Answer the question.", output=answer)]))
    return request


async def measure(config: BatonConfig, rows: list[dict[str, str]], single: int, samples: int) -> dict:
    questions = [r["prompt"] for r in rows]
    backend = build_backend(config.conductor, config.workers)
    max_steps = config.conductor.max_steps
    started = time.perf_counter()
    await backend.start()
    load_s = time.perf_counter() - started

    async def one(i: int, q: str):
        try:
            return await backend.propose(ask(i, q))
        except ConductorOutputError as e:
            return e

    t = time.perf_counter()
    alone = [await one(i, q) for i, q in enumerate(questions[:single])]
    single_s = time.perf_counter() - t
    t = time.perf_counter()
    batched = await asyncio.gather(*(one(i, q) for i, q in enumerate(questions)))
    batched_s = time.perf_counter() - t
    inner = []
    if config.conductor.max_depth:
        async def one_inner(i: int, row: dict[str, str]):
            try:
                return await backend.propose(inner_ask(i, row, config.workers[0].name))
            except ConductorOutputError as e:
                return e

        inner = await asyncio.gather(*(one_inner(i, r) for i, r in enumerate(rows)))
    await backend.aclose()

    parsed = [p for p in batched if not isinstance(p, Exception)]
    # Valid as the router judges a user request: the pool, plus the conductor itself when recursion is on.
    valid = [p for p in parsed if not plan_problems(p.plan, backend.prompter.worker_names, max_steps)]
    steps = collections.Counter(p.plan.steps for p in parsed)
    first_workers = collections.Counter(tuple(p.plan.workers) for p in parsed)
    distinct_subtasks = len({s for p in parsed for s in p.plan.subtasks})
    return {
        "backend": backend.name,
        "load_s": round(load_s, 2),
        "single": {"plans": len(alone), "seconds": round(single_s, 2),
                   "plans_per_s": round(len(alone) / single_s, 3) if single_s else None},
        "batched": {"plans": len(batched), "seconds": round(batched_s, 2),
                    "plans_per_s": round(len(batched) / batched_s, 3),
                    "generate_calls": getattr(backend, "generate_calls", None),
                    "batch_sizes": getattr(backend, "batch_sizes", None)},
        "parse_rate": round(len(parsed) / len(batched), 3),
        "valid_share": round(len(valid) / len(batched), 3),
        "steps": dict(sorted(steps.items())),
        "worker_sequences": {" > ".join(k): v for k, v in first_workers.most_common()},
        "distinct_subtasks": distinct_subtasks,
        "mean_tokens": round(sum(len(p.token_logprobs) for p in parsed) / max(len(parsed), 1), 1),
        "failures": [str(e)[:200] for e in batched if isinstance(e, Exception)],
        "naming_the_conductor": sum(CONDUCTOR in p.plan.workers for p in parsed),
        "inner_calls": _inner_summary(inner, backend.prompter.worker_names, max_steps) if inner else None,
        "samples": [{"question": q[:100], "workers": p.plan.workers, "subtasks": p.plan.subtasks,
                     "access": p.plan.access, "tokens": len(p.token_logprobs),
                     "logprob_sum": round(sum(p.token_logprobs), 2), "propensity": p.propensity}
                    for q, p in list(zip(questions, batched))[:samples] if not isinstance(p, Exception)],
    }


def _inner_summary(inner: list, pool: list[str], max_steps: int) -> dict:
    parsed = [p for p in inner if not isinstance(p, Exception)]
    # As the planner judges an inner call at the depth limit: the empty plan is fine, the conductor is not.
    valid = [p for p in parsed if not plan_problems(p.plan, pool, max_steps, allow_empty=True)
             and CONDUCTOR not in p.plan.workers]
    return {"calls": len(inner), "parse_rate": round(len(parsed) / len(inner), 3),
            "valid_share": round(len(valid) / len(inner), 3),
            "kept_answer": sum(p.plan.steps == 0 for p in parsed),
            "corrective_samples": [{"workers": p.plan.workers, "subtasks": p.plan.subtasks, "access": p.plan.access}
                                   for p in parsed if p.plan.steps][:3]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="Baton YAML file (its workers form the pool)")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "openai", "vllm"])
    parser.add_argument("--csv", required=True, type=Path, help="questions: a CSV with a `prompt` column")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-chars", type=int, default=600, help="use questions of at most this length")
    parser.add_argument("--single", type=int, default=2, help="plans written one at a time first")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="conductor setting, e.g. transformers.batch_size=8 (repeatable)")
    args = parser.parse_args(argv)
    config = with_overrides(load_config(args.config), args.backend, args.set)
    rows = read_questions(args.csv, args.questions, args.max_chars)
    print(json.dumps(asyncio.run(measure(config, rows, args.single, args.samples)), indent=2))


if __name__ == "__main__":
    main()
