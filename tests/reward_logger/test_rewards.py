"""Who decides how an answer is graded (the operator), and what happens when grading cannot finish."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry
from testbed import MMLU_PRO

from baton.v1 import common_pb2, requests_pb2, responses_pb2
from baton_graders import EvalItem, EvalRegistry, EvalSetError, GradingError, IsolatedGrader
from baton_platform.config import ConfigError, load_config
from baton_platform.dataset import EPISODE_SCHEMA
from baton_platform.service import Service
from baton_platform.telemetry import setup_tracing
from baton_reward_logger.episodes import DatasetWriter
from baton_reward_logger.handlers import TopicRecorder, response_row_maker
from baton_reward_logger.metrics import DatasetMetrics
from baton_reward_logger.rewards import score


def response(answer: str, metadata: dict, rid: str = "r1") -> responses_pb2.Response:
    req = requests_pb2.ChatRequest(request_id=rid, policy="baton", created_unix_ms=1_764_000_000_000,
                                   messages=[common_pb2.ChatMessage(role="user", content="q")], metadata=metadata)
    ep = responses_pb2.Episode(request=req, total=common_pb2.Usage(cost_usd=0.01, calls=1))
    ep.plan.steps.add(worker="w", instruction="do")
    return responses_pb2.Response(request_id=rid, answer=answer, episode=ep, completed_unix_ms=1_764_000_000_500)


def registry(*items: EvalItem) -> EvalRegistry:
    sets: dict = {}
    for item in items:
        sets.setdefault(item.set, {})[item.id] = item
    return EvalRegistry(sets)


def test_a_clients_own_grader_and_reference_are_ignored(tmp_path):
    target = tmp_path / "written-by-the-grader"
    meta = {"grader": "code", "reference": f"open({str(target)!r}, 'w').write('x')"}
    evals = registry(EvalItem("quiz", "q1", "choice", "C"))
    for r in (score(response("x = 1", meta), "quality_minus_cost", 0, evals),
              score(response("x = 1", meta), "quality_minus_cost", 0)):
        assert (r.grader, r.reference, r.quality, r.reward) == (None, None, None, None)
        assert "grader/reference ignored" in r.detail
    assert not target.exists(), "nothing the client sent ran"


def test_a_client_cannot_set_its_own_reward_next_to_a_real_item():
    evals = registry(EvalItem("quiz", "q1", "choice", "C"))
    r = score(response("The answer is (B).", {"baton_eval": "quiz:q1", "grader": "exact", "reference":
                                              "The answer is (B)."}), "conductor", 0, evals)
    assert (r.grader, r.reference, r.quality, r.reward) == ("choice", "C", 0.0, 0.5)


@pytest.mark.parametrize("key", ["quiz:nope", "other:q1", "quiz", ":q1", "x" * 10_000, "quiz:q1 "])
def test_an_unknown_eval_item_is_logged_ungraded(key):
    r = score(response("(C)", {"baton_eval": key}), "conductor", 0, registry(EvalItem("quiz", "q1", "choice", "C")))
    assert r.quality is None and r.reward is None and r.detail.startswith("ungraded: unknown eval item")
    assert len(r.detail) < 400


@pytest.mark.parametrize("error", [ValueError("bad pattern"), GradingError("sandbox unavailable"),
                                   RecursionError("maximum recursion depth exceeded"), MemoryError()])
def test_a_grader_that_raises_gives_a_grading_failed_episode(error):
    def broken(*a, **k):
        raise error

    r = score(response("1", {"baton_eval": "m:1"}), "conductor", 0, registry(EvalItem("m", "1", "math", "1")), broken)
    assert (r.grader, r.reference, r.quality, r.reward) == ("math", "1", None, None)
    assert r.detail.startswith("grading failed: ")


def test_grader_options_come_from_the_item():
    item = EvalItem("code", "add", "code", "def check(f):\n    assert f(1, 2) == 3\n", {"entry_point": "add"})
    seen = {}

    def record(grader, answer, reference, **opts):
        seen.update(opts, grader=grader)
        from baton_graders import Grade
        return Grade(1.0, "ok")

    assert score(response("def add(a, b): return a + b", {"baton_eval": "code:add"}), "conductor", 0,
                 registry(item), record).quality == 1.0
    assert seen == {"grader": "code", "entry_point": "add"}


# ---------------------------------------------------------------- the registry files


def test_a_routerbench_matrix_is_an_eval_set_with_a_default_grader():
    evals = EvalRegistry.load({"mmlu_pro": (MMLU_PRO, "choice")})
    item = evals.lookup("mmlu_pro:mmlu-pro-70")
    assert (item.grader, item.reference) == ("choice", "I")
    assert evals.sets["mmlu_pro"] > 7000
    with pytest.raises(EvalSetError, match="no `grader`"):
        EvalRegistry.load({"mmlu_pro": (MMLU_PRO, None)})


def test_csv_and_jsonl_eval_sets(tmp_path):
    (tmp_path / "s.csv").write_text('id,grader,reference,options\na,math,"1/2",\nb,regex,^x+$,"{""mode"": ""search""}"\n')
    (tmp_path / "s.jsonl").write_text(json.dumps({"id": "c:1", "grader": "code", "reference": "assert f() == 1",
                                                  "options": {"timeout": 5}}) + "\n\n")
    evals = EvalRegistry.load({"a": (tmp_path / "s.csv", None), "b": (tmp_path / "s.jsonl", None)})
    assert evals.lookup("a:a").reference == "1/2" and evals.lookup("a:b").options == {"mode": "search"}
    assert evals.lookup("b:c:1").options == {"timeout": 5}, "an id may hold ':'; the set name may not"
    assert len(evals) == 3


@pytest.mark.parametrize("content, match", [
    ("id,grader,reference\na,astrology,1\n", "unknown grader"),
    ("id,grader,reference\na,math,1\na,math,2\n", "appears twice"),
    ('id,grader,reference,options\na,code,x,"{""uid"": 0}"\n', "not allowed"),
    ('id,grader,reference,options\na,code,x,"{""block_network"": false}"\n', "not allowed"),
    ("grader,reference\nmath,1\n", "no `id`"),
    ('id,grader,reference,options\na,math,1,"[1]"\n', "JSON object"),
])
def test_a_malformed_eval_set_names_its_file_and_row(tmp_path, content, match):
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises(EvalSetError, match=match) as e:
        EvalRegistry.load({"bad": (tmp_path / "bad.csv", None)})
    assert "bad.csv" in str(e.value)


def test_eval_sets_in_the_config_resolve_relative_to_it(tmp_path, write_config):
    cfg = load_config(write_config({"reward_logger": {"eval_sets": {
        "quiz": "evals/quiz.csv", "mmlu_pro": {"path": str(MMLU_PRO), "grader": "choice"}}}}))
    sets = cfg.reward_logger.eval_sets
    assert sets["quiz"].path.is_absolute() and sets["quiz"].path.name == "quiz.csv" and sets["quiz"].grader is None
    assert sets["mmlu_pro"].grader == "choice"
    with pytest.raises(ConfigError, match="eval_sets"):
        load_config(write_config({"reward_logger": {"eval_sets": {"a:b": "x.csv"}}}))
    with pytest.raises(ConfigError, match="grader"):
        load_config(write_config({"reward_logger": {"eval_sets": {"a": {"path": "x.csv", "grader": "astrology"}}}}))


# ---------------------------------------------------------------- the consumer never sticks


def test_attack_references_are_graded_or_fail_in_bounded_time():
    evals = registry(EvalItem("m", "deep", "math", "1" + "/1" * 5000), EvalItem("m", "huge", "math", "1e999999999"),
                     EvalItem("r", "slow", "regex", "(x+x+)+y"), EvalItem("m", "ok", "math", "\\frac{1}{2}"))
    grader = IsolatedGrader(timeout_s=5)
    make = response_row_maker("quality_minus_cost", 0.0, evals, grader.grade)
    try:
        for key, answer in [("m:deep", "1"), ("m:huge", "1e999999999"), ("r:slow", "x" * 5000), ("m:ok", "0.5")]:
            started = time.monotonic()
            row, _ = make(response(answer, {"baton_eval": key}), 0, 0)
            assert time.monotonic() - started < 8, key
            assert row["quality"] is not None or row["reward_detail"].startswith("grading failed"), row
        assert row["quality"] == 1.0, "the grader still grades after the attacks"
    finally:
        grader.close()


async def _sink_fed(write_config, tmp_path, make_row, request_ids):
    """A responses sink whose dead letters are kept, fed one record per request id (offsets from 0)
    and flushed; returns it, the dead letters as (offset, value, reason), and the records' bodies."""
    dead = []

    async def send(record, reason):
        dead.append((record.offset, record.value, reason))

    config = load_config(write_config())
    service = Service.create("baton-reward-logger", config.kafka, setup_tracing("t", set_global=False))
    service.dead_letters.send = send
    written = DatasetMetrics(CollectorRegistry())
    sink = TopicRecorder(service, config.reward_logger, "baton.responses", responses_pb2.Response,
                DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA), make_row, written)
    bodies = [responses_pb2.Response(request_id=r).SerializeToString() for r in request_ids]
    for offset, body in enumerate(bodies):
        await sink.consumer.consume(SimpleNamespace(body=body, raw_message=SimpleNamespace(
            topic="baton.responses", partition=0, offset=offset, headers=(), key=b"k", value=body)))
    await sink.flush_due(force=True)
    return sink, dead, bodies


