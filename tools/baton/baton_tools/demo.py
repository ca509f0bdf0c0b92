"""`make demo`: real questions through the gateway with the official OpenAI client, each answer shown
with the workflow that produced it: MMLU-Pro questions, which the sim workers answer as their models
did, and free questions, which only a real model (the local one, by fallback) can answer."""

from __future__ import annotations

import csv
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

import openai

from baton_platform.config import BatonConfig
from baton_trainer.grpo_data import matrix_column

FREE_QUESTIONS = ("What is the capital of France?", "Name the largest planet of the solar system.",
                  "What is 17 * 23?")


class DemoQuestion(TypedDict):
    """One demo question: its reference answer ("" for free questions), the topic shown, the
    evaluation item the reward logger grades it by ("" for none), and whether the static plan's last
    worker answered it right (None when the matrix does not record it)."""

    prompt: str
    answer: str
    topic: str
    eval: str
    static_right: bool | None


def demo_questions(config: BatonConfig, count: int, free: int = 2) -> list[DemoQuestion]:
    """Questions spread over the first sim worker's matrix (with reference answers when it has them),
    then `free` questions no matrix holds when the sim workers can hand those on: each has a
    `fallback` that is not a sim (a step on a sim worker without one would fail the request).
    Without sim workers, free questions only."""
    sims = [w for w in config.workers if w.sim is not None]
    answers_anything = all(w.fallback and config.worker(w.fallback).sim is None for w in sims)
    if not sims:
        return [_free(q) for q in FREE_QUESTIONS][:count]
    dataset = Path(sims[0].sim.dataset)
    # The reward logger grades a question when the config has the matrix as an evaluation set.
    eval_set = next((name for name, s in config.reward_logger.eval_sets.items() if s.path == dataset), None)
    csv.field_size_limit(sys.maxsize)
    with dataset.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    free = min(free, count - 1, len(FREE_QUESTIONS)) if answers_anything else 0
    stride = max(1, len(rows) // (count - free))
    static = static_column(config, list(rows[0]) if rows else [])
    matrix = [DemoQuestion(prompt=r["prompt"], answer=r.get("answer", ""), topic=r.get("eval_name", ""),
                           eval=f"{eval_set}:{r['sample_id']}" if eval_set and r.get("sample_id") else "",
                           static_right=r[static] == "1" if static else None)
              for r in rows[::stride][:count - free]]
    return matrix + [_free(q) for q in FREE_QUESTIONS[:free]]


def _free(prompt: str) -> DemoQuestion:
    return DemoQuestion(prompt=prompt, answer="", topic="free question", eval="", static_right=None)


def static_column(config: BatonConfig, columns: list[str]) -> str | None:
    """The matrix column of the static plan's last worker, whose answer the static plan returns: what
    the static plan would have answered each demo question is read from it. None when not recorded."""
    plan = config.conductor.plan
    if plan is None or not plan.workers:
        return None
    last = next((w for w in config.workers if w.name == plan.workers[-1]), None)
    return matrix_column(last, columns) if last is not None and last.sim is not None else None


def _letter(text: str) -> str:
    m = re.search(r"\(([A-J])\)", text or "")
    return m.group(1) if m else ""


def _plan_lines(plan: dict, indent: str) -> list[str]:
    lines = []
    for k, s in enumerate(plan["steps"], 1):
        reads = "all" if s["access"] == "all" else ", ".join(str(j + 1) for j in s["access"]) or "nothing"
        lines.append(f"{indent}{k}. {s['worker']}: \"{s['instruction']}\" (reads {reads})")
    return lines


def describe(info: dict) -> list[str]:
    """The workflow behind one answer (the gateway's `baton` field): the plan, then each step as it ran,
    with the inner plan of a conductor step (none: it kept the answer)."""
    plan = info["plan"]
    lines = [f"    plan by the {plan['backend']} conductor{' (invalid: safe plan used)' if plan['fallback'] else ''}:"]
    lines += _plan_lines(plan, "      ")
    for s in info["steps"]:
        lines.append(f"    step {s['step'] + 1}: {s['worker']:<14} {s['model']:<30} tokens {s['input_tokens']:>4} in / "
                     f"{s['output_tokens']:>4} out   ${s['cost_usd']:.6f}   {s['latency_ms']:.0f} ms")
        planned = plan["steps"][s["step"]]["worker"] if s["step"] < len(plan["steps"]) else s["worker"]
        if s.get("attempt", 1) > 1 and planned != s["worker"]:
            lines.append(f"      fallback: {planned} failed this step, {s['worker']} took it")
        if "inner_plan" in s:
            inner = _plan_lines(s["inner_plan"], "        ")
            lines += ["      the conductor corrected it with:", *inner] if inner else ["      the conductor kept the answer"]
        if "error" in s:
            lines.append(f"      failed: {s['error']}")
    return lines


def run_demo(base_url: str, config: BatonConfig, count: int = 8, api_key: str = "none", out=print) -> dict:
    # Questions name their evaluation items (metadata baton_eval): against a gateway with `auth: keys`,
    # api_key needs the `eval` scope as well as `chat`. A local CPU model may take a while on a busy
    # machine; the gateway's own timeout still applies.
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    models = [m.id for m in client.models.list().data]
    out(f"gateway {base_url} serves models: {', '.join(models)}\n")
    questions = demo_questions(config, count)

    def ask(q):
        started = time.perf_counter()
        r = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": q["prompt"]}],
                                           metadata={"baton_eval": q["eval"]} if q["eval"] else None)
        return q, r, time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(ask, questions))
    right = cost = calls = 0
    latencies = []
    for i, (q, r, elapsed) in enumerate(results, 1):
        info = r.model_extra["baton"]
        answer = r.choices[0].message.content
        ok = bool(q["answer"]) and _letter(answer) == q["answer"]
        right += ok
        cost += info["cost_usd"]
        calls += info["calls"]
        latencies.append(elapsed)
        prompt = " ".join(q["prompt"].split())
        out(f"[{i}] {q['topic']}  {prompt[:110]}{'...' if len(prompt) > 110 else ''}")
        for line in describe(info):
            out(line)
        mark = ("right" if ok else f"wrong, reference {q['answer']}") if q["answer"] else "no reference"
        out(f"    answer: {answer}   ({mark}; {elapsed * 1000:.0f} ms end to end)\n")
    n = len(results)
    graded = sum(1 for q in questions if q["answer"])
    static = [q["static_right"] for q in questions if q["answer"] and q["static_right"] is not None]
    summary = {"questions": n, "graded": graded, "right": right, "cost_usd": cost, "calls": calls,
               "p50_ms": sorted(latencies)[n // 2] * 1000,
               "static_right": sum(static) if len(static) == graded else None}
    out(f"summary: {right}/{graded} with a reference right ({n - graded} free questions), "
        f"{calls / n:.1f} calls per question, ${cost:.6f} in all, median latency {summary['p50_ms']:.0f} ms")
    if summary["static_right"] is not None:
        out(f"the static plan ({' > '.join(config.conductor.plan.workers)}) would have answered "
            f"{summary['static_right']}/{graded} of them right (its last worker's recorded answers)")
    return summary
