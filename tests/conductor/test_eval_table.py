"""`baton eval table`'s scoring: plans on the pool's view of an outcome matrix, with the router's rules
for invalid plans and the copied worked example counted as a wrong answer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from testbed import MMLU_PRO, default_config_data

from baton.v1 import common_pb2, requests_pb2
from baton_conductor import ConductorOutputError
from baton_conductor.prompt import EXAMPLE_SUBTASKS
from baton_eval.conductor_table import llm_row, score_plans
from baton_platform.config import BatonConfig
from baton_policy.matrix import load_matrix
from baton_router.conductor.base import Proposal
from baton_router.planning import COPIED_EXAMPLE, Planner
from baton_trainer.grpo_data import outcomes_from_matrix, pool_matrix, query_key
from baton_workflow import Plan


@pytest.fixture(scope="module")
def config() -> BatonConfig:
    data = default_config_data()
    data["conductor"]["prompt_example"] = True  # the copy rule applies while the prompt shows its example
    return BatonConfig(**data)


@pytest.fixture(scope="module")
def pool(config):
    return pool_matrix(load_matrix(MMLU_PRO).subset(range(40)), config.workers)


def test_the_pool_sees_one_column_per_worker_priced_as_the_grpo_reward_prices_it(config, pool):
    matrix = load_matrix(MMLU_PRO).subset(range(40))
    assert pool.models == ["gemini-pro", "gemini-flash", "llama-70b"]
    assert np.array_equal(pool.scores[:, 0], matrix.scores[:, matrix.models.index("gemini-1.5-pro-002")])
    table = outcomes_from_matrix(matrix, config.workers)
    for i in (0, 17):
        key = query_key(matrix.prompts[i])
        assert pool.costs[i, 1] == pytest.approx(table.get(key, "gemini-flash").cost_usd)
    data = default_config_data()
    data["workers"][0]["model"] = "no-such-model"
    with pytest.raises(ValueError, match="gemini-pro"):
        pool_matrix(matrix, BatonConfig(**data).workers)


def test_a_plan_is_worth_its_last_workers_answer_and_costs_every_step(pool):
    n = len(pool)
    one = score_plans(pool, [["gemini-flash"]] * n)
    two = score_plans(pool, [["gemini-pro", "gemini-flash"]] * n)
    assert one["accuracy"] == two["accuracy"] == pytest.approx(pool.scores[:, 1].mean(), abs=1e-4)
    assert two["avg_cost"] == pytest.approx((pool.costs[:, 0] + pool.costs[:, 1]).mean(), rel=1e-3)
    assert (one["calls_per_query"], two["calls_per_query"]) == (1.0, 2.0)
    assert score_plans(pool, [["gemini-pro"]] * n, wrong=[True] * n)["accuracy"] == 0.0
    with pytest.raises(ValueError, match="plans for"):
        score_plans(pool, [["gemini-pro"]])


class Scripted:
    """A conductor backend that writes the given proposals (or raises the given errors) in turn."""

    name = "scripted"

    def __init__(self, answers: list) -> None:
        self._answers = iter(answers)

    async def propose(self, request):
        answer = next(self._answers)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_llm_plans_follow_the_routers_rules_and_copies_of_the_example_are_refused(config, pool):
    pool = pool.subset(range(4))
    right = int(np.flatnonzero(pool.scores[:, 0] == 1)[0])

    def proposal(workers, subtasks):
        return Proposal(plan=Plan(workers=workers, subtasks=subtasks, access=[[]] + [[0]] * (len(workers) - 1)))

    answers: list = [proposal(["gemini-pro"], ["Answer the question."]) for _ in range(4)]
    answers[(right + 1) % 4] = ConductorOutputError("not JSON")  # the router runs the safe plan
    answers[(right + 2) % 4] = proposal(["nobody"], ["Answer."])  # names no worker: the safe plan too
    answers[right] = proposal(["gemini-flash", "gemini-pro"], list(EXAMPLE_SUBTASKS[:2]))
    planner = Planner(config.conductor, config.workers, Scripted(answers))

    async def plan_all():
        return [await planner.plan(requests_pb2.ChatRequest(request_id=f"r{i}", messages=[
            common_pb2.ChatMessage(role="user", content=q)])) for i, q in enumerate(pool.prompts)]

    results = asyncio.run(plan_all())
    assert COPIED_EXAMPLE in results[right].plan.invalid_reason
    row = llm_row(pool, results)
    assert row["valid_share"] == 0.25 and row["copied_example"] == 0.25
    # As served, the safe plan (gemini-pro) answers the invalid ones, the copy among them; the
    # conductor's own plans score only the one valid plan.
    assert row["accuracy"] == pytest.approx(pool.scores[:, 0].mean(), abs=1e-4)
    assert row["own_accuracy"] == pytest.approx(pool.scores[(right + 3) % 4, 0] / 4, abs=1e-4)
    assert row["calls_per_query"] == 1.0


def test_with_an_estimate_configured_the_table_scores_its_first_worker_on_the_same_rows(tmp_path):
    import csv

    from baton_eval.conductor_table import run_table
    from baton_policy.evidence import Evidence
    from baton_policy.matrix import read_rows

    header, rows = read_rows(MMLU_PRO)
    paths = {"train": tmp_path / "train.csv", "test": tmp_path / "test.csv"}
    for name, part in (("train", rows[:400]), ("test", rows[400:430])):
        with paths[name].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(part)
    data = default_config_data()
    cfg = BatonConfig(**data)
    estimate = Evidence.fit(pool_matrix(load_matrix(paths["train"]), cfg.workers))
    data["conductor"]["evidence"] = str(estimate.save(tmp_path / "evidence"))
    result = run_table(BatonConfig(**data), paths["train"], paths["test"], rows=30, cost_weight=0.0, model=None,
                       adapters={}, temperature=0.0, untrained=False, log=lambda msg: None)
    row = result["table"]["router's estimate, first worker"]
    test = pool_matrix(load_matrix(paths["test"]), cfg.workers)
    first = [[estimate.workers[j]] for j in estimate.chances(test.prompts).argmax(1)]
    assert row["accuracy"] == score_plans(test, first)["accuracy"] and row["calls_per_query"] == 1.0
    assert sum(row["plans"].values()) == pytest.approx(1.0, abs=0.002)


def test_the_fast_policy_as_served_ignores_the_rows_groups_and_keeps_within_the_budget(tmp_path):
    import dataclasses

    from baton_eval.conductor_table import as_served

    matrix = pool_matrix(load_matrix(MMLU_PRO), BatonConfig(**default_config_data()).workers)
    # Rows from every subject (the file is ordered by subject); no question on both sides.
    train, test = matrix.subset(range(0, len(matrix), 5)), matrix.subset(range(3, len(matrix), 70))
    # The same questions, each claiming another row's subject: as served, no group is read at all.
    relabelled = dataclasses.replace(test, eval_names=test.eval_names[1:] + test.eval_names[:1])
    budget = float(test.costs[:, 0].mean())  # the first worker's price on these rows
    served, within = as_served(train, test, 0.0, budget=budget, log=lambda msg: None)
    again, _ = as_served(train, relabelled, 0.0, budget=budget, log=lambda msg: None)
    assert served["accuracy"] == again["accuracy"] and served["workflow_shares"] == again["workflow_shares"]
    affordable = [p for p in served["frontier"] if p["avg_cost"] <= budget]
    assert within is not None and within["avg_cost"] <= budget
    assert within["accuracy"] == max(p["accuracy"] for p in affordable)
