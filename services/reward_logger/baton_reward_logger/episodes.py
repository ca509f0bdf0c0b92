"""The datasets: Parquet files named by the records they hold, written exactly once.

Episodes (one row per final response) go to `<dir>/episodes/`, user feedback (reward records that
join episodes on `request_id` = `response_id`) to `<dir>/feedback/`. Layout:
`<dir>/<dataset>/date=YYYY-MM-DD/<topic>-<incarnation>-p<partition>-<first offset>-<last offset>.parquet`.
`<incarnation>` is 12 hex digits naming the topic's incarnation (a hash of the Kafka cluster's id and
the topic's id): a topic created again, or the same topic on another cluster, counts its offsets from
0 again, and its files must neither overwrite nor replace the earlier incarnation's. Files written
before names held it (`<topic>-p<partition>-...`) are still read, and are never replaced or compacted.
`<dir>` is a local directory or an fsspec URL (s3://bucket/prefix in production, memory://x in tests).
A reader never sees half a file: on a local disk the file is written to a temporary name, synced,
then renamed; on an object store it is written whole in one PUT, which the store publishes
atomically. When a partition is re-read after a crash, the new file starts at the same offset as
the one written before the crash and replaces it, so the dataset never holds a record twice; records
a file of the same incarnation already holds (a re-read of offsets that were compacted or committed
already) are dropped from the new file instead.

Compaction (`compact`) merges a partition's small files of one day into files of about a target size.
It takes only files wholly below the partition's committed offset: a re-read starts at that offset,
so it never replaces them, and the merged file, named by the first and last offsets it covers, is to
every later write what the small files were. The merged file is durable before the small files go;
a file whose offsets lie inside another file's of the same incarnation and partition is superseded,
and `baton_platform.dataset.open_dataset` skips it, so a reader does not see its rows twice between
the two steps or after a crash between them (the next compaction deletes it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    row: dict
    stamp_ms: int


@dataclass(frozen=True)
class Written:
    """A file of this writer's topic and incarnation: the partition and offsets it holds."""

    path: str
    partition: int
    first: int
    last: int


# What pyarrow raises for a value its column's type cannot hold.
ARROW_REFUSALS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class RowsRefused(Exception):
    """The dataset's schema cannot hold a row of the batch; nothing was written."""


def incarnation_tag(identity: str) -> str:
    """The 12 hex digits a file name holds for a topic's incarnation (`cluster id/topic id`)."""
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


