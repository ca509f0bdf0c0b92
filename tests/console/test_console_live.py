"""The console follows baton.responses on a real broker: an answer shows on its pages, ungraded,
before the dataset holds it; the graded row replaces it once the dataset does; a record that is not
a Response is skipped and counted, and progress records are not episodes."""

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from starlette.testclient import TestClient
from testbed import default_config_data, ensure_topics, kafka_section

from baton.v1 import common_pb2, requests_pb2, responses_pb2
from baton_console.main import create_app
from baton_platform.config import BatonConfig
from baton_platform.dataset import EPISODE_SCHEMA, Reward, episode_row
from baton_reward_logger.episodes import DatasetWriter, Record

T0 = int(time.time() * 1000)


def answered(request_id: str) -> responses_pb2.Response:
    ep = responses_pb2.Episode(request=requests_pb2.ChatRequest(
        request_id=request_id, tenant="acme", created_unix_ms=T0,
        messages=[common_pb2.ChatMessage(role="user", content="What is 2+2?")]),
        total=common_pb2.Usage(input_tokens=10, output_tokens=2, cost_usd=0.002, calls=1), latency_ms=120.0)
    ep.plan.backend, ep.plan.policy_version = "policy", "v7"
    ep.plan.steps.add(worker="gemini-flash", instruction="Answer.")
    ep.steps.add(step=0, worker="gemini-flash", model="flash-model", attempt=1, output="4",
                 usage=common_pb2.Usage(input_tokens=10, output_tokens=2, cost_usd=0.002), latency_ms=100.0)
    return responses_pb2.Response(request_id=request_id, episode=ep, completed_unix_ms=T0 + 200, answer="4")


async def produce(bootstrap: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait("baton.responses", value, key=b"k")
    finally:
        await producer.stop()


def until(client: TestClient, path: str, text: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        page = client.get(path).text
        if text in page:
            return page
        if time.monotonic() > deadline:
            pytest.fail(f"{path} never showed {text!r}; it shows:\n{page[:3000]}")
        time.sleep(0.2)


def test_answers_show_live_then_graded_from_the_dataset(kafka_bootstrap, tmp_path):
    asyncio.run(ensure_topics(kafka_bootstrap))
    data = default_config_data()
    data["kafka"] = kafka_section(kafka_bootstrap)
    data["gateway"] = {"auth": "none"}
    data["reward_logger"] = {"dataset_dir": str(tmp_path / "data")}
    data["console"] = {"refresh_s": 0.05}
    with TestClient(create_app(BatonConfig(**data), env={})) as client:
        until(client, "/", "partitions)")
        progress = answered("live-1")
        progress.ClearField("answer")
        progress.progress.state = "started"
        asyncio.run(produce(kafka_bootstrap, [progress.SerializeToString(), b"\xff\x00 not a response",
                                              answered("live-1").SerializeToString()]))

        page = until(client, "/episodes/live-1", "not graded yet")
        assert "gemini-flash" in page and "Answer." in page
        overview = until(client, "/", "1 answers not yet in the dataset")
        assert "1 records that are not responses skipped" in overview
        assert "v7" in client.get("/?by=version").text

        # The reward logger writes the graded row: it replaces the live one.
        graded = Reward("exact", "4", 1.0, 1.0, "math:1: right")
        DatasetWriter(tmp_path / "data" / "episodes", "baton.responses", EPISODE_SCHEMA).write(
            0, [Record(0, 0, episode_row(answered("live-1"), graded, 0, 0), T0 + 200)])
        until(client, "/", "0 answers not yet in the dataset")
        assert "math:1: right" in client.get("/episodes/live-1").text
        assert len(client.get("/episodes?request_id=live-1").text.split("/episodes/live-1")) == 2  # listed once


def test_with_live_off_the_console_reads_the_dataset_only(tmp_path):
    data = default_config_data()
    data["gateway"] = {"auth": "none"}
    data["reward_logger"] = {"dataset_dir": str(tmp_path / "data")}
    data["console"] = {"live": False}
    with TestClient(create_app(BatonConfig(**data), env={})) as client:
        assert "Live traffic is off" in client.get("/").text
