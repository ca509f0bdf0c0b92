"""Logged episodes (the reward logger's Parquet dataset) as bandit feedback for the fast policy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from baton_platform.dataset import open_dataset, with_string_column
from baton_policy.fastpolicy import Episode

# A rating counts for the episode whose request id and tenant it names: the gateway stamps each rating
# with its caller's tenant, so a key cannot steer training by rating another tenant's answers.
# Rows written before ratings named a tenant (None) join only episodes that name none either.
Owned = tuple[str, str | None]  # (request id, tenant)


@dataclass(frozen=True)
class Logged:
    episode: Episode
    policy_version: str
    request_id: str


def read_feedback(root: str | Path) -> dict[Owned, float]:
    """The mean feedback score (users' and the judge's) per response id and the tenant that gave it,
    from the feedback/ directory."""
    dataset = open_dataset(root)
    if dataset is None:
        return {}
    scores: dict[Owned, list[float]] = {}
    table = with_string_column(dataset, "tenant").to_table(columns=["response_id", "tenant", "score"])
    for r in table.to_pylist():
        scores.setdefault((r["response_id"], r["tenant"] or None), []).append(float(r["score"]))
    return {owned: sum(s) / len(s) for owned, s in scores.items()}


def read_episodes(root: str | Path, *, policy_backend: str = "policy",
                  feedback: Mapping[Owned, float] | None = None) -> list[Logged]:
    """Graded episodes a `policy` conductor chose, with the action and propensity it logged.
    `root` is the episodes/ directory or its URL (s3://bucket/prefix/episodes). An episode without a
    reference answer takes its quality from `feedback` (`read_feedback`): the ratings its own tenant gave."""
    dataset = open_dataset(root)
    if dataset is None:
        return []
    # What the policy routed on; episodes logged before that column existed have the question only.
    query_col = "policy_query" if "policy_query" in dataset.schema.names else "query"
    cols = ["request_id", query_col, "metadata_json", "plan_backend", "plan_action", "plan_propensity",
            "plan_policy_version", "quality", "cost_usd", "plan_fallback", "tenant"]
    table = with_string_column(dataset, "tenant").to_table(columns=cols)
    out = []
    seen: set[str] = set()
    for r in table.to_pylist():
        if r["quality"] is None and feedback:
            r["quality"] = feedback.get((r["request_id"], r["tenant"] or None))
        if (r["plan_backend"] != policy_backend or r["quality"] is None or not r["plan_action"]
                or not r["plan_propensity"] or r["plan_fallback"] or r["request_id"] in seen):
            continue
        seen.add(r["request_id"])  # a redelivered response is one decision
        eval_name = json.loads(r["metadata_json"] or "{}").get("eval_name")
        out.append(Logged(Episode(r[query_col] or "", r["plan_action"], float(r["quality"]), float(r["plan_propensity"]),
                                  eval_name, float(r["cost_usd"])), r["plan_policy_version"], r["request_id"]))
    return out
