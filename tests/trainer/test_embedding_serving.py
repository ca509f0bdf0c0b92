"""The router's policy conductor serves a policy whose features include a query embedding."""

from __future__ import annotations

import asyncio
import json
import random

import numpy as np

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import load_config
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.templates import single
from baton_router.conductor.policy_backend import PolicyConductor

ZOO, GARAGE = "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"
ANIMALS = ["cat", "dog", "horse", "cow", "sheep", "goat", "rabbit", "lion", "tiger", "wolf"]
VEHICLES = ["car", "truck", "bus", "train", "bicycle", "airplane", "boat", "tram", "scooter", "tractor"]


def _request(text: str) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="r", messages=[common_pb2.ChatMessage(role="user", content=text)])


def test_the_router_routes_unseen_words_with_the_saved_embedding(write_config, tmp_path):
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(1200):
        animal = i % 2 == 0
        word = rng.choice(ANIMALS if animal else VEHICLES)
        model = (ZOO, GARAGE)[int(rng.integers(2))]
        right = (model == ZOO) == animal
        episodes.append(Episode(f"tell me about the {word}", model, float(right if rng.random() < 0.9 else not right), 0.5))
    policy = Policy.fit_logged(episodes, [single(ZOO), single(GARAGE)], embedding="wordllama-l2_supercat-256")
    data = json.loads(json.dumps(load_config(write_config()).model_dump(mode="json", exclude_none=True)))
    workers = [w for w in data["workers"] if w["model"] in (ZOO, GARAGE)]
    assert len(workers) == 2
    config = load_config(write_config({"workers": workers, "conductor": {"backend": "policy", "policy": {
        "epsilon": 0.0, "path": str(policy.save(tmp_path / "p")), "version": "v1"}}}))
    conductor = PolicyConductor(config.conductor.policy, config.workers, rng=random.Random(0))
    assert conductor._current is not None and conductor._current.newcomers is None
    for word, model in [("kitten", ZOO), ("puppy", ZOO), ("donkey", ZOO), ("van", GARAGE), ("taxi", GARAGE), ("ship", GARAGE)]:
        proposal = asyncio.run(conductor.propose(_request(f"tell me about the {word}")))
        assert proposal.action == model, word