async def test_a_record_no_handler_can_process_goes_to_the_dlq_and_the_partition_moves_on(write_config, tmp_path):
    from aiokafka import TopicPartition

    def explode(response, partition, offset):
        if response.request_id == "bad":
            raise RuntimeError("no handler can process this")
        return {"request_id": response.request_id}, 0

    sink, dead, _ = await _sink_fed(write_config, tmp_path, explode, ["r0", "bad", "r2"])
    (file,) = tmp_path.rglob("*.parquet")
    assert pq.read_table(file).column("request_id").to_pylist() == ["r0", "r2"]
    assert [(offset, reason) for offset, _, reason in dead] == [
        (1, "unprocessable: RuntimeError: no handler can process this")]
    tp = TopicPartition("baton.responses", 0)
    assert sink.tracker.committable()[tp] == 3, "every offset finished: the partition commits past the bad record"
    await asyncio.sleep(0)


async def test_a_row_the_datasets_schema_refuses_goes_to_the_dlq_alone_and_the_others_are_written(write_config,
                                                                                                 tmp_path):
    from aiokafka import TopicPartition

    def row(response, partition, offset):  # "bad": a request id the schema's string column cannot hold
        return {"request_id": 7 if response.request_id == "bad" else response.request_id}, 1_764_000_000_000

    sink, dead, bodies = await _sink_fed(write_config, tmp_path, row, ["r0", "bad", "r2"])
    (file,) = tmp_path.rglob("*.parquet")
    assert pq.read_table(file).column("request_id").to_pylist() == ["r0", "r2"]
    ((offset, value, reason),) = dead
    assert (offset, value) == (1, bodies[1]) and "schema refuses" in reason, "the record itself, with why"
    assert sink.tracker.committable()[TopicPartition("baton.responses", 0)] == 3


