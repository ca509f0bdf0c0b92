"""What a stand-in model decides beyond echoing: when it calls a tool, with which arguments, and what
JSON it answers in JSON mode. Deterministic, so tests can predict it; each dialect puts the decision
into its own wire format (OpenAI tool_calls, Anthropic tool_use blocks, Gemini functionCall parts).

- With tools offered, the model calls one unless the turn already holds a tool result (then it
  answers, echoing the results) or tool_choice is "none"; a forced choice is always obeyed. It calls
  the forced tool, else the first tool whose name the user's last message mentions, else the first.
- Arguments and JSON answers are instances of the schema: strings take the last capitalised word of
  the user's last message (a city, a name), integers and numbers its first number, so a test can tell
  the values came from the conversation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CAPITALISED = re.compile(r"\b[A-Z][a-zA-Z]+\b")


@dataclass
class Wants:
    """The request's tools, tool choice, JSON mode, stop sequences and log-probabilities."""

    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, JSON Schema of the arguments)
    tool_choice: str = "auto"  # "auto", "none", "required", or a tool's name
    json_mode: str | None = None  # None, "object" or "schema"
    schema: dict[str, Any] | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None: not asked; else how many alternatives per token


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments)


def tool_calls(wants: Wants, transcript: list[tuple[str, str]], request_no: int) -> list[Call]:
    if not wants.tools or wants.tool_choice == "none":
        return []
    names = [name for name, _ in wants.tools]
    forced = wants.tool_choice not in ("auto", "required")
    answered = bool(transcript) and transcript[-1][0] in ("tool", "tool_result", "function")
    if answered and not forced and wants.tool_choice != "required":
        return []
    user = last_user(transcript)
    if forced:
        name = wants.tool_choice
    else:
        words = set(re.findall(r"[a-z]+", user.lower()))
        # The tool with the most name parts ("get_weather": get, weather) among the user's words.
        name = max(names, key=lambda n: sum(part in words for part in n.lower().split("_")))
    schema = dict(wants.tools)[name]
    arguments = instance(schema, user)
    return [Call(id=f"call_standin{request_no:06d}", name=name, arguments=arguments if isinstance(arguments, dict) else {})]


def json_answer(wants: Wants, transcript: list[tuple[str, str]], echo: str) -> str | None:
    if wants.json_mode == "schema":
        return json.dumps(instance(wants.schema or {}, last_user(transcript)))
    if wants.json_mode == "object":
        return json.dumps({"answer": echo})
    return None


def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """`text` cut before the first stop sequence, and whether it was cut."""
    cuts = [text.index(s) for s in stop if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def last_user(transcript: list[tuple[str, str]]) -> str:
    return next((text for role, text in reversed(transcript) if role == "user"), "")


def instance(schema: Any, hint: str) -> Any:
    """A value valid under `schema` (the JSON Schema subset tool and response schemas use); for a
    schema outside that subset, a best effort that never fails (a model answers something)."""
    try:
        return _instance(schema, hint, schema, depth=0)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError):
        return {}


def _instance(schema: Any, hint: str, root: Any, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > 20:
        return None
    if "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return _instance(target, hint, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _instance(options[0], hint, root, depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    numbers = _NUMBER.findall(hint)
    if kind == "object":
        props = {name: {"type": "string"} for name in schema.get("required") or []} | (schema.get("properties") or {})
        return {name: _instance(sub, hint, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [_instance(schema.get("items") or {"type": "string"}, hint, root, depth + 1)]
    if kind == "string":
        words = _CAPITALISED.findall(hint)
        return words[-1] if words else "baton"
    if kind == "integer":
        return int(float(numbers[0])) if numbers else 1
    if kind == "number":
        return float(numbers[0]) if numbers else 1.0
    if kind == "boolean":
        return True
    return None
