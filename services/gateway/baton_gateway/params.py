"""The chat-completions request: every parameter either reaches the answering step or is refused.

The answering step is the workflow's last step, the one whose output the client gets. Sampling
options, tools and the response format are for it alone: a drafting step cut to `max_tokens=5`, or
one answering with a tool call, would leave the answering step nothing to work with. Parameters no
workflow can honour (audio, several choices, predicted outputs...) are refused with a 400 that names
them, so nothing a client sends is dropped silently. README ("Chat-completions parameters") lists them.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, model_validator

from baton.v1 import common_pb2
from baton_platform import jsonschemas

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# A character that is not whitespace as the published schema's pattern `\S` means it (ECMA-262, which
# JSON Schema uses): Python's own notion also counts control characters such as \x1f as whitespace.
_VISIBLE = re.compile("[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]")

# Parameters of OpenAI's API that Baton refuses, and why (the 400 says so).
REFUSED = {
    "audio": "Baton answers with text only",
    "modalities": "Baton answers with text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "Baton runs no web search",
    "functions": "the deprecated `functions` is not supported; send `tools`",
    "function_call": "the deprecated `function_call` is not supported; send `tool_choice`",
    "reasoning_effort": "the workers' reasoning effort is set by the operator, not per request",
    "verbosity": "the workers' verbosity is set by the operator, not per request",
    "service_tier": "the provider tier is set by the operator, not per request",
    "prompt_cache_key": "provider prompt caching is not controlled per request",
    "prompt_cache_retention": "provider prompt caching is not controlled per request",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = str | list[TextPart] | None


def text_of(content: Content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content)


class FunctionCall(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    arguments: str


class ToolCallIn(_Strict):
    id: str = Field(min_length=1, max_length=512)
    type: Literal["function"] = "function"
    function: FunctionCall


class _Turn(_Strict):
    content: Content = None
    name: str | None = Field(default=None, max_length=256)

    def text(self) -> str:
        return text_of(self.content)


class SystemMessage(_Turn):
    role: Literal["system", "developer"]


class UserMessage(_Turn):
    role: Literal["user"]


class AssistantMessage(_Turn):
    role: Literal["assistant"]
    tool_calls: list[ToolCallIn] | None = None
    refusal: str | None = None  # what a model said when it refused; its text when there is no content

    def text(self) -> str:
        return text_of(self.content) or (self.refusal or "")


class ToolMessage(_Turn):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, max_length=512, description="The assistant tool call this answers.")


# One model per role, so the published schema says which fields each role may carry. Unknown fields
# are refused: a field the workers never see would be dropped.
MessageIn = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's padding of streamed chunks; Baton adds none


class FunctionDef(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str = Field(pattern=NAME_PATTERN)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class PlainFormat(_Strict):
    type: Literal["text", "json_object"]


class SchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[PlainFormat | SchemaFormat, Field(discriminator="type")]


class ChatCompletionRequest(BaseModel):
    # Types are strict, as OpenAI's are: "stream": "false" is a 400, not a request to stream. A
    # parameter not listed here is a 400 naming it (see REFUSED for OpenAI's own that Baton refuses).
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1)
    messages: list[MessageIn]
    # The wire format carries them as int32.
    max_tokens: int | None = Field(default=None, gt=0, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, gt=0, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = Field(default=None, ge=-INT64_MAX, le=INT64_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, int] | None = None
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    tools: list[ToolIn] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    store: Literal[False] | None = Field(default=None, description="Only false: Baton keeps no completions to list later.")
    metadata: dict[str, str] | None = Field(
        default=None, description="Strings: at most 16 pairs, keys of at most 64 characters, values of at most 512. "
        "Baton reads baton_max_cost_usd and baton_max_calls (a budget), baton_eval, 'SET:ID', an item of the "
        "operator's evaluation sets to grade the answer by, and eval_name, the fast policy's routing feature (these "
        "two need a key with the `eval` scope; an item grades a conversation of its question alone).")
    n: int | None = Field(default=1, ge=1, le=1, description="Baton answers with one choice: a workflow has one "
                          "answering step, and n > 1 would mean running the whole workflow n times.")

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        refused = sorted(k for k in data if k in REFUSED and data[k] is not None)
        if refused:
            raise ValueError(f"{refused[0]} is not supported: {REFUSED[refused[0]]}")
        # JSON has one number type: 5.0 is an integer to JSON Schema, so it is taken as 5.
        for name in ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs"):
            value = data.get(name)
            if isinstance(value, float) and value.is_integer():
                data = {**data, name: int(value)}
        # Null means "not given" for every parameter, as OpenAI's SDKs send it.
        return {k: v for k, v in data.items() if v is not None and k not in REFUSED}

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if not self.messages:
            raise ValueError("messages must hold at least one message")
        if not any(m.role == "user" and _VISIBLE.search(m.text()) for m in self.messages):
            raise ValueError("messages must include a non-empty user message")
        called: set[str] = set()
        for i, m in enumerate(self.messages):
            called.update(c.id for c in getattr(m, "tool_calls", None) or ())
            if isinstance(m, ToolMessage) and m.tool_call_id not in called:
                raise ValueError(f"messages.{i}: tool_call_id {m.tool_call_id!r} answers no earlier assistant tool call")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools have the same name")
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        if self.parallel_tool_calls is not None and not self.tools:
            raise ValueError("parallel_tool_calls needs tools")
        schemas = [(f"tools.{i}.function.parameters", t.function.parameters) for i, t in enumerate(self.tools or ())]
        if isinstance(self.response_format, SchemaFormat):
            schemas.append(("response_format.json_schema.schema", self.response_format.json_schema.schema_))
        for where, schema in schemas:
            try:
                jsonschema.Draft202012Validator.check_schema(schema or {})
            except jsonschema.SchemaError as e:
                raise ValueError(f"{where} is not a valid JSON Schema: {e.message}") from None
        if isinstance(self.response_format, SchemaFormat):
            try:  # the executor checks answers against it: only patterns that match in linear time
                jsonschemas.check(self.response_format.json_schema.schema_ or {})
            except jsonschemas.SchemaRefused as e:
                raise ValueError(f"response_format.json_schema.schema: {e}") from None
        for token, bias in (self.logit_bias or {}).items():
            if not token.isdigit() or not -100 <= bias <= 100:
                raise ValueError("logit_bias maps token ids to biases from -100 to 100")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


# The unions chosen by a field, and where their tag shows in an error's path: messages.<i>.<role>.
_TAGGED = {"messages": ("role", 2, {"system", "developer", "user", "assistant", "tool"}),
           "response_format": ("type", 1, {"text", "json_object", "json_schema"})}
_FIELD = re.compile(r"[a-z_][a-z0-9_]*|\d+")
_UNION_MEMBERS = {"str", "int", "float", "bool"}


def first_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to report: of a value that fits no member of a union, the one about the member whose
    type it has (a list too long), not about a member it is not (a list that is not a string)."""
    return next((e for e in errors if not e["type"].endswith("_type")), errors[0])


