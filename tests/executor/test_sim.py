import asyncio
import csv
import sys

import pytest
from testbed import MMLU_PRO

from baton_executor.providers.base import ProviderCall, ProviderError
from baton_executor.providers.sim import OutcomeMatrix, SimProvider


@pytest.fixture(scope="module")
def matrix():
    return OutcomeMatrix(MMLU_PRO)


def rows(n=50):
    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        return [r for _, r in zip(range(n), csv.DictReader(f))]


def test_sim_answers_as_the_recorded_model_did(matrix):
    sim = SimProvider(matrix, "gemini-1.5-pro-002", latency_ms=0)
    call = ProviderCall(model="gemini-1.5-pro-002", messages=[{"role": "user", "content": "q"}])
    for row in rows():
        reply = asyncio.run(sim.complete(call, query=row["prompt"]))
        recorded = row["gemini-1.5-pro-002|answer"]
        if recorded:
            assert reply.text == f"The answer is ({recorded})."
        assert reply.output_tokens == max(1, int(row["gemini-1.5-pro-002|output_chars"]) // 4)


def test_two_models_differ_where_the_matrix_says_so(matrix):
    strong = SimProvider(matrix, "gemini-1.5-pro-002", 0)
    weak = SimProvider(matrix, "Llama-2-7b-hf", 0)
    call = ProviderCall(model="m", messages=[])
    differ = [r for r in rows(300) if r["gemini-1.5-pro-002|answer"] != r["Llama-2-7b-hf|answer"]]
    assert differ
    r = differ[0]
    assert asyncio.run(strong.complete(call, query=r["prompt"])).text != asyncio.run(weak.complete(call, query=r["prompt"])).text


def test_an_unknown_question_fails_the_step_for_the_fallback_to_take(matrix):
    sim = SimProvider(matrix, "gemini-1.5-pro-002", 0)
    with pytest.raises(ProviderError) as failed:
        asyncio.run(sim.complete(ProviderCall(model="m", messages=[]), query="What is the capital of France?"))
    # Retrying cannot help (the matrix does not change): the step goes straight to the worker's fallback.
    assert failed.value.retryable is False
    assert "not in the outcome matrix of 'gemini-1.5-pro-002'" in failed.value.reason


def test_an_unknown_model_is_refused_at_start(matrix):
    with pytest.raises(ValueError, match="not in the matrix"):
        SimProvider(matrix, "gpt-7", 0)


def test_a_sim_judge_judges_as_well_as_its_model_answered(matrix):
    import json

    sim = SimProvider(matrix, "gemini-1.5-pro-002", latency_ms=0)
    call = ProviderCall(model="gemini-1.5-pro-002", messages=[{"role": "user", "content": "judge"}])
    judged = 0
    for row in rows():
        mine = row["gemini-1.5-pro-002|answer"]
        if not mine:
            continue
        other = "A" if mine != "A" else "B"
        candidates = [f"The answer is ({other}).", f"I think the answer is ({mine}) here."]
        reply = asyncio.run(sim.complete(call, query=row["prompt"], candidates=candidates))
        # It prefers what its model answered, right or wrong.
        assert json.loads(reply.text) == {"scores": [0, 10]}
        judged += 1
    assert judged > 10
    unknown = asyncio.run(sim.complete(call, query="not in the matrix", candidates=["x", "y"]))
    assert json.loads(unknown.text) == {"scores": [5, 5]}, "a question it cannot answer, it cannot judge"


def test_the_registry_has_one_adapter_per_configured_provider():
    from baton_executor.providers.registry import REGISTRY
    from baton_platform.config import PROVIDERS

    assert sorted(REGISTRY) == sorted(PROVIDERS)
