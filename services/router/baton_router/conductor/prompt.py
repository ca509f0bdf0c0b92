"""The conductor's prompt: the user's question and the worker pool, shown as capability cards by index.

Workers appear only as "Model <i>: <card>", never by name or brand, so the conductor judges them by
what their cards say and a worker is added to the pool by writing its card. The model answers with
indices, which `schema.parse_plan` maps back to worker names in the pool's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from baton.v1 import requests_pb2
from baton_workflow import query_text

from baton_router.conductor.schema import PlanBounds, render_plan

DEFAULT_CARD = "A general-purpose model."

SYSTEM = """You are the conductor of a team of models. You do not answer the question yourself. \
You write a short workflow that the team carries out to answer it.

The models:
{cards}

Reply with one JSON object holding three lists of equal length, one entry per step, at most {max_steps} steps:
- "model_id": the number of the model that carries out each step.
- "subtasks": the instruction for each step, at most {max_chars} characters.
- "access_list": for each step, the earlier steps whose outputs it may read: [] for none, \
a list of step numbers counted from 0, or "all". The first step reads nothing.
The last step's output is the final answer."""

EXAMPLE = """

Example question: What is 17 * 24?
Example workflow: {example}"""


def cards_from(workers: Sequence) -> list[str]:
    """The pool's capability texts in pool order (objects with a `card` attribute, e.g. WorkerConfig)."""
    return [(w.card or "").strip() or DEFAULT_CARD for w in workers]


def example_plan(pool_size: int, max_steps: int) -> str:
    """A two-step worked example (one step when only one is allowed), using the pool's own indices."""
    if max_steps == 1:
        return render_plan([0], ["Compute 17 * 24 step by step and state the result."], [[]])
    second = 1 if pool_size > 1 else 0
    return render_plan(
        [second, 0],
        ["Compute 17 * 24 step by step.", "Check the calculation and state the final answer."],
        [[], [0]],
    )


def system_prompt(cards: Sequence[str], bounds: PlanBounds, example: bool = True) -> str:
    text = SYSTEM.format(
        cards="\n".join(f"Model {i}: {card}" for i, card in enumerate(cards)),
        max_steps=bounds.max_steps,
        max_chars=bounds.max_subtask_chars,
    )
    if example:
        text += EXAMPLE.format(example=example_plan(bounds.pool_size, bounds.max_steps))
    return text


def conversation(request: requests_pb2.ChatRequest) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in request.messages]


def question(messages: Sequence[Mapping[str, str]], max_chars: int) -> str:
    """The question the workflow answers: the last user message, cut to `max_chars` characters so a
    long paste cannot blow up the prompt (the workers still see the whole conversation)."""
    text = query_text(messages).strip()
    if len(text) > max_chars:
        text = text[:max_chars].rstrip() + " ..."
    return text


def conductor_messages(messages: Sequence[Mapping[str, str]], cards: Sequence[str], bounds: PlanBounds,
                       *, example: bool = True, max_query_chars: int = 2000) -> list[dict[str, str]]:
    """Chat messages for the conductor model: the instructions with the pool, then the question."""
    return [
        {"role": "system", "content": system_prompt(cards, bounds, example)},
        {"role": "user", "content": question(messages, max_query_chars)},
    ]
