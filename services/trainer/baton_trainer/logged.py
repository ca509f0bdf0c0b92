"""Logged episodes (the reward logger's Parquet dataset) as bandit feedback for the fast policy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from baton_policy.fastpolicy import Episode

from .episode_dataset import open_dataset


@dataclass(frozen=True)
class Logged:
    episode: Episode
    policy_version: str
    request_id: str


def read_feedback(root: str | Path) -> dict[str, float]:
    """The mean feedback score per response id (users' and the judge's), from the feedback/ directory."""
    dataset = open_dataset(root)
    if dataset is None:
        return {}
    scores: dict[str, list[float]] = {}
    for r in dataset.to_table(columns=["response_id", "score"]).to_pylist():
        scores.setdefault(r["response_id"], []).append(float(r["score"]))
    return {rid: sum(s) / len(s) for rid, s in scores.items()}


def read_episodes(root: str | Path, *, policy_backend: str = "policy",
                  feedback: Mapping[str, float] | None = None) -> list[Logged]:
    """Graded episodes a `policy` conductor chose, with the action and propensity it logged.
    `root` is the episodes/ directory or its URL (s3://bucket/prefix/episodes). An episode without a
    reference answer takes its quality from `feedback` (`read_feedback`), when it has some."""
    dataset = open_dataset(root)
    if dataset is None:
        return []
    # What the policy routed on; episodes logged before that column existed have the question only.
    query_col = "policy_query" if "policy_query" in dataset.schema.names else "query"
    cols = ["request_id", query_col, "metadata_json", "plan_backend", "plan_action", "plan_propensity",
            "plan_policy_version", "quality", "cost_usd", "plan_fallback"]
    table = dataset.to_table(columns=cols)
    out = []
    seen: set[str] = set()
    for r in table.to_pylist():
        if r["quality"] is None and feedback:
            r["quality"] = feedback.get(r["request_id"])
        if (r["plan_backend"] != policy_backend or r["quality"] is None or not r["plan_action"]
                or not r["plan_propensity"] or r["plan_fallback"] or r["request_id"] in seen):
            continue
        seen.add(r["request_id"])  # a redelivered response is one decision
        eval_name = json.loads(r["metadata_json"] or "{}").get("eval_name")
        out.append(Logged(Episode(r[query_col] or "", r["plan_action"], float(r["quality"]), float(r["plan_propensity"]),
                                  eval_name, float(r["cost_usd"])), r["plan_policy_version"], r["request_id"]))
    return out
