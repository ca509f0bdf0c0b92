"""GRPO trains the conductor on the prompts the router serves: with `conductor.evidence` set, the router
shows each question the estimate of each worker's chance, so the training prompts must show it too."""

from __future__ import annotations

import random

from test_grpo import COLUMNS, config_data
from test_warmstart import FRUITS, PLANETS, header, matrix_rows

from baton.v1 import common_pb2, requests_pb2
from baton_conductor.prompt import evidence_note
from baton_platform.config import BatonConfig
from baton_policy.evidence import Evidence, out_of_fold
from baton_policy.matrix import from_rows
from baton_router.conductor.llm import PlanPrompter
from baton_trainer.grpo_data import build_prompts, load_training_data, pool_matrix, shown_estimate


def noisy_matrix():
    """Fruit questions mostly right on worker 0, planet ones on worker 1, with a seeded share of the
    outcomes flipped, so an estimate fitted on a question is surer of it than one fitted without it."""
    words = [f"{w}{k}" for k in range(3) for w in FRUITS]
    stars = [f"{w}{k}" for k in range(3) for w in PLANETS]
    rows = matrix_rows(words, "fruit", 0, 0) + matrix_rows(stars, "planet", 1, 100)
    flip = random.Random(0)
    for row in rows:
        for column in COLUMNS:
            if flip.random() < 0.25:
                row[column] = "1" if row[column] == "0" else "0"
    return from_rows(header(), rows)


def evidence_config(tmp_path, matrix) -> BatonConfig:
    workers = BatonConfig(**config_data()).workers
    saved = Evidence.fit(pool_matrix(matrix, workers)).save(tmp_path / "evidence")
    data = config_data()
    data["conductor"]["evidence"] = str(saved)
    return BatonConfig(**data)


def test_a_logged_questions_training_prompt_is_the_one_the_router_serves_it(tmp_path):
    config = evidence_config(tmp_path, noisy_matrix())
    questions = ["Tell me about the fruit called durian, please.", "Tell me about the planet called vulcan, please."]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    prompts = build_prompts(conversations, config, estimate=shown_estimate(config, conversations))
    router = PlanPrompter(config.conductor, config.workers)
    for row, q in zip(prompts.rows, questions, strict=True):
        served = router.messages(requests_pb2.ChatRequest(messages=[common_pb2.ChatMessage(role="user", content=q)]))
        assert "The router's estimate" in served[1]["content"]
        assert row["prompt"] == served
    # Without an estimate configured the router shows none, and neither does training.
    assert shown_estimate(BatonConfig(**config_data()), conversations) is None


def test_a_matrix_questions_training_prompt_shows_the_estimate_fitted_without_it(tmp_path):
    matrix = noisy_matrix()
    config = evidence_config(tmp_path, matrix)
    data = load_training_data(config, matrix=matrix)
    pool = pool_matrix(matrix, config.workers)
    held_out = {p: dict(zip(pool.models, row.tolist(), strict=True)) for p, row in zip(pool.prompts, out_of_fold(pool))}
    served = Evidence.load(config.conductor.evidence)
    names = data.prompts.worker_names
    differs = 0
    assert len(data.prompts) == len(pool)
    for row in data.prompts.rows:
        shown = row["prompt"][1]["content"]
        assert shown.endswith(evidence_note(held_out[row["query"]], names))
        differs += not shown.endswith(evidence_note(served.chance_of(row["query"]), names))
    # The estimate fitted on every row, the one served, is surer of these questions than of new ones.
    assert differs > len(pool) // 4, differs
