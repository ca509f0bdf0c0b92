"""The episode dataset's file names across topic incarnations, and compaction: a re-read still
writes each record once after small files were merged, a crash between the merged file and the
deletions leaves no row twice for readers, and the trainer reads the merged layout."""

from __future__ import annotations

import collections
import posixpath

import fsspec
import pytest
from reward_logger.test_episodes import files, record, root  # noqa: F401 - `root` is a fixture

from baton_platform.dataset import EPISODE_SCHEMA, current_files, open_dataset
from baton_reward_logger.episodes import DatasetWriter, incarnation_tag

A, B = "clusterA/0f0e", "clusterB/0f0e"  # one topic's name on two clusters (or created twice)
DAY = "date=2025-11-24"


def rows_per_request(where) -> collections.Counter:
    """How often the shared reader (the trainer's and the console's) sees each episode."""
    dataset = open_dataset(where)
    return collections.Counter(dataset.to_table(columns=["request_id"]).column("request_id").to_pylist())


def name(incarnation: str | None, partition: int, first: int, last: int) -> str:
    stem = "baton.responses" if incarnation is None else f"baton.responses-{incarnation_tag(incarnation)}"
    return f"{DAY}/{stem}-p{partition}-{first:012d}-{last:012d}.parquet"


def test_files_of_another_incarnation_survive_a_writer_of_the_same_topic_partition_and_offsets(root):  # noqa: F811
    DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A).write(0, [record(o) for o in range(0, 4)])
    legacy = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA)  # names from before they held the incarnation
    legacy.write(0, [record(o) for o in range(0, 4)])
    b = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, B)
    b.write(0, [record(o) for o in range(0, 2)])
    b.write(0, [record(o) for o in range(2, 4)])
    assert files(root) == sorted([name(A, 0, 0, 3), name(None, 0, 0, 3), name(B, 0, 0, 1), name(B, 0, 2, 3)])
    assert rows_per_request(root) == {f"r{i}": 3 for i in range(4)}, "three incarnations, each read"
    # A's partition is re-read after a crash, in other sizes: its own file is replaced, no other.
    a = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    a.write(0, [record(o) for o in range(0, 2)])
    a.write(0, [record(o) for o in range(2, 4)])
    assert files(root) == sorted([name(A, 0, 0, 1), name(A, 0, 2, 3), name(None, 0, 0, 3),
                                  name(B, 0, 0, 1), name(B, 0, 2, 3)])
    assert rows_per_request(root) == {f"r{i}": 3 for i in range(4)}


def test_the_incarnation_tag_differs_between_incarnations_and_stays_within_one():
    assert incarnation_tag(A) == incarnation_tag(A) and incarnation_tag(A) != incarnation_tag(B)
    assert len(incarnation_tag(A)) == 12 and int(incarnation_tag(A), 16) >= 0


def test_a_re_read_after_compaction_writes_each_episode_once(root):  # noqa: F811
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    for start in range(0, 8, 2):
        w.write(0, [record(o) for o in range(start, start + 2)])
    w.write(1, [record(o, 1) for o in (10,)])
    w.write(1, [record(o, 1) for o in (11,)])
    # Partition 0 committed through 5 (6 is next), partition 1 through 11.
    made = w.compact({0: 6, 1: 12}, target_bytes=10_000_000)
    assert sorted(posixpath.basename(m) for m in made) == [posixpath.basename(name(A, 0, 0, 5)),
                                                           posixpath.basename(name(A, 1, 10, 11))]
    assert files(root) == sorted([name(A, 0, 0, 5), name(A, 0, 6, 7), name(A, 1, 10, 11)])
    assert rows_per_request(root) == {**{f"r{i}": 1 for i in range(8)}, "r10": 1, "r11": 1}
    # The commit of 6 was lost: a new owner re-reads partition 0 from 2, inside the merged file.
    again = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    assert again.write(0, [record(o) for o in range(2, 4)]) is None, "all held by the merged file"
    again.write(0, [record(o) for o in range(4, 9)])  # 4, 5 held; 6-7 replaced; 8 new
    assert files(root) == sorted([name(A, 0, 0, 5), name(A, 0, 6, 8), name(A, 1, 10, 11)])
    assert rows_per_request(root) == {**{f"r{i}": 1 for i in range(9)}, "r10": 1, "r11": 1}
    # And from 0, the merged file's first offset.
    again = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    assert again.write(0, [record(o) for o in range(0, 9)]) == f"{root}/{name(A, 0, 0, 8)}"
    assert files(root) == sorted([name(A, 0, 0, 8), name(A, 1, 10, 11)])
    assert rows_per_request(root) == {**{f"r{i}": 1 for i in range(9)}, "r10": 1, "r11": 1}


