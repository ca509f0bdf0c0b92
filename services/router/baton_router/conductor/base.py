"""The one interface every conductor backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from baton.v1 import requests_pb2
from baton_workflow import Plan


# An inner call's answer that keeps the answer so far (and the fallback when its plan is invalid).
KEEP = Plan(workers=[], subtasks=[], access=[])


@dataclass(frozen=True)
class Proposal:
    """A plan as the backend wrote it, before validation."""

    plan: Plan
    policy_version: str = ""
    token_logprobs: list[float] = field(default_factory=list)
    propensity: float = 0.0
    action: str = ""


class ConductorBackend(Protocol):
    name: str

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal: ...

    async def aclose(self) -> None: ...
