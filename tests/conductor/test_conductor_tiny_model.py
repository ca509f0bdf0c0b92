"""The GPU check's scratch artefacts, used on CPU: a tiny random Qwen2 with its own BPE tokenizer and
LoRA adapters (`gpu_check.build`). The 'transformers' conductor runs on that plain model directory
(the non-GGUF path, a different tokenizer), and the adapters fit the model they are built for."""

from __future__ import annotations

import asyncio
import math

import pytest
import pytest_asyncio

from baton.v1 import common_pb2, requests_pb2
from baton_eval.gpu_check import QUESTIONS, WORKERS, build
from baton_platform.config import BatonConfig
from baton_router.conductor import build_backend
from baton_workflow import plan_problems


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    return build(tmp_path_factory.mktemp("gpu-check"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conductor(artefacts, tmp_path_factory):
    base, _ = artefacts
    config = BatonConfig(
        workers=[{"name": w["name"], "provider": "sim", "model": w["name"], "card": w["card"],
                  "sim": {"dataset": str(tmp_path_factory.getbasetemp() / "unused.csv")}} for w in WORKERS],
        conductor={"backend": "transformers", "max_steps": 4, "transformers": {
            "model_path": str(base), "temperature": 1.0, "seed": 0, "batch_size": 4, "batch_wait_ms": 200,
            "max_new_tokens": 200}},
    )
    backend = build_backend(config.conductor, config.workers)
    await backend.start()
    yield backend, [w["name"] for w in WORKERS]
    await backend.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_random_model_under_the_grammar_writes_only_valid_plans(conductor):
    backend, workers = conductor
    asks = [requests_pb2.ChatRequest(request_id=str(i), messages=[common_pb2.ChatMessage(role="user", content=q)])
            for i, q in enumerate(QUESTIONS)]
    # Every other request is an inner call (the conductor as a step): one batch mixes both grammars.
    for a in asks[1::2]:
        a.parent.CopyFrom(requests_pb2.Parent(request_id="p", task_id="p:1:1", step=1, attempt=1, depth=1,
                                              last_answer="42", steps=[requests_pb2.PriorStep(
                                                  worker=workers[0], instruction="Solve it.", output="42")]))
    proposals = await asyncio.gather(*(backend.propose(a) for a in asks))
    assert backend.batch_sizes == [4, 4]
    assert backend._loaded.version == "tiny-qwen2" and not backend._loaded.from_cache
    for a, p in zip(asks, proposals):
        # Random weights write gibberish, yet the grammar holds every plan to the rules and the token limit.
        assert plan_problems(p.plan, [*workers, "conductor"], 4, allow_empty=a.HasField("parent")) == []
        assert 0 < len(p.token_logprobs) <= 200 and all(lp <= 0 for lp in p.token_logprobs)
    assert len({tuple(p.plan.workers) for p in proposals}) > 1, "sampling explores different plans"


@pytest.mark.asyncio(loop_scope="module")
async def test_each_token_has_its_masked_unmasked_and_sampling_log_prob(conductor):
    backend, _ = conductor
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS[:2]]
    samples = await asyncio.to_thread(backend.generate, messages)
    for s in samples:
        n = len(s.token_ids)
        assert len(s.token_logprobs) == len(s.model_logprobs) == len(s.sampling_logprobs) == len(s.forced) == n
        # At temperature 1 with no top-k or top-p, a drawn token comes from the masked, renormalised
        # distribution: its recorded log-prob is exactly the sampling one. A token the grammar forced
        # (jump-forward) was not drawn: its sampling log-prob is 0, its masked one what the model gave it.
        drawn = [(a, b) for a, b, f in zip(s.token_logprobs, s.sampling_logprobs, s.forced) if not f]
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in drawn)
        assert 0 < sum(s.forced) < n, "the plan's structure is fed by jump-forward, its choices are drawn"
        assert all(b == 0.0 and a <= 0 for a, b, f in zip(s.token_logprobs, s.sampling_logprobs, s.forced) if f)
        # Renormalising over the allowed tokens can only raise a token's probability, and a random
        # model spreads its mass over the whole vocabulary, so for most tokens it rises a lot.
        pairs = list(zip(s.model_logprobs, s.token_logprobs))
        assert all(own <= allowed + 1e-4 for own, allowed in pairs)
        assert sum(allowed - own > 0.01 for own, allowed in pairs) > n / 2
        assert math.isclose(s.sampling_logprob, sum(s.sampling_logprobs))


def test_the_lora_adapters_match_the_models_attention_shapes(artefacts):
    import json

    import safetensors.torch
    from transformers import AutoModelForCausalLM

    base, adapters = artefacts
    weights = AutoModelForCausalLM.from_pretrained(str(base)).state_dict()
    for path in adapters.values():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == 8
        tensors = safetensors.torch.load_file(str(path / "adapter_model.safetensors"))
        assert len(tensors) == 2 * 4 * 2  # A and B, 4 projections, 2 layers
        for key, tensor in tensors.items():
            module, part = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
            target = weights[module + ".weight"]  # (out, in)
            if part.startswith("A"):
                assert tensor.shape == (8, target.shape[1]), key
            else:
                assert tensor.shape == (target.shape[0], 8), key
                assert tensor.abs().sum() > 0, "a zero B would leave the model unchanged"
