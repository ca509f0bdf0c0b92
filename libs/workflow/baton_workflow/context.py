"""What a step's worker sees: its instruction, the steps its access list allows, and the user's request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from baton_workflow.plan import Plan, readable_steps


def step_messages(
    plan: Plan, step: int, conversation: Sequence[Mapping[str, str]], outputs: Mapping[int, str],
    prior: Sequence[tuple[str, str]] = (),
) -> list[dict[str, str]]:
    """Chat messages for `step`: a system message with the instruction and the readable earlier steps,
    then the user's conversation unchanged. Steps outside the access list are never mentioned.

    `prior` is set in a corrective workflow (one the conductor wrote when called as a step): the
    (instruction, output) pairs of the workflow it corrects, which every one of its steps sees."""
    lines = [
        f"You are step {step + 1} of {plan.steps} in a workflow that answers the user's request.",
        f"Your instruction: {plan.subtasks[step]}",
    ]
    if prior:
        lines.append("This workflow checks and corrects an earlier one, whose steps gave:")
        for j, (instruction, output) in enumerate(prior):
            lines.append(f"[Earlier step {j + 1}] Instruction: {instruction}")
            lines.append(f"[Earlier step {j + 1}] Output: {output}")
    readable = readable_steps(plan.access[step], step)
    if readable:
        lines.append("Results of earlier steps you may use:")
        for j in readable:
            lines.append(f"[Step {j + 1}] Instruction: {plan.subtasks[j]}")
            lines.append(f"[Step {j + 1}] Output: {outputs[j]}")
    return [{"role": "system", "content": "\n".join(lines)}] + [
        {"role": m["role"], "content": m["content"]} for m in conversation
    ]


def ready_steps(plan: Plan, done: set[int], started: set[int]) -> list[int]:
    """Steps not yet started whose readable steps are all done."""
    return [
        i
        for i in range(plan.steps)
        if i not in started and all(j in done for j in readable_steps(plan.access[i], i))
    ]


def query_text(conversation: Sequence[Mapping[str, str]]) -> str:
    """The user's question: the last user message."""
    for m in reversed(conversation):
        if m["role"] == "user":
            return m["content"]
    return ""
