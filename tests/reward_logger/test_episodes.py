import errno
import posixpath
import uuid

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from baton.v1 import common_pb2, feedback_pb2, requests_pb2, responses_pb2
from baton_graders import EvalItem, EvalRegistry
from baton_platform.dataset import EPISODE_SCHEMA, FEEDBACK_SCHEMA, episode_row, feedback_row
from baton_reward_logger import episodes
from baton_reward_logger.episodes import DatasetWriter, Record
from baton_reward_logger.rewards import score


def response(i: int, answer: str | None = None, metadata=None, fallback=False, cost=0.01) -> responses_pb2.Response:
    req = requests_pb2.ChatRequest(request_id=f"r{i}", policy="baton", created_unix_ms=1_764_000_000_000,
                                   messages=[common_pb2.ChatMessage(role="user", content=f"question {i}")],
                                   metadata=metadata or {})
    ep = responses_pb2.Episode(request=req, total=common_pb2.Usage(input_tokens=3, output_tokens=4, cost_usd=cost, calls=1))
    ep.plan.steps.add(worker="w", instruction="do")
    ep.plan.fallback = fallback
    ep.steps.add(step=0, worker="w", model="m", output=f"answer {i}", usage=common_pb2.Usage(input_tokens=3))
    return responses_pb2.Response(request_id=f"r{i}", answer=answer or f"answer {i}", episode=ep,
                                  completed_unix_ms=1_764_000_000_500)


def record(i: int, partition: int = 0) -> Record:
    r = response(i)
    return Record(partition, i, episode_row(r, score(r, "quality_minus_cost", 0.0), partition, i), r.completed_unix_ms)


def read(root):
    """Every row under `root`, a local path or an fsspec URL, read the way any pyarrow user would."""
    fs, path = fsspec.core.url_to_fs(str(root))
    return ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive").to_table().to_pylist()


def files(root) -> list[str]:
    fs, path = fsspec.core.url_to_fs(str(root))
    return sorted(posixpath.relpath(p, path) for p in fs.find(path))


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    """The dataset root on a local disk (temporary file, fsync, rename) or an fsspec URL (one write)."""
    if request.param == "local":
        yield str(tmp_path / "data")
        return
    url = f"memory:///baton-{uuid.uuid4().hex}"  # the memory filesystem is one per process
    yield url
    fsspec.filesystem("memory").rm(url, recursive=True)


def test_episodes_land_in_date_partitions_named_by_offsets(root):
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    path = w.write(2, [record(o, 2) for o in (5, 6, 7)])
    assert path.startswith(root) and path.endswith(
        "/date=2025-11-24/baton.responses-p2-000000000005-000000000007.parquet")
    assert files(root) == ["date=2025-11-24/baton.responses-p2-000000000005-000000000007.parquet"]
    rows = read(root)
    assert [r["request_id"] for r in rows] == ["r5", "r6", "r7"]
    assert rows[0]["query"] == "question 5" and rows[0]["steps"][0]["output"] == "answer 5"
    assert rows[0]["reward"] is None and rows[0]["reward_detail"] == "no evaluation item"


def test_a_replay_after_a_crash_replaces_instead_of_duplicating(root):
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(o) for o in range(0, 4)])
    w.write(1, [record(o, 1) for o in range(0, 3)])  # another partition: its offsets are its own
    # The process died before committing; the partition is re-read from 0 and flushed in other sizes.
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(o) for o in range(0, 2)])
    w.write(0, [record(o) for o in range(2, 6)])
    # A replay of the same run keeps the same name and overwrites the file.
    w.write(0, [record(o) for o in range(2, 6)])
    assert files(root) == ["date=2025-11-24/baton.responses-p0-000000000000-000000000001.parquet",
                           "date=2025-11-24/baton.responses-p0-000000000002-000000000005.parquet",
                           "date=2025-11-24/baton.responses-p1-000000000000-000000000002.parquet"]
    rows = read(root)
    assert sorted(r["request_id"] for r in rows if r["source_partition"] == 0) == [f"r{i}" for i in range(6)]
    assert sorted(r["request_id"] for r in rows if r["source_partition"] == 1) == ["r0", "r1", "r2"]


