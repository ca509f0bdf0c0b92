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
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from google.protobuf.json_format import MessageToDict

from baton.v1 import feedback_pb2, responses_pb2
from baton_reward_logger.rewards import Reward
from baton_workflow import policy_query

STEP = pa.struct([
    ("step", pa.int32()), ("worker", pa.string()), ("model", pa.string()), ("attempt", pa.int32()),
    ("instruction", pa.string()), ("output", pa.string()), ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()), ("cost_usd", pa.float64()), ("latency_ms", pa.float64()),
    ("error", pa.string()), ("inner_plan_json", pa.string()),
])

EPISODE_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("group_id", pa.string()), ("candidate", pa.int32()), ("group_size", pa.int32()),
    ("policy", pa.string()), ("created_unix_ms", pa.int64()),
    ("completed_unix_ms", pa.int64()), ("query", pa.string()), ("policy_query", pa.string()),
    ("messages_json", pa.string()),
    ("metadata_json", pa.string()), ("plan_backend", pa.string()), ("plan_policy_version", pa.string()),
    ("plan_fallback", pa.bool_()), ("plan_invalid_reason", pa.string()), ("plan_json", pa.string()),
    ("plan_token_logprobs", pa.list_(pa.float32())), ("plan_propensity", pa.float64()), ("plan_action", pa.string()),
    ("steps", pa.list_(STEP)), ("answer", pa.string()), ("error_code", pa.string()), ("error_message", pa.string()),
    ("input_tokens", pa.int64()), ("output_tokens", pa.int64()), ("cost_usd", pa.float64()), ("calls", pa.int32()),
    ("latency_ms", pa.float64()), ("grader", pa.string()), ("reference", pa.string()), ("quality", pa.float64()),
    ("reward", pa.float64()), ("reward_detail", pa.string()), ("judge_json", pa.string()),
    ("source_partition", pa.int32()), ("source_offset", pa.int64()), ("tenant", pa.string()),
])

FEEDBACK_SCHEMA = pa.schema([
    ("response_id", pa.string()), ("score", pa.float64()), ("comment", pa.string()), ("source", pa.string()),
    ("created_unix_ms", pa.int64()), ("source_partition", pa.int32()), ("source_offset", pa.int64()),
    ("tenant", pa.string()),
])


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    row: dict
    stamp_ms: int


def episode_row(r: responses_pb2.Response, reward: Reward, partition: int, offset: int) -> dict:
    ep = r.episode
    req = ep.request
    query = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
    return {
        "request_id": r.request_id, "group_id": req.group_id or r.request_id, "candidate": req.candidate,
        "group_size": req.group_size or 1, "policy": req.policy, "created_unix_ms": req.created_unix_ms,
        "completed_unix_ms": r.completed_unix_ms, "query": query,
        "policy_query": policy_query(query, [t.name for t in req.answer.tools], req.answer.response_format),
        "messages_json": json.dumps([{"role": m.role, "content": m.content} for m in req.messages]),
        "metadata_json": json.dumps(dict(req.metadata), sort_keys=True),
        "plan_backend": ep.plan.backend, "plan_policy_version": ep.plan.policy_version,
        "plan_fallback": ep.plan.fallback, "plan_invalid_reason": ep.plan.invalid_reason,
        "plan_json": json.dumps(MessageToDict(ep.plan, preserving_proto_field_name=True).get("steps", [])),
        "plan_token_logprobs": list(ep.plan.token_logprobs), "plan_propensity": ep.plan.propensity,
        "plan_action": ep.plan.action,
        "steps": [{"step": s.step, "worker": s.worker, "model": s.model, "attempt": s.attempt,
                   "instruction": s.instruction, "output": s.output, "input_tokens": s.usage.input_tokens,
                   "output_tokens": s.usage.output_tokens, "cost_usd": s.usage.cost_usd,
                   "latency_ms": s.latency_ms, "error": s.error.message or None,
                   "inner_plan_json": _json(s.inner_plan) if s.HasField("inner_plan") else None} for s in ep.steps],
        "answer": r.answer if r.WhichOneof("outcome") == "answer" else None,
        "error_code": r.error.code or None, "error_message": r.error.message or None,
        "input_tokens": ep.total.input_tokens, "output_tokens": ep.total.output_tokens,
        "cost_usd": ep.total.cost_usd, "calls": ep.total.calls, "latency_ms": ep.latency_ms,
        "grader": reward.grader, "reference": reward.reference, "quality": reward.quality, "reward": reward.reward,
        "reward_detail": reward.detail, "judge_json": _json(ep.judge) if ep.HasField("judge") else None,
        "source_partition": partition, "source_offset": offset, "tenant": req.tenant or None,
    }


def _json(message) -> str:
    return json.dumps(MessageToDict(message, preserving_proto_field_name=True), sort_keys=True)


def feedback_row(fb: feedback_pb2.Feedback, partition: int, offset: int) -> dict:
    return {"response_id": fb.response_id, "score": fb.score, "comment": fb.comment, "source": fb.source or "user",
            "created_unix_ms": fb.created_unix_ms, "source_partition": partition, "source_offset": offset,
            "tenant": fb.tenant or None}


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
