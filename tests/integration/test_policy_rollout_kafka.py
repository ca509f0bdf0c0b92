"""Hot rollout and rollback: a router serving the policy conductor follows baton.policy, no restart."""

from __future__ import annotations

import asyncio
import random
import uuid
from argparse import Namespace

from faststream import TestApp
from testbed import Tap, ensure_topics, publish, tracer

from baton.v1 import common_pb2, requests_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.config import load_config
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.workflows import single
from baton_router.main import create_app
from baton_trainer.store import PolicyStore, announce, update
from baton_trainer.train_fast import rollback

MODELS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]


def trained(favourite: str, seed: int) -> Policy:
    rng = random.Random(seed)
    eps = [Episode(f"question {i}", m, float(m == favourite), 1 / 3)
           for i in range(300) for m in [rng.choice(MODELS)]]
    return Policy.fit_logged(eps, [single(m) for m in MODELS])


async def planned_version(kafka_bootstrap, tap: Tap) -> tuple[str, list[str]]:
    rid = uuid.uuid4().hex
    req = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="question 7")])
    await publish(kafka_bootstrap, topics.REQUESTS, rid, req.SerializeToString())
    (rec,) = await tap.wait(lambda r: r.key == rid.encode())
    plan = workflow_pb2.WorkflowEvent.FromString(rec.value).planned.plan
    return plan.policy_version, [s.worker for s in plan.steps]


async def wait_version(kafka_bootstrap, tap, version, timeout=30):
    for _ in range(int(timeout / 0.5)):
        got = await planned_version(kafka_bootstrap, tap)
        if got[0] == version:
            return got
        await asyncio.sleep(0.5)
    raise AssertionError(f"router never served {version}; last {got}")


async def test_routers_load_published_policies_and_roll_back(kafka_bootstrap, write_config, tmp_path):
    await ensure_topics(kafka_bootstrap)
    path = write_config({"kafka": {"bootstrap_servers": kafka_bootstrap, "partitions": 4, "session_timeout_ms": 6000,
                                   "heartbeat_interval_ms": 1000},
                         "conductor": {"backend": "policy", "policy": {"epsilon": 0.0}}})
    config = load_config(path)
    store = PolicyStore(str(tmp_path / "store"))
    name = f"baton-{uuid.uuid4().hex[:6]}"
    uris = {}
    for i, (version, favourite) in enumerate((("v1", MODELS[0]), ("v2", MODELS[1]))):
        saved = trained(favourite, i).save(tmp_path / version)
        uris[version] = store.put(name, version, saved, {"version": version, "uri": store.uri(name, version),
                                                         "published_unix_ms": i})
    async with Tap(kafka_bootstrap, topics.WORKFLOW) as tap:
        async with TestApp(create_app(config, tracer_provider=tracer())):
            version, _ = await planned_version(kafka_bootstrap, tap)
            assert version in ("uniform", "v1", "v2")  # whatever the compacted topic held before
            await announce(config.kafka, update(name, "v1", uris["v1"]))
            assert await wait_version(kafka_bootstrap, tap, "v1") == ("v1", ["gemini-pro"])
            await announce(config.kafka, update(name, "v2", uris["v2"]))
            assert await wait_version(kafka_bootstrap, tap, "v2") == ("v2", ["gemini-flash"])
            out = await asyncio.to_thread(rollback, Namespace(config=str(path), store=store.root, name=name, to=None))
            assert out == {"rolled_back": True, "version": "v1", "uri": uris["v1"]}
            assert await wait_version(kafka_bootstrap, tap, "v1") == ("v1", ["gemini-pro"])