def test_a_relative_path_stays_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = DatasetWriter("data/episodes", "baton.responses", EPISODE_SCHEMA)
    assert w.local
    assert w.write(0, [record(0)]) == str(tmp_path / "data/episodes/date=2025-11-24/"
                                          "baton.responses-p0-000000000000-000000000000.parquet")


def test_a_file_url_is_a_local_disk(tmp_path):
    w = DatasetWriter(f"file://{tmp_path}/data", "baton.responses", EPISODE_SCHEMA)
    assert w.local, "file:// goes through the temporary file, fsync and rename"
    w.write(0, [record(0), record(1)])
    assert [r["request_id"] for r in read(tmp_path / "data")] == ["r0", "r1"]


def test_the_config_keeps_a_url_as_written(write_config):
    from baton_platform.config import load_config

    config = load_config(write_config({"reward_logger": {"dataset_dir": "s3://bucket/baton/data"}}))
    assert config.reward_logger.dataset_dir == "s3://bucket/baton/data"
    assert load_config(write_config({})).reward_logger.dataset_dir == ".baton/data"


def test_the_trainer_reads_the_dataset_where_the_logger_wrote_it(root):
    from baton_trainer.cluster import count_episodes
    from baton_trainer.grpo_data import read_episodes
    from baton_trainer.logged import read_episodes as read_logged

    assert count_episodes(f"{root}/episodes") == 0 and read_logged(f"{root}/episodes") == []
    w = DatasetWriter(f"{root}/episodes", "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(o) for o in range(0, 3)])
    w.write(3, [record(o, 3) for o in range(7, 9)])
    assert count_episodes(f"{root}/episodes") == 5
    # grpo takes the dataset root or its episodes/ folder.
    assert sorted(r["query"] for r in read_episodes(root)) == sorted(
        r["query"] for r in read_episodes(f"{root}/episodes/"))
    assert len(read_episodes(root)) == 5
    assert read_logged(f"{root}/episodes") == []  # none was chosen by the `policy` backend


EVALS = EvalRegistry({"quiz": {"q1": EvalItem("quiz", "q1", "choice", "C")}})
META = {"baton_eval": "quiz:q1"}


def test_graded_rewards_under_both_schemes():
    right, wrong = response(1, "The answer is (C).", META, cost=0.2), response(2, "The answer is (B).", META)
    assert score(right, "quality_minus_cost", 0.5, EVALS).reward == 1.0 - 0.5 * 0.2
    assert score(wrong, "quality_minus_cost", 0.0, EVALS).reward == 0.0
    assert score(right, "conductor", 0, EVALS).reward == 1.0
    assert score(wrong, "conductor", 0, EVALS).reward == 0.5
    invalid = response(3, "The answer is (C).", META, fallback=True)
    assert score(invalid, "conductor", 0, EVALS).reward == 0.0, "an invalid plan earns nothing even if the answer is right"
    graded = score(right, "conductor", 0, EVALS)
    assert (graded.grader, graded.reference) == ("choice", "C") and graded.detail.startswith("quiz:q1: ")


def test_a_judged_episode_is_graded_on_its_own_answer_not_the_one_the_client_got():
    chose_other = response(5, "The answer is (C).", META)
    chose_other.episode.judge.own_answer, chose_other.episode.judge.chosen = "The answer is (B).", 1
    assert score(chose_other, "quality_minus_cost", 0, EVALS).quality == 0.0
    own_failed = response(6, "The answer is (C).", META)
    own_failed.episode.judge.own_error.message = "step 1 (w) failed: HTTP 500"
    graded = score(own_failed, "conductor", 0, EVALS)
    assert (graded.quality, graded.reward) == (0.0, 0.0) and "HTTP 500" in graded.detail


def test_feedback_rows_join_on_the_response_id(tmp_path):
    fb = feedback_pb2.Feedback(response_id="r1", score=-0.5, comment="meh", created_unix_ms=1_764_000_000_000)
    w = DatasetWriter(tmp_path, "baton.feedback", FEEDBACK_SCHEMA)
    w.write(0, [Record(0, 9, feedback_row(fb, 0, 9), fb.created_unix_ms)])
    (row,) = read(tmp_path)
    assert (row["response_id"], row["score"], row["source_offset"]) == ("r1", -0.5, 9)


async def test_a_record_revoked_while_it_is_graded_is_written_once_by_the_next_reading(write_config, tmp_path):
    import asyncio
    import threading
    from types import SimpleNamespace

    from aiokafka import TopicPartition
    from prometheus_client import CollectorRegistry

    from baton_platform.config import load_config
    from baton_platform.service import Service
    from baton_platform.telemetry import setup_tracing
    from baton_reward_logger.handlers import TopicRecorder
    from baton_reward_logger.metrics import DatasetMetrics

    grading, release = threading.Event(), threading.Event()

    def slow_row(response, partition, offset):
        grading.set()
        release.wait(5)
        return {"request_id": response.request_id}, 0

    config = load_config(write_config())
    service = Service.create("baton-reward-logger", config.kafka, setup_tracing("t", set_global=False))
    written = DatasetMetrics(CollectorRegistry())
    sink = TopicRecorder(service, config.reward_logger, "baton.responses", responses_pb2.Response,
                DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA), slow_row, written,
                blocks=lambda response: True)  # graded: made in a thread
    rows = []
    sink.writer = SimpleNamespace(write=lambda partition, records: rows.extend(r.offset for r in records),
                                  forget=lambda partition: None, incarnation="cluster/topic")

    def message(offset):
        body = responses_pb2.Response(request_id=f"r{offset}").SerializeToString()
        return SimpleNamespace(raw_message=SimpleNamespace(topic="baton.responses", partition=0, offset=offset, headers=(),
                                                           key=b"", value=body), body=body)

    tp = TopicPartition("baton.responses", 0)
    first = asyncio.create_task(sink.consumer.consume(message(2)))
    await asyncio.to_thread(grading.wait, 5)
    await sink.consumer.on_partitions_revoked({tp})  # the rebalance lands while offset 2 is being graded
    release.set()
    await first
    await sink.consumer.consume(message(2))  # the partition comes back: read again from the last commit
    await sink.flush_due(force=True)
    assert rows == [2], "the record is written once, not once per reading"


