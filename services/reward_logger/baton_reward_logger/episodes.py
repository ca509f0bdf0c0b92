"""The datasets: Parquet files named by the records they hold, written exactly once.

Episodes (one row per final response) go to `<dir>/episodes/`, user feedback (reward records that
join episodes on `request_id` = `response_id`) to `<dir>/feedback/`. Layout:
`<dir>/<dataset>/date=YYYY-MM-DD/<topic>-p<partition>-<first offset>-<last offset>.parquet`.
`<dir>` is a local directory or an fsspec URL (s3://bucket/prefix in production, memory://x in tests).
A reader never sees half a file: on a local disk the file is written to a temporary name, synced,
then renamed; on an object store it is written whole in one PUT, which the store publishes
atomically. When a partition is re-read after a crash, the new file starts at the same offset as
the one written before the crash and replaces it, so the dataset never holds a record twice.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
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


# What pyarrow raises for a value its column's type cannot hold.
ARROW_REFUSALS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class RowsRefused(Exception):
    """The dataset's schema cannot hold a row of the batch; nothing was written."""


class DatasetWriter:
    def __init__(self, root: str | os.PathLike, topic: str, schema: pa.Schema) -> None:
        # A plain path resolves against the working directory, as it always has; a URL picks its
        # filesystem. s3fs finds its endpoint and credentials as botocore does (AWS_ENDPOINT_URL_S3,
        # AWS_ACCESS_KEY_ID, an IAM role, ...), so nothing S3-specific lives in Baton's config.
        self.fs, self.root = fsspec.core.url_to_fs(os.fspath(root))
        self.local = isinstance(self.fs, LocalFileSystem)
        self.topic = topic
        self.schema = schema
        # Per partition, the files written before this replica took it over that a later run of
        # records may replace (named by a first offset at or past the run it was taken over at), or
        # no entry when the partition has not been listed since. Listing once per assignment, not
        # per file, keeps a write's cost flat however many files the dataset holds.
        self._leftovers: dict[int, dict[int, list[str]]] = {}

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

    def write(self, partition: int, records: list[Record]) -> str:
        """Durably write one partition's contiguous run of records; return the file's path or URL."""
        first, last = records[0].offset, records[-1].offset
        day = dt.datetime.fromtimestamp(records[0].stamp_ms / 1000, dt.UTC).date().isoformat()
        final = f"{self.root}/date={day}/{self.topic}-p{partition}-{first:012d}-{last:012d}.parquet"
        try:
            table = pa.Table.from_pylist([r.row for r in records], schema=self.schema)
        except ARROW_REFUSALS as e:
            raise RowsRefused(str(e)) from e
        replaced = self._replaced(partition, first, last, day)
        if self.local:
            self._write_local(table, Path(final))
        else:
            buffer = pa.BufferOutputStream()
            pq.write_table(table, buffer)
            # An object store has no atomic rename (S3 copies then deletes), but it publishes a PUT
            # whole or not at all: write the final name in one call, and the file is durable once it returns.
            self.fs.pipe_file(final, buffer.getvalue().to_pybytes())
            final = self.fs.unstrip_protocol(final)
        # Only now that the new file is durable: a reader meanwhile sees a record twice at worst,
        # never none, and a crash in between leaves the old file for the re-read to replace.
        known = self._leftovers[partition]
        for start, paths in replaced.items():
            for old in paths:
                if posixpath.basename(old) != posixpath.basename(final) and self.fs.exists(old):
                    self.fs.rm_file(old)
            known.pop(start, None)
        return final

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

    def _replaced(self, partition: int, first: int, last: int, day: str) -> dict[int, list[str]]:
        """Files written before a crash or a move that start inside this run, by first offset: they hold
        records this file now has (or that the rest of the re-read writes again), so they go once it
        is durable."""
        known = self._leftovers.get(partition)
        if known is None:
            known = self._leftovers[partition] = self._list(partition, first, day)
        for start in [s for s in known if s < first]:
            del known[start]  # behind this run: a later run cannot replace them either
        return {start: list(paths) for start, paths in known.items() if start <= last}

    def _list(self, partition: int, first: int, day: str) -> dict[int, list[str]]:
        # Such a file is named by its first record, one at or past this run's first, so it lies in the
        # folder of this run's first day or a later one (a run rarely spans midnight). List afresh,
        # not from a cached listing: another replica may have owned this partition.
        self.fs.invalidate_cache(self.root)
        prefix = f"{self.topic}-p{partition}-"
        found: dict[int, list[str]] = {}
        folders = [f for f in self.fs.glob(f"{self.root}/date=*") if posixpath.basename(f) >= f"date={day}"]
        for path in (path for folder in folders for path in self.fs.ls(folder, detail=False)):
            name = posixpath.basename(path)
            if name.startswith(prefix) and name.endswith(".parquet") and int(name.split("-")[-2]) >= first:
                found.setdefault(int(name.split("-")[-2]), []).append(path)
        return found