def param_at(error: dict[str, Any]) -> str:
    """The parameter a field error is about, as the client wrote it: messages.1.content, not the
    path through the models' unions that pydantic gives (messages.1.user.content.list[TextPart])."""
    loc = [str(p) for p in error["loc"]]
    tag, at, values = _TAGGED.get(loc[0], ("", 0, set()))
    if len(loc) > at and loc[at] in values:
        del loc[at]
    loc = [p for p in loc if _FIELD.fullmatch(p) and p not in _UNION_MEMBERS]
    if error["type"] in ("union_tag_invalid", "union_tag_not_found") and tag:
        loc.append(tag)
    return ".".join(loc)


def param_of(message: str) -> str | None:
    """The parameter a request-level error is about: its message starts with the parameter's name."""
    word = message.split(" ", 1)[0].rstrip(":")
    top = word.split(".", 1)[0]
    return word if top in ChatCompletionRequest.model_fields or top in REFUSED else None


def messages_proto(req: ChatCompletionRequest) -> list[common_pb2.ChatMessage]:
    out = []
    for m in req.messages:
        msg = common_pb2.ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text(),
                                     tool_call_id=getattr(m, "tool_call_id", ""), name=m.name or "")
        for c in getattr(m, "tool_calls", None) or ():
            msg.tool_calls.add(id=c.id, name=c.function.name, arguments=c.function.arguments)
        out.append(msg)
    # A tool turn carries its call's function name: Gemini matches results to calls by name.
    names = {c.id: c.name for msg in out for c in msg.tool_calls}
    for msg in out:
        if msg.role == "tool" and not msg.name:
            msg.name = names.get(msg.tool_call_id, "")
    return out


def answer_options(req: ChatCompletionRequest) -> common_pb2.AnswerOptions:
    """What the answering step gets beyond the conversation (max_tokens and temperature travel on
    the request itself)."""
    opts = common_pb2.AnswerOptions(stop=req.stops(), logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
                                    user=req.safety_identifier or req.user or "")
    for t in req.tools or ():
        opts.tools.add(name=t.function.name, description=t.function.description or "",
                       parameters_json=json.dumps(t.function.parameters or {"type": "object", "properties": {}}),
                       strict=bool(t.function.strict))
    if isinstance(req.tool_choice, NamedToolChoice):
        opts.tool_choice, opts.tool_choice_name = "function", req.tool_choice.function.name
    elif req.tool_choice is not None:
        opts.tool_choice = req.tool_choice
    if req.parallel_tool_calls is not None:
        opts.parallel_tool_calls = req.parallel_tool_calls
    if req.response_format is not None and req.response_format.type != "text":
        opts.response_format = req.response_format.type
        if isinstance(req.response_format, SchemaFormat):
            js = req.response_format.json_schema
            opts.schema_name, opts.schema_strict = js.name, bool(js.strict)
            opts.schema_json = json.dumps(js.schema_ if js.schema_ is not None else {})
    for name in ("top_p", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(req, name) is not None:
            setattr(opts, name, getattr(req, name))
    if req.logit_bias:
        opts.logit_bias_json = json.dumps(req.logit_bias)
    return opts