class DatasetWriter:
    def __init__(self, root: str | os.PathLike, topic: str, schema: pa.Schema, incarnation: str | None = None) -> None:
        # A plain path resolves against the working directory, as it always has; a URL picks its
        # filesystem. s3fs finds its endpoint and credentials as botocore does (AWS_ENDPOINT_URL_S3,
        # AWS_ACCESS_KEY_ID, an IAM role, ...), so nothing S3-specific lives in Baton's config.
        self.fs, self.root = fsspec.core.url_to_fs(os.fspath(root))
        self.local = isinstance(self.fs, LocalFileSystem)
        self.topic = topic
        self.schema = schema
        self.incarnation: str | None = None
        self._name = re.compile("")
        self.identify(incarnation)
        # Per partition, the files of this incarnation a later run of records may meet, as listed when
        # this replica took the partition over: those starting at or past the run it was taken over at
        # (a re-read replaces them) and the one holding that run's first offset (a re-read drops what
        # it holds), or no entry when the partition has not been listed since. Listing once per
        # assignment, not per file, keeps a write's cost flat however many files the dataset holds.
        self._leftovers: dict[int, list[Written]] = {}

    def identify(self, incarnation: str | None) -> None:
        """Name files by the topic's incarnation (`cluster id/topic id`; None: the names of old, without one)."""
        self.incarnation = incarnation
        self._stem = self.topic if incarnation is None else f"{self.topic}-{incarnation_tag(incarnation)}"
        self._name = re.compile(re.escape(self._stem) + r"-p(\d+)-(\d+)-(\d+)\.parquet")
        self._leftovers = {}

    def parse(self, path: str) -> Written | None:
        """The file at `path` if it is one of this topic and incarnation's, else None."""
        found = self._name.fullmatch(posixpath.basename(path))
        return None if found is None else Written(path, *(int(g) for g in found.groups()))

    def expire(self, keep_days: int, today: dt.date | None = None) -> list[str]:
        """Delete the day folders older than `keep_days` days (today's counts as one); returns them.
        Safe from any replica at any time: a folder is only ever written for its own records' day."""
        today = today or dt.datetime.now(dt.UTC).date()
        oldest_kept = f"date={(today - dt.timedelta(days=keep_days - 1)).isoformat()}"
        self.fs.invalidate_cache(self.root)
        old = [f for f in self.fs.glob(f"{self.root}/date=*") if posixpath.basename(f) < oldest_kept]
        for folder in old:
            self.fs.rm(folder, recursive=True)
        return old

    def forget(self, partition: int) -> None:
        """The partition moved (to another replica, or back here): list it again before replacing files."""
        self._leftovers.pop(partition, None)

    def write(self, partition: int, records: list[Record]) -> str | None:
        """Durably write one partition's contiguous run of records; return the file's path or URL, or
        None when a file of this incarnation already holds every record of the run."""
        first, last = records[0].offset, records[-1].offset
        day = dt.datetime.fromtimestamp(records[0].stamp_ms / 1000, dt.UTC).date().isoformat()
        known = self._known(partition, first, day)
        held = max((w.last for w in known if w.first < first <= w.last), default=-1)
        if held >= first:  # already in the dataset (re-read after a commit was lost): not twice
            records = [r for r in records if r.offset > held]
            if not records:
                self._leftovers[partition] = [w for w in known if w.last > last]
                return None
            first = records[0].offset
            day = dt.datetime.fromtimestamp(records[0].stamp_ms / 1000, dt.UTC).date().isoformat()
        final = self._path(day, partition, first, last)
        try:
            table = pa.Table.from_pylist([r.row for r in records], schema=self.schema)
        except ARROW_REFUSALS as e:
            raise RowsRefused(str(e)) from e
        # Files written before a crash or a move that start inside this run: they hold records this
        # file now has (or that the rest of the re-read writes again), so they go once it is durable.
        replaced = [w for w in known if first <= w.first <= last]
        final = self._put(table, final)
        # Only now that the new file is durable: a reader meanwhile sees a record twice at worst,
        # never none, and a crash in between leaves the old file for the re-read to replace.
        for old in replaced:
            if posixpath.basename(old.path) != posixpath.basename(final) and self.fs.exists(old.path):
                self.fs.rm_file(old.path)
        self._leftovers[partition] = [w for w in known if w not in replaced and w.last > last]
        return final

    def compact(self, committed: dict[int, int], target_bytes: int) -> list[str]:
        """Merge the small files of the partitions in `committed` (partition: its committed offset) that
        lie wholly below that offset, per day folder, into files of about `target_bytes`; returns the
        files written. Call it only for partitions this replica owns: only their owner knows their
        files are committed, and two replicas merging the same files would write overlapping ones."""
        self.fs.invalidate_cache(self.root)
        found: dict[tuple[str, int], list[tuple[Written, int]]] = {}
        for path, info in self.fs.find(self.root, detail=True).items():
            w = self.parse(path)
            if w is not None and w.partition in committed and w.last < committed[w.partition]:
                found.setdefault((posixpath.dirname(path), w.partition), []).append((w, int(info.get("size") or 0)))
        made = []
        for (folder, partition), files in sorted(found.items()):
            files = self._drop_superseded(sorted(files, key=lambda f: (f[0].first, -f[0].last)))
            group: list[Written] = []
            size = 0
            for w, n in [*files, (None, 0)]:
                if w is not None and (not group or size + n <= target_bytes):
                    group.append(w)
                    size += n
                    continue
                if len(group) > 1:
                    made.append(self._merge(folder, partition, group))
                group, size = ([w], n) if w is not None else ([], 0)
        return made

    def _drop_superseded(self, files: list[tuple[Written, int]]) -> list[tuple[Written, int]]:
        """Delete the files whose offsets lie inside an earlier one's (left by a crash between a merged
        file and the deletion of what it merged); `files` is sorted by first offset, longest first."""
        kept: list[tuple[Written, int]] = []
        for w, n in files:
            if kept and w.last <= kept[-1][0].last:
                self.fs.rm_file(w.path)
            else:
                kept.append((w, n))
        return kept

    def _merge(self, folder: str, partition: int, group: list[Written]) -> str:
        tables = []
        for w in group:
            with self.fs.open(w.path, "rb") as f:
                t = pq.read_table(f)
            # A file written before a column existed lacks it: null there, as readers see it.
            columns = [t.column(c.name).cast(c.type) if c.name in t.column_names else pa.nulls(len(t), c.type)
                       for c in self.schema]
            tables.append(pa.Table.from_arrays(columns, schema=self.schema))
        table = pa.concat_tables(tables)
        if "source_offset" in table.column_names:  # overlapping files, should any be left: each record once
            offsets = table.column("source_offset").to_pylist()
            first_row: dict[int, int] = {}
            for i, offset in enumerate(offsets):
                first_row.setdefault(offset, i)
            if len(first_row) < len(offsets):
                table = table.take(sorted(first_row.values()))
        final = f"{folder}/{self._stem}-p{partition}-{group[0].first:012d}-{max(w.last for w in group):012d}.parquet"
        self._put(table, final)
        for w in group:  # only once the merged file is durable
            self.fs.rm_file(w.path)
        return final

    def _path(self, day: str, partition: int, first: int, last: int) -> str:
        return f"{self.root}/date={day}/{self._stem}-p{partition}-{first:012d}-{last:012d}.parquet"

    def _put(self, table: pa.Table, final: str) -> str:
        """Write `table` durably at `final`, all or nothing; returns its path or URL."""
        if self.local:
            self._write_local(table, Path(final))
            return final
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        # An object store has no atomic rename (S3 copies then deletes), but it publishes a PUT
        # whole or not at all: write the final name in one call, and the file is durable once it returns.
        self.fs.pipe_file(final, buffer.getvalue().to_pybytes())
        return self.fs.unstrip_protocol(final)

    def _write_local(self, table: pa.Table, final: Path) -> None:
        folder = final.parent
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{final.name}.tmp"
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk: free what the attempt took
            raise
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _known(self, partition: int, first: int, day: str) -> list[Written]:
        known = self._leftovers.get(partition)
        if known is None:
            known = self._leftovers[partition] = self._list(partition, first, day)
        return known

    def _list(self, partition: int, first: int, day: str) -> list[Written]:
        # A file this run may meet holds an offset at or past this run's first, so it lies in the folder
        # of this run's first day or a later one, or the day before when a run spanned midnight. List
        # afresh, not from a cached listing: another replica may have owned this partition.
        self.fs.invalidate_cache(self.root)
        since = f"date={(dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()}"
        folders = [f for f in self.fs.glob(f"{self.root}/date=*") if posixpath.basename(f) >= since]
        found = (self.parse(path) for folder in folders for path in self.fs.ls(folder, detail=False))
        return sorted((w for w in found if w is not None and w.partition == partition and w.last >= first),
                      key=lambda w: w.first)
