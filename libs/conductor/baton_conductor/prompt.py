"""The conductor's prompt: the user's question and the worker pool, shown as capability cards by index.

Workers appear only as "Model <i>: <card>", never by name or brand, so the conductor judges them by
what their cards say and a worker is added to the pool by writing its card. The model answers with
indices, which `schema.parse_plan` maps back to worker names in the pool's order. With recursion on,
the last index is the conductor itself; an inner call also sees the workflow so far and may answer
with three empty lists to keep the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from baton.v1 import requests_pb2
from baton_conductor.schema import PlanBounds, render_plan
from baton_workflow import query_text

DEFAULT_CARD = "A general-purpose model."

# The card of the conductor itself, the last model in the pool when recursion is on (conductor.max_depth).
CONDUCTOR_CARD = ("The conductor (you), called again as a step: it reads the workflow so far and its last "
                  "answer, then keeps the answer or writes a workflow that corrects it.")

INNER = """

You are called as a step inside a workflow that is answering this question.
The workflow so far:
{steps}
Its last answer: {answer}

If that answer is right and complete, reply with three empty lists to keep it: {{"model_id": [], "subtasks": [], "access_list": []}}
Otherwise write a workflow that corrects it; its steps see the workflow so far, and its last step's output replaces the answer.{no_recursion}"""

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

EXAMPLE_QUESTION = "What is 17 * 24?"
EXAMPLE_SUBTASKS = ("Compute 17 * 24 step by step.", "Check the calculation and state the final answer.",
                    "Compute 17 * 24 step by step and state the result.")
EXAMPLE = """

Example question: {question}
Example workflow: {example}"""


def cards_from(workers: Sequence) -> list[str]:
    """The pool's capability texts in pool order (objects with a `card` attribute, e.g. WorkerConfig)."""
    return [(w.card or "").strip() or DEFAULT_CARD for w in workers]


def example_plan(pool_size: int, max_steps: int) -> str:
    """A two-step worked example (one step when only one is allowed), using the pool's own indices."""
    if max_steps == 1:
        return render_plan([0], [EXAMPLE_SUBTASKS[2]], [[]])
    second = 1 if pool_size > 1 else 0
    return render_plan([second, 0], list(EXAMPLE_SUBTASKS[:2]), [[], [0]])


def copies_example(subtasks: Sequence[str]) -> bool:
    """Whether a plan copied the worked example instead of working on its question: one of its
    instructions is the example's, or is about the example's arithmetic. Small conductors do this
    (SmolLM2-135M in most plans), and it is measured before and after training."""
    own = {_plain(t) for t in EXAMPLE_SUBTASKS}
    return any(_plain(t) in own or "17*24" in _plain(t).replace(" ", "") for t in subtasks)


def _plain(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def system_prompt(cards: Sequence[str], bounds: PlanBounds, example: bool = True) -> str:
    text = SYSTEM.format(
        cards="\n".join(f"Model {i}: {card}" for i, card in enumerate(cards)),
        max_steps=bounds.max_steps,
        max_chars=bounds.max_subtask_chars,
    )
    if example:
        text += EXAMPLE.format(question=EXAMPLE_QUESTION, example=example_plan(bounds.pool_size, bounds.max_steps))
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


def _cut(text: str, max_chars: int) -> str:
    text = text.strip()
    return text if len(text) <= max_chars else text[:max_chars].rstrip() + " ..."


def inner_context(parent: requests_pb2.Parent, worker_names: Sequence[str], max_chars: int,
                  may_recurse: bool) -> str:
    """What an inner call sees besides the question: the workflow so far (models by index, as the
    pool shows them) and its last answer, each text cut to `max_chars`."""
    index = {name: i for i, name in enumerate(worker_names)}
    lines = []
    for j, s in enumerate(parent.steps):
        who = f"Model {index[s.worker]}" if s.worker in index else "a model"
        lines.append(f"[Step {j}] {who}: {_cut(s.instruction, max_chars)}")
        lines.append(f"[Step {j}] Output: {_cut(s.output, max_chars)}")
    no_recursion = "" if may_recurse else f"\nModel {len(worker_names) - 1} (the conductor) may not be used here."
    return INNER.format(steps="\n".join(lines) or "(no steps)", answer=_cut(parent.last_answer, max_chars) or "(none)",
                        no_recursion=no_recursion)


TOOLS = """

The client gave the last step these tools: {names}. Only the last step gets them: it may call them \
instead of answering, and the client runs the calls and asks again with their results. Earlier steps \
cannot call tools."""
TOOL_RESULTS = """
The conversation already holds results of tool calls: every step sees them."""


def tools_note(request: requests_pb2.ChatRequest, max_chars: int) -> str:
    """What the conductor must know of the client's tools: which there are, and whether the conversation
    holds results of calls already (a tool turn). Empty for a request without tools."""
    names = ", ".join(t.name for t in request.answer.tools)
    if not names:
        return ""
    results = any(m.role == "tool" for m in request.messages)
    return TOOLS.format(names=_cut(names, max_chars)) + (TOOL_RESULTS if results else "")


EVIDENCE = "\n\nThe router's estimate of each model's chance to answer right: {chances}."


def evidence_note(chances: Mapping[str, float] | None, worker_names: Sequence[str]) -> str:
    """The router's estimate (`baton_policy.evidence`) as the prompt shows it: each worker the estimate
    knows, by index, most likely right first, in whole percent. Empty when there is no estimate."""
    index = {name: i for i, name in enumerate(worker_names)}
    known = sorted(((p, index[w]) for w, p in (chances or {}).items() if w in index), key=lambda x: (-x[0], x[1]))
    if not known:
        return ""
    return EVIDENCE.format(chances=", ".join(f"Model {i} {round(100 * p)}%" for p, i in known))


def conductor_messages(messages: Sequence[Mapping[str, str]], cards: Sequence[str], bounds: PlanBounds,
                       *, example: bool = True, max_query_chars: int = 2000, inner: str = "") -> list[dict[str, str]]:
    """Chat messages for the conductor model: the instructions with the pool, then the question and what
    follows it (the router's estimate, the client's tools, and for an inner call the workflow so far)."""
    return [
        {"role": "system", "content": system_prompt(cards, bounds, example)},
        {"role": "user", "content": question(messages, max_query_chars) + inner},
    ]
