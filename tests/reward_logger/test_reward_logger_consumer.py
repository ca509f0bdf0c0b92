"""The reward logger's responses consumer: every response becomes one row of the episode dataset (a
local directory or a bucket on a local S3-compatible server), in memory and on the real broker, and
on the real broker across restarts."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import httpx
import pytest
from faststream import TestApp
from testbed import config_for, dataset_rows, ensure_topics, publish, settle, skip_backlog, small_disk, tracer

from baton.v1 import requests_pb2, responses_pb2
from baton_platform import topics
from baton_reward_logger.main import create_app


async def wait_rows(root, ids, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in dataset_rows(root) if r["request_id"] in ids]
        if len(found) >= len(ids):
            return found
        await settle(0.3)
    return [r for r in dataset_rows(root) if r["request_id"] in ids]


def response(rid: str, with_request: bool = True) -> bytes:
    resp = responses_pb2.Response(request_id=rid, answer=f"answer {rid}", completed_unix_ms=1_764_000_000_000)
    if with_request:
        resp.episode.request.CopyFrom(requests_pb2.ChatRequest(request_id=rid, policy="baton"))
    return resp.SerializeToString()


@pytest.fixture(params=["local", "s3"])
def data_dir(request, tmp_path) -> str:
    """reward_logger.dataset_dir: a local directory, or a bucket on a local S3-compatible server."""
    if request.param == "local":
        return str(tmp_path / "episodes")
    return f"{request.getfixturevalue('s3_url')}/baton/data"


def reward_logger_section(data_dir: str) -> dict:
    return {"dataset_dir": data_dir, "flush_every": 2, "flush_interval_s": 0.5}


async def test_each_response_becomes_one_row(bus, data_dir):
    app = create_app(bus.config(reward_logger=reward_logger_section(data_dir)), tracer_provider=tracer())
    ids = [uuid.uuid4().hex for _ in range(3)]
    async with bus.running(app):
        for i, rid in enumerate(ids):
            await bus.publish(app, topics.RESPONSES, rid, response(rid, with_request=i != 2))
        assert len(await wait_rows(f"{data_dir}/episodes", set(ids))) == 3
        await settle(1.5)
    found = [r for r in dataset_rows(f"{data_dir}/episodes") if r["request_id"] in ids]
    assert sorted(r["request_id"] for r in found) == sorted(ids), "every response once, none twice"
    assert {r["answer"] for r in found} == {f"answer {i}" for i in ids}


# Real broker only: the second instance resumes from the offsets the first one committed.
async def test_each_response_is_written_once_across_restarts(kafka_bootstrap, write_config, data_dir):
    await ensure_topics(kafka_bootstrap)
    await skip_backlog(kafka_bootstrap, topics.GROUP_REWARD_LOGGER, topics.RESPONSES)
    config = config_for(write_config, kafka_bootstrap, reward_logger=reward_logger_section(data_dir))
    ids = [uuid.uuid4().hex for _ in range(5)]
    for rid in ids[:3]:
        await publish(kafka_bootstrap, topics.RESPONSES, rid, response(rid))
    async with TestApp(create_app(config, tracer_provider=tracer())):
        assert len(await wait_rows(f"{data_dir}/episodes", set(ids[:3]))) == 3
    for rid in ids[3:]:
        await publish(kafka_bootstrap, topics.RESPONSES, rid, response(rid, with_request=False))
    async with TestApp(create_app(config, tracer_provider=tracer())):
        found = await wait_rows(f"{data_dir}/episodes", set(ids))
        await settle(1.5)
    found = [r for r in dataset_rows(f"{data_dir}/episodes") if r["request_id"] in ids]
    assert sorted(r["request_id"] for r in found) == sorted(ids), "every response once, none twice"
    assert {r["answer"] for r in found} == {f"answer {i}" for i in ids}


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs, filled: writing to it fails with ENOSPC until `free()` removes the filler."""
    with small_disk(tmp_path / "disk") as disk:
        disk.fill()
        yield SimpleNamespace(root=str(disk.path / "data"), free=disk.free)


