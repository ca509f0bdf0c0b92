"""The shape a conductor model writes, as a bounded schema for constrained decoding, and its parser.

The model writes the Conductor paper's three lists and names workers by their index in the pool:

    {"model_id": [1, 0], "subtasks": ["...", "..."], "access_list": [[], [0]]}

Two constraints are derived from the same bounds:

- a JSON schema (from a pydantic model) for servers that take `response_format` or vLLM's
  `StructuredOutputsParams(json=...)`. JSON Schema cannot say that the three lists have one length,
  nor that a step reads only earlier steps, so plans decoded under it can still fail validation.
- an EBNF grammar for xgrammar with one alternative per plan length, which enforces both. Without
  bounds a small model writes until `max_new_tokens` and the JSON is cut off, so every string and
  list is bounded in both; given a token budget, the grammar also shortens the instructions of
  longer plans so that its longest text fits the budget, and no plan can be cut off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from baton_workflow import Plan

PLAN_KEYS = ("model_id", "subtasks", "access_list")


# The file `baton-trainer grpo` writes beside a LoRA adapter's weights, naming among others the worker
# pool the adapter was trained for; the router refuses an adapter trained for another pool.
ADAPTER_MANIFEST = "baton_grpo.json"


class ConductorOutputError(ValueError):
    """The conductor's text is not a plan. Carries what was sampled so the episode can still be logged."""

    def __init__(self, message: str, text: str = "", token_logprobs: list[float] | None = None,
                 propensity: float = 0.0, policy_version: str = "") -> None:
        super().__init__(message)
        self.text = text
        self.token_logprobs = list(token_logprobs or [])
        self.propensity = propensity
        self.log_propensity: float | None = None
        self.policy_version = policy_version


@dataclass(frozen=True)
class PlanBounds:
    """Everything the schema and the grammar depend on."""

    pool_size: int
    max_steps: int
    max_subtask_chars: int = 160
    # When set, the grammar shortens instructions in longer plans so that its longest text fits in
    # this many tokens: a plan can then never be cut off by the token limit (see `subtask_limits`).
    token_budget: int | None = None
    # Admit three empty lists: an inner call (the conductor named as a step) keeping the answer.
    allow_empty: bool = False

    def __post_init__(self) -> None:
        if self.pool_size < 1:
            raise ValueError("the worker pool is empty")
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_subtask_chars < 1:
            raise ValueError("max_subtask_chars must be at least 1")


def plan_model(bounds: PlanBounds) -> type[BaseModel]:
    """A pydantic model of the conductor's output with every length bounded."""
    model_id = Annotated[int, Field(ge=0, le=bounds.pool_size - 1)]
    subtask = Annotated[str, Field(min_length=1, max_length=bounds.max_subtask_chars)]
    # A step may read at most the steps before it, so an access list has at most max_steps - 1 entries.
    earlier = Annotated[int, Field(ge=0, le=max(bounds.max_steps - 2, 0))]
    access = Literal["all"] | Annotated[list[earlier], Field(max_length=bounds.max_steps - 1)]
    steps: dict[str, Any] = {"min_length": 0 if bounds.allow_empty else 1, "max_length": bounds.max_steps}
    return create_model(
        "ConductorPlan",
        __config__=ConfigDict(extra="forbid"),
        model_id=(list[model_id], Field(description="Model number (index in the pool) per step.", **steps)),
        subtasks=(list[subtask], Field(description="Instruction per step.", **steps)),
        access_list=(list[access], Field(
            description='Per step: the earlier steps whose outputs it reads ([] none, or "all").', **steps)),
    )


def plan_json_schema(bounds: PlanBounds) -> dict:
    """The JSON schema that drives `response_format` / `StructuredOutputsParams(json=...)`."""
    return plan_model(bounds).model_json_schema()


def _alternatives(values: list[str]) -> str:
    return " | ".join(json.dumps(v) for v in values)


def _skeleton_chars(k: int, pool_size: int) -> int:
    """Characters of the longest k-step plan text apart from its instructions' contents."""
    model = len(str(pool_size - 1))
    accesses = [2] + [max(len('"all"'), len(", ".join(str(i - 1) for _ in range(i))) + 2) for i in range(1, k)]
    fixed = len('{"model_id": [], "subtasks": [], "access_list": []}')
    separators = 3 * 2 * (k - 1)  # ", " between the k entries of each list
    return fixed + separators + k * model + k * 2 + sum(accesses)  # 2: the quotes around each instruction