def policy_episodes(root, tenants):
    """Episodes of requests r0, r1, ... by `tenants`, routed by the policy, with no reference answer."""
    records = []
    for i, tenant in enumerate(tenants):
        r = response(i)
        r.episode.request.tenant = tenant
        r.episode.plan.backend, r.episode.plan.action, r.episode.plan.propensity = "policy", "m", 0.5
        records.append(Record(0, i, episode_row(r, score(r, "quality_minus_cost", 0.0), 0, i), r.completed_unix_ms))
    DatasetWriter(root, "baton.responses", EPISODE_SCHEMA).write(0, records)


def write_feedback(root, ratings, schema=FEEDBACK_SCHEMA, first_offset=0):
    rows = [Record(0, first_offset + i, feedback_row(f, 0, first_offset + i), 1_764_000_000_000)
            for i, f in enumerate(ratings)]
    DatasetWriter(root, "baton.feedback", schema).write(0, rows)


def test_episodes_without_a_reference_take_their_quality_from_their_own_tenants_ratings(tmp_path):
    from baton_trainer.logged import read_episodes, read_feedback

    policy_episodes(tmp_path / "episodes", ["acme", "acme", "acme"])
    write_feedback(tmp_path / "feedback", [
        feedback_pb2.Feedback(response_id="r0", score=1.0, source="judge", tenant="acme"),
        feedback_pb2.Feedback(response_id="r0", score=0.5, source="user", tenant="acme"),
        feedback_pb2.Feedback(response_id="r1", score=-1.0, source="user", tenant="rival"),  # not its request
        feedback_pb2.Feedback(response_id="r2", score=0.0, source="judge", tenant="acme")])
    assert read_episodes(tmp_path / "episodes") == [], "no reference, no feedback: nothing to learn from"
    feedback = read_feedback(tmp_path / "feedback")
    assert feedback == {("r0", "acme"): 0.75, ("r1", "rival"): -1.0, ("r2", "acme"): 0.0}
    logged = read_episodes(tmp_path / "episodes", feedback=feedback)
    assert [(x.request_id, x.episode.reward) for x in logged] == [("r0", 0.75), ("r2", 0.0)]


