"""Runs the 'vllm' conductor on vLLM's real engine (the CPU build) and writes what it saw as JSON; run
by test_conductor_vllm_engine.py with the vLLM environment's python, which holds vLLM and the
router's packages. It judges nothing itself: the test asserts on the JSON.

    .tools/vllm/bin/python tests/conductor/vllm_engine_probe.py WORKDIR OUT.json

One engine (SmolLM2-135M, the default model; the plan grammar under xgrammar), then:
  sampled  - plans for every question at temperature 1, all at once, with their log-probs;
  greedy   - at temperature 0, the base model's plan per question, then the same questions under
             LoRA versions served as a router serves them from baton.policy: v0 (B = 0, which must
             reproduce the base), v1 (random, which should change plans), v2 (rank above the engine's
             limit, which the engine must refuse), `baton@v0` by name while v1 is the default, and a
             rollback to v0.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from baton.v1 import common_pb2, requests_pb2
from baton_eval.gpu_check import build_adapter, model_shape
from baton_platform.config import BatonConfig
from baton_router.conductor.vllm_backend import VllmConductor
from baton_workflow import CONDUCTOR, plan_problems

QUESTIONS = [
    "What is the derivative of x^3 * sin(x)?",
    "Which amendment to the US constitution abolished slavery?",
    "Write a Python function that reverses a linked list.",
    "Solve for x: 3x + 7 = 22.",
]
COMPARED = 2  # questions planned greedily under each version (a 135M model on a small CPU: seconds a plan)
WORKERS = ["strong", "fast", "coder"]
MAX_RANK = 16


def config() -> BatonConfig:
    return BatonConfig(
        workers=[{"name": w, "provider": "openai_compatible", "model": w, "base_url": "http://127.0.0.1:9/v1"}
                 for w in WORKERS],
        # Short plans: the grammar shortens instructions to fit max_tokens, and a 135M model writes filler.
        conductor={"backend": "vllm", "max_steps": 3, "max_subtask_chars": 40,
                   "vllm": {"constraint": "grammar", "temperature": 1.0, "max_tokens": 128, "max_model_len": 2048,
                            "max_loras": 2, "max_lora_rank": MAX_RANK, "seed": 0}})


def ask(i: int, policy: str = "baton") -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id=f"probe-{i}", policy=policy, messages=[
        common_pb2.ChatMessage(role="user", content=QUESTIONS[i])])


def described(proposal) -> dict:
    return {"plan": proposal.plan.model_dump(), "version": proposal.policy_version,
            "tokens": len(proposal.token_logprobs), "logprob_sum": sum(proposal.token_logprobs),
            "max_logprob": max(proposal.token_logprobs, default=None),
            "log_propensity": proposal.log_propensity, "propensity": proposal.propensity,
            # The conductor itself is in the pool (recursion, conductor.max_depth 1 by default).
            "valid": not plan_problems(proposal.plan, [*WORKERS, CONDUCTOR], 3)}


async def plans(conductor: VllmConductor, policy: str = "baton") -> list[dict]:
    # One at a time: greedy plans compared across versions must not depend on how requests were batched.
    return [described(await conductor.propose(ask(i, policy))) for i in range(COMPARED)]


async def probe(workdir: Path) -> dict:
    settings = config()
    conductor = VllmConductor(settings.conductor, settings.workers)
    shape = model_shape(Path(conductor.model))
    for name, seed, rank, scale in (("v0", 1, 8, 0.0), ("v1", 2, 8, 0.5), ("v2", 3, 2 * MAX_RANK, 0.05)):
        build_adapter(workdir / name, Path(conductor.model), shape, seed, rank=rank, scale=scale)
    out: dict = {"model": conductor.model, "engine_args": conductor.engine_args()}
    started = time.perf_counter()
    await conductor.start()
    out["start_s"] = round(time.perf_counter() - started, 1)

    started = time.perf_counter()
    sampled = await asyncio.gather(*(conductor.propose(ask(i)) for i in range(len(QUESTIONS))),
                                   return_exceptions=True)
    out["sampled_s"] = round(time.perf_counter() - started, 1)
    out["sampled"] = [described(p) if not isinstance(p, BaseException) else {"error": repr(p)} for p in sampled]

    conductor.settings = conductor.settings.model_copy(update={"temperature": 0.0})
    greedy = {"base": await plans(conductor)}
    await conductor.serve_policy(str(workdir / "v0"), "v0")
    greedy["v0"] = await plans(conductor)
    await conductor.serve_policy(f"file://{workdir / 'v1'}", "v1")
    greedy["v1"] = await plans(conductor)
    try:
        await conductor.serve_policy(str(workdir / "v2"), "v2")
        out["v2_refused"] = None
    except Exception as e:  # noqa: BLE001 - what the engine says is the result
        out["v2_refused"] = f"{type(e).__name__}: {e}"
    out["default_after_v2"] = conductor.default_adapter
    greedy["after_v2"] = await plans(conductor)
    greedy["by_name_v0"] = await plans(conductor, "baton@v0")
    await conductor.serve_policy(str(workdir / "v0"), "v0")
    greedy["rolled_back"] = await plans(conductor)
    out["greedy"] = greedy
    await conductor.aclose()
    return out


def main() -> None:
    workdir, target = Path(sys.argv[1]), Path(sys.argv[2])
    result = asyncio.run(probe(workdir))
    target.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