async def test_a_full_disk_loses_no_episode_and_says_so_until_space_returns(kafka_bootstrap, write_config, full_disk):
    await ensure_topics(kafka_bootstrap)
    await skip_backlog(kafka_bootstrap, topics.GROUP_REWARD_LOGGER, topics.RESPONSES)
    config = config_for(write_config, kafka_bootstrap, reward_logger=reward_logger_section(full_disk.root))
    app = create_app(config, tracer_provider=tracer())
    ids = [uuid.uuid4().hex for _ in range(8)]
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://reward-logger")

    async def unwritable() -> float:
        text = (await http.get("/metrics")).text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith('baton_dataset_unwritable{topic="baton.responses"}'))

    async with TestApp(app):
        for rid in ids:
            await publish(kafka_bootstrap, topics.RESPONSES, rid, response(rid))
        deadline = time.monotonic() + 20
        while (await http.get("/health/ready")).status_code == 200 and time.monotonic() < deadline:
            await settle(0.3)
        ready = await http.get("/health/ready")
        assert ready.status_code == 503 and "No space left on device" in ready.text, ready.text
        assert await unwritable() == 1
        assert dataset_rows(f"{full_disk.root}/episodes") == []

        full_disk.free()
        found = await wait_rows(f"{full_disk.root}/episodes", set(ids))
        await settle(1.5)
        assert (await http.get("/health/ready")).status_code == 200 and await unwritable() == 0
    found = [r for r in dataset_rows(f"{full_disk.root}/episodes") if r["request_id"] in ids]
    assert sorted(r["request_id"] for r in found) == sorted(ids), "every response once, none twice"


# Real broker only: files are named by the topic's incarnation, and the next instance merges what the
# first one wrote and committed.
async def test_committed_files_are_merged_and_each_response_stays_once(kafka_bootstrap, write_config, tmp_path):
    from baton_platform.kafka import topic_incarnation
    from baton_reward_logger.episodes import incarnation_tag

    await ensure_topics(kafka_bootstrap)
    await skip_backlog(kafka_bootstrap, topics.GROUP_REWARD_LOGGER, topics.RESPONSES)
    root = str(tmp_path / "data")
    section = {**reward_logger_section(root), "flush_every": 1}
    ids = [uuid.uuid4().hex for _ in range(4)]
    for rid in ids:
        await publish(kafka_bootstrap, topics.RESPONSES, rid, response(rid), partition=0)
    async with TestApp(create_app(config_for(write_config, kafka_bootstrap, reward_logger=section),
                                  tracer_provider=tracer())):
        assert len(await wait_rows(f"{root}/episodes", set(ids))) == 4
    tag = incarnation_tag(await topic_incarnation({"bootstrap_servers": kafka_bootstrap}, topics.RESPONSES))
    day = tmp_path / "data" / "episodes" / "date=2025-11-24"
    ours = sorted(day.glob(f"{topics.RESPONSES}-{tag}-p0-*.parquet"))
    assert len(ours) >= 4, "one file per response, named by the incarnation"
    compacting = config_for(write_config, kafka_bootstrap, reward_logger={**section, "compact_interval_s": 0.5})
    async with TestApp(create_app(compacting, tracer_provider=tracer())):
        deadline = time.monotonic() + 20
        while len(list(day.glob(f"{topics.RESPONSES}-{tag}-p0-*.parquet"))) > 1 and time.monotonic() < deadline:
            await settle(0.3)
    assert len(list(day.glob(f"{topics.RESPONSES}-{tag}-p0-*.parquet"))) == 1, "merged into one file"
    found = [r for r in dataset_rows(f"{root}/episodes") if r["request_id"] in ids]
    assert sorted(r["request_id"] for r in found) == sorted(ids), "every response once, none twice"
