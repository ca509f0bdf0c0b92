"""The reward logger's Parquet dataset, wherever it lives (a local directory or an fsspec URL): its
schemas, the row each record becomes, and the reader. The reward logger writes these rows to files;
the console also makes them from the records it follows live, so both make them here.

`s3://bucket/prefix/episodes` is read with s3fs, which finds its endpoint and credentials as botocore
does (`AWS_ENDPOINT_URL_S3` for an S3-compatible store, `AWS_ACCESS_KEY_ID`, an IAM role, ...).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
from google.protobuf.json_format import MessageToDict

from baton.v1 import feedback_pb2, responses_pb2
from baton_workflow import policy_query


def locate(root: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path on it; a plain path stays relative to the working directory."""
    return fsspec.core.url_to_fs(os.fspath(root))


# A file's name: `<topic>[-<incarnation>]-p<partition>-<first offset>-<last offset>.parquet`.
_FILE_NAME = re.compile(r"(.+)-p(\d+)-(\d+)-(\d+)\.parquet")


def current_files(paths: list[str]) -> list[str]:
    """`paths` without the files another one supersedes: one whose offsets lie inside another's of the
    same folder, topic, incarnation and partition. The reward logger writes a merged or replacing file
    before it deletes the files it replaces, so for a moment (or, after a crash, until its next
    compaction) both exist; a reader keeps the wider one and sees each record once."""
    ranges: dict[tuple[str, str, int], list[tuple[int, int, str]]] = {}
    kept = []
    for p in paths:
        found = _FILE_NAME.fullmatch(posixpath.basename(p))
        if found is None:
            kept.append(p)
            continue
        stem, partition, first, last = found.groups()
        ranges.setdefault((posixpath.dirname(p), stem, int(partition)), []).append((int(first), -int(last), p))
    for files in ranges.values():
        widest = -1
        for _first, minus_last, p in sorted(files):
            if -minus_last > widest:
                kept.append(p)
                widest = -minus_last
    return sorted(kept)


def open_dataset(root: str | os.PathLike) -> ds.Dataset | None:
    """The hive-partitioned (date=...) Parquet files under `root`, but those another supersedes
    (`current_files`); None while there are none."""
    fs, path = locate(root)
    # One listing, handed to pyarrow, instead of a second discovery walk (each is a LIST on S3).
    # A name starting with "." is a file the reward logger is still writing on a local disk.
    files = current_files([p for p in fs.find(path)
                           if p.endswith(".parquet") and not posixpath.basename(p).startswith((".", "_"))])
    if not files:
        return None
    return ds.dataset(files, filesystem=fs, format="parquet", partitioning="hive", partition_base_dir=path)


def with_string_column(dataset: ds.Dataset, name: str) -> ds.Dataset:
    """`dataset` with a string column `name`, null in the files written before it existed (the schema
    is the first file's, so a column added later is otherwise not read at all)."""
    if name in dataset.schema.names:
        return dataset
    return dataset.replace_schema(dataset.schema.append(pa.field(name, pa.string())))


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
class Reward:
    """An episode's grade: the grader and reference of the evaluation item it answered, its quality
    and reward, and why (all None but `detail` when it was not graded)."""

    grader: str | None
    reference: str | None
    quality: float | None
    reward: float | None
    detail: str


UNGRADED = Reward(None, None, None, None, "not graded yet")


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