def test_compaction_leaves_uncommitted_files_large_files_and_other_incarnations_alone(root):  # noqa: F811
    other = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, B)
    other.write(0, [record(0)])
    other.write(0, [record(1)])
    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    for o in range(6):
        w.write(0, [record(o)])
    size = fsspec.core.url_to_fs(f"{root}/{name(A, 0, 0, 0)}")[0].size(
        fsspec.core.url_to_fs(f"{root}/{name(A, 0, 0, 0)}")[1])
    # Committed through 4; two files fit the target: 0-1, 2-3, and 4 alone stays as it is.
    made = w.compact({0: 5}, target_bytes=2 * size)
    assert len(made) == 2
    assert files(root) == sorted([name(A, 0, 0, 1), name(A, 0, 2, 3), name(A, 0, 4, 4), name(A, 0, 5, 5),
                                  name(B, 0, 0, 0), name(B, 0, 1, 1)])
    assert w.compact({0: 5}, target_bytes=2 * size) == [], "a merged file at the target is not merged again"
    assert w.compact({1: 100}, target_bytes=10_000_000) == [], "only the partitions asked for"


def test_a_crash_between_the_merged_file_and_the_deletions_shows_no_row_twice(root, monkeypatch):  # noqa: F811
    from baton_trainer.cluster import count_episodes
    from baton_trainer.grpo_data import read_episodes

    w = DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A)
    for start in range(0, 6, 2):
        w.write(0, [record(o) for o in range(start, start + 2)])
    deleted = []

    def crash_after_one(path, *args, **kwargs):
        if deleted:
            raise SystemExit("killed")  # the process dies after the merged file and one deletion
        deleted.append(path)
        return original(path, *args, **kwargs)

    original = w.fs.rm_file
    monkeypatch.setattr(w.fs, "rm_file", crash_after_one)
    with pytest.raises(SystemExit):
        w.compact({0: 6}, target_bytes=10_000_000)
    monkeypatch.undo()
    assert files(root) == sorted([name(A, 0, 0, 5), name(A, 0, 2, 3), name(A, 0, 4, 5)]), "both are on disk"
    assert rows_per_request(root) == {f"r{i}": 1 for i in range(6)}, "the reader skips the merged files"
    assert count_episodes(root) == 6 and len(read_episodes(root)) == 6
    # The next compaction (any replica's, once it owns the partition) removes what was merged.
    assert DatasetWriter(root, "baton.responses", EPISODE_SCHEMA, A).compact({0: 6}, 10_000_000) == []
    assert files(root) == [name(A, 0, 0, 5)]
    assert rows_per_request(root) == {f"r{i}": 1 for i in range(6)}


def test_a_merged_file_holds_columns_older_files_lacked_as_nulls(tmp_path):
    import pyarrow as pa

    old = pa.schema([f for f in EPISODE_SCHEMA if f.name != "tenant"])
    DatasetWriter(tmp_path, "baton.responses", old, A).write(0, [record(0)])
    w = DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA, A)
    rec = record(1)
    w.write(0, [type(rec)(rec.partition, rec.offset, {**rec.row, "tenant": "acme"}, rec.stamp_ms)])
    (merged,) = w.compact({0: 2}, 10_000_000)
    rows = open_dataset(tmp_path).to_table(columns=["request_id", "tenant"]).to_pylist()
    assert posixpath.basename(merged) == posixpath.basename(name(A, 0, 0, 1))
    assert rows == [{"request_id": "r0", "tenant": None}, {"request_id": "r1", "tenant": "acme"}]


