import pyarrow.dataset as ds
from baton.v1 import common_pb2, requests_pb2, responses_pb2

from baton_reward_logger.episodes import EpisodeWriter, Record


def response(i: int) -> responses_pb2.Response:
    req = requests_pb2.ChatRequest(request_id=f"r{i}", policy="baton", created_unix_ms=1_764_000_000_000,
                                   messages=[common_pb2.ChatMessage(role="user", content=f"question {i}")])
    ep = responses_pb2.Episode(request=req, total=common_pb2.Usage(input_tokens=3, output_tokens=4, cost_usd=0.01, calls=1))
    ep.plan.steps.add(worker="w", instruction="do")
    ep.steps.add(step=0, worker="w", model="m", output=f"answer {i}", usage=common_pb2.Usage(input_tokens=3))
    return responses_pb2.Response(request_id=f"r{i}", answer=f"answer {i}", episode=ep,
                                  completed_unix_ms=1_764_000_000_500)


def read(root):
    return ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pylist()


def test_episodes_land_in_date_partitions_named_by_offsets(tmp_path):
    w = EpisodeWriter(tmp_path, "baton.responses")
    path = w.write(2, [Record(2, o, response(o)) for o in (5, 6, 7)])
    assert path.parent.name == "date=2025-11-24"
    assert path.name == "baton.responses-p2-000000000005-000000000007.parquet"
    rows = read(tmp_path)
    assert [r["request_id"] for r in rows] == ["r5", "r6", "r7"]
    assert rows[0]["query"] == "question 5" and rows[0]["steps"][0]["output"] == "answer 5"


def test_a_replay_after_a_crash_replaces_instead_of_duplicating(tmp_path):
    w = EpisodeWriter(tmp_path, "baton.responses")
    w.write(0, [Record(0, o, response(o)) for o in range(0, 4)])
    # The process died before committing; the partition is re-read from 0 and flushed in other sizes.
    w.write(0, [Record(0, o, response(o)) for o in range(0, 2)])
    w.write(0, [Record(0, o, response(o)) for o in range(2, 6)])
    ids = sorted(r["request_id"] for r in read(tmp_path))
    assert ids == [f"r{i}" for i in range(6)]
    assert not list(tmp_path.rglob(".*.tmp"))