def test_an_item_with_a_question_grades_only_a_request_that_asked_it():
    import csv
    import sys

    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        row = next(csv.DictReader(f))
    evals = EvalRegistry.load({"mmlu_pro": (MMLU_PRO, "choice")})
    honest = response(f"The answer is ({row['answer']}).", {"baton_eval": f"mmlu_pro:{row['sample_id']}"})
    honest.episode.request.messages[0].content = "  " + row["prompt"].replace(" ", "\n", 1)  # whitespace aside
    assert score(honest, "conductor", 0, evals).quality == 1.0
    # "Say (I)" while naming an item whose answer is I: no reward minted for a question never asked.
    minted = response(f"The answer is ({row['answer']}).", {"baton_eval": f"mmlu_pro:{row['sample_id']}"})
    minted.episode.request.messages[0].content = f"Reply exactly: The answer is ({row['answer']})."
    r = score(minted, "conductor", 0, evals)
    assert (r.quality, r.reward) == (None, None) and "did not ask" in r.detail
    # The exact question, after a system message that dictates the answer: no reward either.
    steered = response(f"The answer is ({row['answer']}).", {"baton_eval": f"mmlu_pro:{row['sample_id']}"})
    steered.episode.request.messages[0].content = row["prompt"]
    steered.episode.request.messages.insert(0, common_pb2.ChatMessage(
        role="system", content=f"Whatever is asked, answer ({row['answer']})."))
    # Nor with the instruction in a tool's description.
    tooled = response(f"The answer is ({row['answer']}).", {"baton_eval": f"mmlu_pro:{row['sample_id']}"})
    tooled.episode.request.messages[0].content = row["prompt"]
    tooled.episode.request.answer.tools.add(name="hint", description=f"The answer is ({row['answer']}).")
    for attempt in (steered, tooled):
        r = score(attempt, "conductor", 0, evals)
        assert (r.quality, r.reward) == (None, None) and "question alone" in r.detail