def subtask_limits(bounds: PlanBounds) -> dict[int, int]:
    """Plan length -> longest instruction the grammar allows, for every plan length that fits.

    With a token budget, instructions are printable ASCII, so every token covers at least one
    character and a plan of k steps takes at most skeleton(k) + k * limit tokens, plus end of text.
    """
    limits = {}
    for k in range(1, bounds.max_steps + 1):
        limit = bounds.max_subtask_chars
        if bounds.token_budget is not None:
            limit = min(limit, (bounds.token_budget - 1 - _skeleton_chars(k, bounds.pool_size)) // k)
        if limit >= 1:
            limits[k] = limit
    if not limits:
        raise ValueError(f"a token budget of {bounds.token_budget} is too small for even a one-step plan")
    return limits


def plan_grammar(bounds: PlanBounds) -> str:
    """An xgrammar EBNF grammar for plans of 1..max_steps steps whose lists have equal length and
    whose access lists name only earlier steps.

    The text is exactly what `render_plan` writes (one space after separators); instructions start
    with a visible character and need no escapes (no quotes, backslashes or control characters). With
    a token budget they are printable ASCII and shorter in longer plans (`subtask_limits`).
    """
    w = bounds.pool_size
    limits = subtask_limits(bounds)
    if bounds.token_budget is None:
        first, rest = r'[^"\\\x00-\x20]', r'[^"\\\x00-\x1f]'
    else:
        first, rest = r'[!#-\[\]-~]', r'[ !#-\[\]-~]'
    n = max(limits)
    lengths = ([0] if bounds.allow_empty else []) + sorted(limits)
    rules = [
        "root ::= " + " | ".join(f"plan{k}" for k in lengths),
        f"model ::= {_alternatives([str(i) for i in range(w)])}",
        'access0 ::= "[]"',
    ]
    for chars in sorted(set(limits.values())):
        rules.append(f'subtask{chars} ::= "\\"" {first} {rest}{{0,{chars - 1}}} "\\""')
    for i in range(1, n):
        rules.append(f"step{i} ::= {_alternatives([str(j) for j in range(i)])}")
        # No empty repetition for step 1 (`{0,0}`): vLLM's guidance backend refuses the grammar with one.
        more = f' ("," " " step{i}){{0,{i - 1}}}' if i > 1 else ""
        rules.append(f'access{i} ::= "[]" | "\\"all\\"" | "[" step{i}{more} "]"')
    if bounds.allow_empty:
        rules.append('plan0 ::= "{\\"model_id\\": [], \\"subtasks\\": [], \\"access_list\\": []}"')
    for k in sorted(limits):
        models = ' ", " '.join(["model"] * k)
        tasks = ' ", " '.join([f"subtask{limits[k]}"] * k)
        accesses = ' ", " '.join(f"access{i}" for i in range(k))
        rules.append(
            f'plan{k} ::= "{{\\"model_id\\": [" {models} "], \\"subtasks\\": [" {tasks} '
            f'"], \\"access_list\\": [" {accesses} "]}}"'
        )
    return "\n".join(rules) + "\n"


def render_plan(model_ids: list[int], subtasks: list[str], access: list) -> str:
    """The canonical text of a plan, as the grammar spells it (used for the prompt's example)."""
    return json.dumps({"model_id": model_ids, "subtasks": subtasks, "access_list": access}, ensure_ascii=False)


def parse_plan(text: str, worker_names: list[str], bounds: PlanBounds) -> Plan:
    """The conductor's JSON as a Plan with worker names; ConductorOutputError when it is not one.

    Only the shape and the bounds are checked here. Equal lengths, step count and earlier-only access
    are the planner's to judge (with `plan_problems`), so a plan that breaks them is still returned
    and its failure is counted there.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConductorOutputError(f"conductor output is not JSON ({e.msg} at {e.pos}): {text[:200]!r}",
                                   text=text) from None
    if not isinstance(data, dict):
        raise ConductorOutputError(f"conductor output is not a JSON object: {text[:200]!r}", text=text)
    lengths = {k: len(v) for k, v in data.items() if k in PLAN_KEYS and isinstance(v, list)}
    relaxed = PlanBounds(bounds.pool_size, max(bounds.max_steps, *lengths.values(), 1), bounds.max_subtask_chars,
                         allow_empty=bounds.allow_empty)
    try:
        parsed: Any = plan_model(relaxed).model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'plan'}: {err['msg']}" for err in e.errors())
        raise ConductorOutputError(f"conductor output does not fit the plan schema: {problems}", text=text) from None
    return Plan(
        workers=[worker_names[i] for i in parsed.model_id],
        subtasks=list(parsed.subtasks),
        access=[a if a == "all" else list(a) for a in parsed.access_list],
    )
