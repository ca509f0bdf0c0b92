"""The episode dataset on S3: written by the reward logger's writer to a real S3-compatible server
(moto's, reached through AWS_ENDPOINT_URL_S3 as MinIO or R2 would be), and read back by the trainer."""

from __future__ import annotations

import pyarrow.dataset as ds
from reward_logger.test_episodes import record
from s3fs import S3FileSystem

from baton_platform.dataset import EPISODE_SCHEMA
from baton_reward_logger.episodes import DatasetWriter
from baton_trainer.cluster import count_episodes
from baton_trainer.grpo_data import read_episodes

DAY = "date=2025-11-24"


def keys(fs: S3FileSystem, url: str) -> list[str]:
    prefix = url.removeprefix("s3://") + "/"
    return sorted(k.removeprefix(prefix) for k in fs.find(url, refresh=True))


def test_files_are_written_whole_under_their_final_names_and_replays_replace_them(s3_url):
    root = f"{s3_url}/baton/data/episodes"
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    assert not w.local
    path = w.write(0, [record(o) for o in range(0, 4)])
    assert path == f"{root}/{DAY}/baton.responses-p0-000000000000-000000000003.parquet"
    # Another replica, with its own S3 client (no listing cache shared), owned partition 0 and wrote
    # 4..7 before it crashed; this one re-reads from 4 in other sizes.
    replica = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)
    replica.fs = other = S3FileSystem(skip_instance_cache=True)
    replica.write(0, [record(o) for o in range(4, 8)])
    w.forget(0)  # the partition was revoked from this replica, then came back
    w.write(0, [record(o) for o in range(4, 6)])
    w.write(0, [record(o) for o in range(6, 9)])
    w.write(2, [record(o, 2) for o in range(0, 2)])
    assert keys(other, root) == [f"{DAY}/baton.responses-p0-000000000000-000000000003.parquet",
                                 f"{DAY}/baton.responses-p0-000000000004-000000000005.parquet",
                                 f"{DAY}/baton.responses-p0-000000000006-000000000008.parquet",
                                 f"{DAY}/baton.responses-p2-000000000000-000000000001.parquet"], \
        "only final names: no temporary object, no duplicate run"
    rows = ds.dataset(root.removeprefix("s3://"), filesystem=other, format="parquet",
                      partitioning="hive").to_table().to_pylist()
    assert sorted(r["source_offset"] for r in rows if r["source_partition"] == 0) == list(range(9))
    assert rows[0]["query"] == "question 0"


def test_the_trainer_reads_episodes_from_s3(s3_url):
    w = DatasetWriter(f"{s3_url}/data/episodes", "baton.responses", EPISODE_SCHEMA)
    assert count_episodes(f"{s3_url}/data/episodes") == 0
    w.write(1, [record(o, 1) for o in range(3)])
    assert count_episodes(f"{s3_url}/data/episodes") == 3
    assert sorted(r["query"] for r in read_episodes(f"{s3_url}/data")) == ["question 0", "question 1", "question 2"]


def test_compaction_on_s3_keeps_each_episode_once_through_a_re_read(s3_url):
    import collections

    from baton_platform.dataset import open_dataset

    root = f"{s3_url}/baton/data/episodes"
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, "cluster/topic")
    for start in range(0, 8, 2):
        w.write(0, [record(o) for o in range(start, start + 2)])
    (merged,) = w.compact({0: 6}, target_bytes=10_000_000)
    assert merged.endswith("-p0-000000000000-000000000005.parquet")
    again = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, "cluster/topic")
    again.fs = S3FileSystem(skip_instance_cache=True)  # another replica's client
    again.write(0, [record(o) for o in range(4, 10)])  # a re-read from inside the merged file
    assert [k.split("-p0-")[1] for k in keys(again.fs, root)] == ["000000000000-000000000005.parquet",
                                                                  "000000000006-000000000009.parquet"]
    seen = collections.Counter(open_dataset(root).to_table(columns=["request_id"]).column("request_id").to_pylist())
    assert seen == {f"r{i}": 1 for i in range(10)}
    assert count_episodes(root) == 10