def test_ratings_written_before_they_named_a_tenant_join_only_episodes_that_name_none(tmp_path):
    from baton_trainer.logged import read_episodes, read_feedback

    policy_episodes(tmp_path / "episodes", ["", "acme"])
    # The first file was written before the column existed: the dataset's schema is that file's.
    old = pa.schema([f for f in FEEDBACK_SCHEMA if f.name != "tenant"])
    write_feedback(tmp_path / "feedback", [feedback_pb2.Feedback(response_id=r, score=1.0) for r in ("r0", "r1")], old)
    write_feedback(tmp_path / "feedback", [feedback_pb2.Feedback(response_id="r1", score=0.5, tenant="acme")],
                   first_offset=2)
    feedback = read_feedback(tmp_path / "feedback")
    assert feedback == {("r0", None): 1.0, ("r1", None): 1.0, ("r1", "acme"): 0.5}
    logged = read_episodes(tmp_path / "episodes", feedback=feedback)
    assert [(x.request_id, x.episode.reward) for x in logged] == [("r0", 1.0), ("r1", 0.5)]


def test_a_flush_lists_the_dataset_once_per_partition_taken_over_however_many_files_a_day_holds(tmp_path):
    """A flush used to list the whole day's folder: 265 ms at 100k files, four times a second. Now a
    partition is listed once when this replica takes it over, and its flushes list nothing."""
    day = tmp_path / "data" / "date=2025-11-24"
    day.mkdir(parents=True)
    for i in range(100_000):  # a busy day's files of other partitions
        (day / f"baton.responses-p{1 + i % 7}-{i:012d}-{i:012d}.parquet").touch()
    w = DatasetWriter(tmp_path / "data", "baton.responses", EPISODE_SCHEMA)
    # Written by this partition's previous owner, past the offset it committed: replaced below.
    DatasetWriter(tmp_path / "data", "baton.responses", EPISODE_SCHEMA).write(0, [record(o) for o in range(4, 8)])
    listings = []
    for name in ("ls", "glob", "find", "walk"):
        method = getattr(w.fs, name)
        setattr(w.fs, name, lambda *a, _m=method, _n=name, **k: listings.append(_n) or _m(*a, **k))

    w.write(0, [record(o) for o in range(0, 2)])
    first = len(listings)
    assert first > 0, "taking the partition over lists it"
    for start in range(2, 60, 2):
        w.write(0, [record(o) for o in range(start, start + 2)])
    assert len(listings) == first, "no flush after the first lists anything"
    names = sorted(p.name for p in day.glob("baton.responses-p0-*"))
    assert names[:4] == ["baton.responses-p0-000000000000-000000000001.parquet",
                         "baton.responses-p0-000000000002-000000000003.parquet",
                         "baton.responses-p0-000000000004-000000000005.parquet",
                         "baton.responses-p0-000000000006-000000000007.parquet"], "the previous owner's 4-7 was replaced"
    w.forget(0)  # the partition moves and comes back: list it again
    w.write(0, [record(o) for o in range(60, 62)])
    assert len(listings) > first


def test_a_replaced_file_goes_only_once_its_replacement_is_durable(root, monkeypatch):
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(o) for o in range(0, 4)])
    again = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)  # the process died before committing

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    # The last step fails: the rename on a local disk, the one PUT on an object store.
    if again.local:
        monkeypatch.setattr(episodes.os, "replace", full_disk)
    else:
        monkeypatch.setattr(again.fs, "pipe_file", full_disk)
    with pytest.raises(OSError):
        again.write(0, [record(o) for o in range(0, 2)])
    assert files(root) == ["date=2025-11-24/baton.responses-p0-000000000000-000000000003.parquet"], \
        "the old file stays while its replacement is not written"


def test_retention_deletes_whole_days_older_than_it_keeps(root):
    import datetime as dt

    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(0)])  # 2025-11-24
    fs, path = fsspec.core.url_to_fs(str(root))
    for day in ("2025-11-20", "2025-11-23", "2025-11-25"):
        fs.makedirs(f"{path}/date={day}", exist_ok=True)
        fs.pipe_file(f"{path}/date={day}/baton.responses-p1-000000000000-000000000000.parquet", b"x")
    removed = w.expire(2, today=dt.date(2025, 11, 25))  # keeps the 24th and the 25th
    assert sorted(posixpath.basename(f) for f in removed) == ["date=2025-11-20", "date=2025-11-23"]
    assert [f.split("/")[0] for f in files(root)] == ["date=2025-11-24", "date=2025-11-25"]
    assert w.expire(2, today=dt.date(2025, 11, 25)) == []