def test_the_reader_keeps_the_widest_file_of_each_incarnation_and_partition():
    day, other = "/d/date=2025-11-24", "/d/date=2025-11-25"
    tag = incarnation_tag(A)
    paths = [f"{day}/t-{tag}-p0-000000000000-000000000005.parquet", f"{day}/t-{tag}-p0-000000000002-000000000003.parquet",
             f"{day}/t-{tag}-p0-000000000006-000000000006.parquet", f"{day}/t-{tag}-p1-000000000002-000000000003.parquet",
             f"{day}/t-p0-000000000002-000000000003.parquet", f"{other}/t-{tag}-p0-000000000002-000000000003.parquet",
             f"{day}/unrelated.parquet"]
    assert current_files(paths) == sorted(set(paths) - {f"{day}/t-{tag}-p0-000000000002-000000000003.parquet"})


# The glob README documents for DuckDB, and its query that counts a record once at any moment.
DUCKDB_GLOB = "{root}/date=*/*.parquet"
DUCKDB_ONCE = ("SELECT * FROM read_parquet('{glob}', hive_partitioning = true, filename = true) "
               "QUALIFY row_number() OVER (PARTITION BY regexp_extract(filename, '([^/]*)-p[0-9]+-[0-9]+-[0-9]+"
               "\\.parquet$', 1), source_partition, source_offset) = 1")


def test_duckdb_reads_the_compacted_layout_once_with_the_documented_glob(tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    w = DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA, A)
    for start in range(0, 6, 2):
        w.write(0, [record(o) for o in range(start, start + 2)])
    DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA, B).write(0, [record(o) for o in range(0, 2)])
    glob = DUCKDB_GLOB.format(root=tmp_path)
    deleted = []

    def crash_after_one(path, *args, **kwargs):
        if deleted:
            raise SystemExit("killed")
        deleted.append(path)
        return original(path, *args, **kwargs)

    original = w.fs.rm_file
    monkeypatch.setattr(w.fs, "rm_file", crash_after_one)
    with pytest.raises(SystemExit):
        w.compact({0: 6}, target_bytes=10_000_000)
    monkeypatch.undo()
    once = DUCKDB_ONCE.format(glob=glob)
    counted = duckdb.sql(f"SELECT request_id, count(*) FROM ({once}) GROUP BY ALL ORDER BY ALL").fetchall()
    assert counted == [("r0", 2), ("r1", 2), ("r2", 1), ("r3", 1), ("r4", 1), ("r5", 1)], \
        "each incarnation's record once, though the crash left a merged file and a small one"
    w.compact({0: 6}, target_bytes=10_000_000)
    plain = duckdb.sql(f"SELECT request_id, count(*) FROM read_parquet('{glob}', hive_partitioning = true) "
                       "GROUP BY ALL ORDER BY ALL").fetchall()
    assert plain == counted, "after the next compaction the plain glob reads each record once too"


def test_overlapping_files_below_the_commit_merge_into_one_row_per_record(tmp_path):
    import pyarrow as pa

    w = DatasetWriter(tmp_path, "baton.responses", EPISODE_SCHEMA, A)
    w.write(0, [record(o) for o in range(0, 4)])
    # Should two files of one partition ever overlap (none of the writer's paths leaves them), the
    # merge still writes each record once.
    overlap = pa.Table.from_pylist([record(o).row for o in range(2, 6)], schema=EPISODE_SCHEMA)
    w._put(overlap, f"{tmp_path}/{name(A, 0, 2, 5)}")
    (merged,) = w.compact({0: 6}, 10_000_000)
    assert files(tmp_path) == [name(A, 0, 0, 5)]
    rows = open_dataset(tmp_path).to_table(columns=["source_offset"]).column("source_offset").to_pylist()
    assert rows == list(range(6))
