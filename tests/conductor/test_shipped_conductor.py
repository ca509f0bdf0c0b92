"""The conductor the default config ships (config/conductor: the warm-started adapter and the router's
estimate it was trained with) plans as it was taught, on questions it never saw: whichever worker the
estimate puts first, the conductor names it. The untrained model, shown the same estimate, does not."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from testbed import DEFAULT_CONFIG, MMLU_PRO

from baton_eval.conductor_table import llm_config, write_plans
from baton_platform.config import load_config
from baton_policy.evidence import Evidence
from baton_policy.matrix import load_matrix
from baton_trainer.split import split_indices

PER_WORKER = 8


def held_out_questions(estimate: Evidence) -> tuple[list[str], list[str]]:
    """Up to PER_WORKER questions of the test side of `make train-conductor`'s split (seed 0, 30%) for each
    worker the estimate puts first, and that first worker: flash and llama lead on few questions, so an
    even sample shows whether the conductor follows the estimate or names the most frequent worker."""
    matrix = load_matrix(MMLU_PRO)
    _, test = split_indices(matrix.prompts, test_share=0.3, seed=0)
    prompts = [matrix.prompts[i] for i in test]
    firsts = [estimate.workers[j] for j in estimate.chances(prompts).argmax(1)]
    taken: Counter[str] = Counter()
    questions, expected = [], []
    for prompt, first in zip(prompts, firsts, strict=True):
        if taken[first] < PER_WORKER:
            taken[first] += 1
            questions.append(prompt)
            expected.append(first)
    return questions, expected


def first_workers(config, questions: list[str]) -> list[str | None]:
    """The first worker of each question's plan as the router serves it; None for a refused plan."""
    results, _, _ = asyncio.run(write_plans(config, questions))
    return [r.plan.steps[0].worker if r.valid else None for r in results]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_shipped_conductor_names_the_worker_the_estimate_puts_first_on_questions_it_never_saw():
    pytest.importorskip("peft")
    config = load_config(DEFAULT_CONFIG)
    assert config.conductor.backend == "transformers" and config.conductor.evidence is not None
    estimate = Evidence.load(config.conductor.evidence)
    questions, expected = held_out_questions(estimate)
    # Each of the three workers leads somewhere on the held-out side.
    assert Counter(expected) == {w: PER_WORKER for w in estimate.workers}, Counter(expected)

    adapter = config.conductor.transformers.adapter
    trained = first_workers(llm_config(config, model=None, adapter=adapter, temperature=0.0), questions)
    untrained = first_workers(llm_config(config, model=None, adapter=None, temperature=0.0), questions)
    followed = [t == e for t, e in zip(trained, expected, strict=True)]
    by_worker = {w: sum(f for f, e in zip(followed, expected, strict=True) if e == w) for w in estimate.workers}
    assert None not in trained, trained
    assert all(n >= PER_WORKER - 1 for n in by_worker.values()), (by_worker, trained)
    assert sum(followed) >= sum(t == e for t, e in zip(untrained, expected, strict=True)) + PER_WORKER, untrained
