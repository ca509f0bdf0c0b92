"""What a policy decides for one query: the fitted policy (baton_policy.fastpolicy) and its online
heads for newcomers (baton_policy.newcomers) both answer with a `Choice`, and neither needs the other
to say so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    workflow: str  # the workflow's name
    workers: list[str]
    propensity: float  # the probability with which this workflow was picked, logged for off-policy learning
    kind: str = "single"  # the workflow's kind (baton_policy.templates.KINDS)
    value: float = 0.0  # the policy's value for it on this query
