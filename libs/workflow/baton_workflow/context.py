"""What a step's worker sees: its instruction, the steps its access list allows, and the user's request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from baton_workflow.plan import Plan, readable_steps


def step_messages(
    plan: Plan, step: int, conversation: Sequence[Mapping[str, str]], outputs: Mapping[int, str],
    prior: Sequence[tuple[str, str]] = (), *, native_tools: bool = False,
) -> list[dict]:
    """Chat messages for `step`: a system message with the instruction and the readable earlier steps,
    then the user's conversation unchanged. Steps outside the access list are never mentioned.

    `prior` is set in a corrective workflow (one the conductor wrote when called as a step): the
    (instruction, output) pairs of the workflow it corrects, which every one of its steps sees.

    Turns of a tool exchange (an assistant turn with `tool_calls`, `tool` turns with results) reach
    the step as they are when `native_tools` (the answering step, which has the client's tools), and
    as text otherwise."""
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
    turns = [dict(m) for m in conversation] if native_tools else [_as_text(m) for m in conversation]
    return [{"role": "system", "content": "\n".join(lines)}] + turns


def _as_text(message: Mapping) -> dict[str, str]:
    """A turn of a tool exchange as plain text, for a step that has no tools: such a step still needs
    what the tools returned, and providers refuse tool turns from a request that offers no tools."""
    if message["role"] == "tool":
        name = message.get("name") or "a tool"
        return {"role": "user", "content": f"[Result of {name}, call {message.get('tool_call_id', '')}]: "
                                           f"{message['content']}"}
    calls = message.get("tool_calls") or ()
    text = "\n".join([message["content"]] * bool(message["content"]) +
                     [f"[Called {c['name']} with {c['arguments']}, call {c['id']}]" for c in calls])
    return {"role": message["role"], "content": text}


def turn(message) -> dict:
    """A ChatMessage (baton.v1) as the dict steps and adapters read: role and content, and tool fields
    only where the turn has them."""
    out: dict = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


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


def policy_query(query: str, tools: Sequence[str] = (), response_format: str = "") -> str:
    """The text a policy routes on: the user's question, plus marker words for what the client asked
    of the answer (tools it may call, a JSON format), so hashed features see the request's shape.
    The router decides with it and the reward logger records it, so training sees what serving saw."""
    marks = [f"baton_tool_{name}" for name in tools]
    if tools:
        marks.insert(0, "baton_tools")
    if response_format and response_format != "text":
        marks.append(f"baton_format_{response_format}")
    return f"{query}\n{' '.join(marks)}" if marks else query
