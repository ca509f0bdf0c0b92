import pyarrow.dataset as ds
from baton.v1 import common_pb2, feedback_pb2, requests_pb2, responses_pb2

from baton_reward_logger.episodes import EPISODE_SCHEMA, FEEDBACK_SCHEMA, DatasetWriter, Record, episode_row, feedback_row
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
    return ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pylist()


def test_episodes_land_in_date_partitions_named_by_offsets(tmp_path):
    w = DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA)
    path = w.write(2, [record(o, 2) for o in (5, 6, 7)])
    assert path.parent.name == "date=2025-11-24"
    assert path.name == "baton.responses-p2-000000000005-000000000007.parquet"
    rows = read(tmp_path)
    assert [r["request_id"] for r in rows] == ["r5", "r6", "r7"]
    assert rows[0]["query"] == "question 5" and rows[0]["steps"][0]["output"] == "answer 5"
    assert rows[0]["reward"] is None and rows[0]["reward_detail"] == "no reference answer"


def test_a_replay_after_a_crash_replaces_instead_of_duplicating(tmp_path):
    w = DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA)
    w.write(0, [record(o) for o in range(0, 4)])
    # The process died before committing; the partition is re-read from 0 and flushed in other sizes.
    w.write(0, [record(o) for o in range(0, 2)])
    w.write(0, [record(o) for o in range(2, 6)])
    ids = sorted(r["request_id"] for r in read(tmp_path))
    assert ids == [f"r{i}" for i in range(6)]
    assert not list(tmp_path.rglob(".*.tmp"))


def test_graded_rewards_under_both_schemes():
    meta = {"reference": "C", "grader": "choice"}
    right, wrong = response(1, "The answer is (C).", meta, cost=0.2), response(2, "The answer is (B).", meta)
    assert score(right, "quality_minus_cost", 0.5).reward == 1.0 - 0.5 * 0.2
    assert score(wrong, "quality_minus_cost", 0.0).reward == 0.0
    assert score(right, "conductor", 0).reward == 1.0
    assert score(wrong, "conductor", 0).reward == 0.5
    invalid = response(3, "The answer is (C).", meta, fallback=True)
    assert score(invalid, "conductor", 0).reward == 0.0, "an invalid plan earns nothing even if the answer is right"
    unknown = score(response(4, "x", {"reference": "1", "grader": "astrology"}), "conductor", 0)
    assert unknown.reward is None and "unknown grader" in unknown.detail


def test_feedback_rows_join_on_the_response_id(tmp_path):
    fb = feedback_pb2.Feedback(response_id="r1", score=-0.5, comment="meh", created_unix_ms=1_764_000_000_000)
    w = DatasetWriter(tmp_path, "baton.feedback", FEEDBACK_SCHEMA)
    w.write(0, [Record(0, 9, feedback_row(fb, 0, 9), fb.created_unix_ms)])
    (row,) = read(tmp_path)
    assert (row["response_id"], row["score"], row["source_offset"]) == ("r1", -0.5, 9)
