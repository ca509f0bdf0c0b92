"""The one interface every conductor backend implements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from baton.v1 import requests_pb2
from baton_workflow import Plan

# An inner call's answer that keeps the answer so far (and the fallback when its plan is invalid).
KEEP = Plan(workers=[], subtasks=[], access=[])


@dataclass(frozen=True)
class Proposal:
    """A plan as the backend wrote it, before validation. `log_propensity` is None when unknown; given
    only a positive `propensity`, it is that probability's log."""

    plan: Plan
    policy_version: str = ""
    token_logprobs: list[float] = field(default_factory=list)
    propensity: float = 0.0
    action: str = ""
    log_propensity: float | None = None

    def __post_init__(self) -> None:
        if self.log_propensity is None and self.propensity > 0:
            object.__setattr__(self, "log_propensity", math.log(self.propensity))


class ConductorBackend(Protocol):
    name: str

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal: ...

    async def aclose(self) -> None: ...
