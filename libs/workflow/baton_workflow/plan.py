"""The workflow a conductor writes, and the rules every plan must satisfy before it runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from baton.v1 import workflow_pb2

Access = Literal["all"] | list[int]

# The reserved worker name of the conductor itself. A step given to it goes to no provider: the
# conductor is asked again, with the workflow so far, and keeps or corrects the answer.
CONDUCTOR = "conductor"


class Plan(BaseModel):
    """The Conductor paper's shape: three equal-length lists, one entry per step."""

    model_config = ConfigDict(extra="forbid")

    workers: list[str] = Field(description="Worker name per step.")
    subtasks: list[str] = Field(description="Instruction per step.")
    access: list[Access] = Field(description="Per step: [] none, earlier step indices, or 'all'.")

    @property
    def steps(self) -> int:
        return len(self.workers)


def plan_problems(plan: Plan, known_workers: Sequence[str], max_steps: int, *, allow_empty: bool = False) -> list[str]:
    """Everything wrong with `plan`; an empty list means it may run. `allow_empty` admits a plan with
    no steps (an inner conductor call keeping the answer it was shown)."""
    problems: list[str] = []
    n = len(plan.workers)
    if not (n == len(plan.subtasks) == len(plan.access)):
        problems.append(
            f"workers, subtasks and access differ in length ({n}, {len(plan.subtasks)}, {len(plan.access)})"
        )
        return problems
    if n == 0 and not allow_empty:
        problems.append("the plan has no steps")
    if n > max_steps:
        problems.append(f"the plan has {n} steps; at most {max_steps} are allowed")
    known = set(known_workers)
    for i, (worker, task, access) in enumerate(zip(plan.workers, plan.subtasks, plan.access)):
        if worker not in known:
            problems.append(f"step {i}: unknown worker {worker!r}")
        if not task.strip():
            problems.append(f"step {i}: empty instruction")
        if access != "all":
            for j in access:
                if not 0 <= j < i:
                    problems.append(f"step {i}: access to step {j} is not an earlier step")
    return problems


def readable_steps(access: Access, step: int) -> list[int]:
    """The earlier steps a step may read, in order."""
    if access == "all":
        return list(range(step))
    return sorted({j for j in access if 0 <= j < step})


def to_proto(plan: Plan, *, backend: str, policy_version: str = "", fallback: bool = False,
             invalid_reason: str = "", token_logprobs: Sequence[float] = (), propensity: float = 0.0,
             action: str = "", log_propensity: float | None = None) -> workflow_pb2.Plan:
    out = workflow_pb2.Plan(
        action=action,
        backend=backend,
        policy_version=policy_version,
        fallback=fallback,
        invalid_reason=invalid_reason,
        token_logprobs=list(token_logprobs),
        propensity=propensity,
    )
    if log_propensity is not None:  # absent means unknown; any number, -inf to 0, is a known one
        out.log_propensity = log_propensity
    for worker, task, access in zip(plan.workers, plan.subtasks, plan.access):
        step = out.steps.add(worker=worker, instruction=task)
        if access == "all":
            step.access.all = True
        else:
            step.access.steps.extend(access)
    return out


def from_proto(plan: workflow_pb2.Plan) -> Plan:
    return Plan(
        workers=[s.worker for s in plan.steps],
        subtasks=[s.instruction for s in plan.steps],
        access=["all" if s.access.all else list(s.access.steps) for s in plan.steps],
    )
