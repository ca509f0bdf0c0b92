"""OpenAI's Responses API on Baton's workflows: a request is translated into the chat-completions
request it means, and runs as one, with the same plans, episodes, limits, budgets and tenants.

The translation: `instructions` becomes the system message; `input` (a string, or items) the turns,
where `function_call` items are the assistant's tool calls and `function_call_output` items their
results; `text.format` the response format; `max_output_tokens` the answering step's max tokens.
With `previous_response_id`, the stored turns of that response and of those before it come first,
as OpenAI's API does (without their instructions). Every parameter either reaches the answering step
or is refused with a 400 naming it (README, "Responses parameters"). No Kafka here.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from baton.v1 import responses_pb2
from baton_gateway.api import ApiError, chat_request_from, tool_calls_body, workflow_summary
from baton_gateway.params import INT32_MAX, NAME_PATTERN, ChatCompletionRequest, FunctionDef, StreamOptions, first_error

# Parameters of OpenAI's Responses API that Baton refuses, and why (the 400 says so).
REFUSED = {
    "background": "background responses are not supported; send the request and wait, or stream it",
    "reasoning": "the workers' reasoning is set by the operator, not per request",
    "prompt": "stored prompt templates are not supported; send instructions and input",
    "conversation": "the Conversations API is not supported; continue a conversation with previous_response_id",
    "max_tool_calls": "built-in tools are not supported, so there are no tool calls to limit",
    "top_logprobs": "log-probabilities are not returned by the Responses API here; use chat completions",
    "service_tier": "the provider tier is set by the operator, not per request",
    "prompt_cache_key": "provider prompt caching is not controlled per request",
    "prompt_cache_retention": "provider prompt caching is not controlled per request",
    "context_management": "context management is not supported",
}
# OpenAI's id prefix for a response; the rest is the workflow's request id.
ID_PREFIX = "resp_"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextContent(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # what an output_text item given back carries
    logprobs: list[Any] | None = None


def _text(content: str | list[TextContent]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(_Strict):
    type: Literal["message"]
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextContent]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=512)
    name: str = Field(pattern=NAME_PATTERN)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=512)
    output: str | list[TextContent]
    id: str | None = None
    status: str | None = None


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class FunctionTool(FunctionDef):
    """A chat function tool's definition, flattened into the tool as the Responses API spells it."""

    type: Literal["function"]


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)


class PlainFormat(_Strict):
    type: Literal["text", "json_object"]


class SchemaFormat(_Strict):
    type: Literal["json_schema"]
    name: str = Field(pattern=NAME_PATTERN)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: Annotated[PlainFormat | SchemaFormat, Field(discriminator="type")] | None = None


class ResponsesRequest(_Strict):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, gt=0, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    truncation: Literal["disabled"] | None = Field(default=None, description="Only disabled: a conversation too long "
                                                   "for a worker fails rather than losing turns silently.")
    include: list[str] | None = Field(default=None, max_length=0, description="Nothing extra can be included.")

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        refused = sorted(k for k in data if k in REFUSED and data[k] is not None)
        if refused:
            raise ValueError(f"{refused[0]} is not supported: {REFUSED[refused[0]]}")
        tools = data.get("tools")
        for i, tool in enumerate(tools if isinstance(tools, list) else ()):  # not a list: the field's own 400
            if isinstance(tool, dict) and tool.get("type") != "function":
                raise ValueError(f"tools.{i}: the built-in tool {str(tool.get('type'))[:64]!r} is not supported; "
                                 "only function tools are")
        if isinstance(data.get("input"), list):  # a message may leave out its type, as the SDK's short form does
            data = {**data, "input": [{"type": "message", **item} if isinstance(item, dict) and "type" not in item
                                      else item for item in data["input"]]}
        value = data.get("max_output_tokens")
        if isinstance(value, float) and value.is_integer():
            data = {**data, "max_output_tokens": int(value)}
        return {k: v for k, v in data.items() if v is not None}

    def turns(self) -> list[dict[str, Any]]:
        """This request's input as chat messages (without the instructions)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for item in self.input:
            if isinstance(item, MessageItem):
                out.append({"role": item.role, "content": _text(item.content)})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and last.get("_open"):
                    last.setdefault("tool_calls", []).append(call)
                else:  # calls in a row are one assistant turn, as the model made them
                    out.append({"role": "assistant", "content": None, "tool_calls": [call], "_open": True})
                continue
            else:
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            if out[-1]["role"] == "assistant":
                out[-1]["_open"] = True  # an assistant message may be followed by its own calls
        for m in out:
            m.pop("_open", None)
        return out

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat-completions request this request means, after the stored turns `history`."""
        instructions = [{"role": "system", "content": self.instructions}] if self.instructions else []
        body: dict[str, Any] = {"model": self.model, "messages": [*instructions, *history, *self.turns()],
                                "stream": self.stream, "max_completion_tokens": self.max_output_tokens,
                                "temperature": self.temperature, "top_p": self.top_p, "metadata": self.metadata,
                                "parallel_tool_calls": self.parallel_tool_calls, "user": self.user,
                                "safety_identifier": self.safety_identifier}
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            body["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text else None
        if isinstance(fmt, SchemaFormat):
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name, "schema": fmt.schema_, "description": fmt.description, "strict": fmt.strict}}
        elif fmt is not None:
            body["response_format"] = {"type": fmt.type}
        return {k: v for k, v in body.items() if v is not None}


# Where a chat-completions parameter came from in a Responses request, for the 400 that names it.
_CHAT_TO_RESPONSES = [(re.compile(r"(?<![\w.])messages(\.\d+)?(?![\w])"), "input"),
                      (re.compile(r"(?<![\w.])max_completion_tokens"), "max_output_tokens"),
                      (re.compile(r"(?<![\w.])response_format(\.json_schema)?"), "text.format"),
                      (re.compile(r"(?<![\w.])tools\.(\d+)\.function"), r"tools.\1")]


def _in_responses_terms(text: str) -> str:
    for pattern, replacement in _CHAT_TO_RESPONSES:
        text = pattern.sub(replacement, text)
    return text


def parse_responses_request(data: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as e:
        first = first_error(e.errors())
        message = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:
            word = message.split(" ", 1)[0].rstrip(":")
            param = word if word.split(".", 1)[0] in {*ResponsesRequest.model_fields, *REFUSED} else None
            raise ApiError(400, f"invalid request: {message}", param=param) from None
        loc = [str(p) for p in first["loc"] if not re.fullmatch(r"str|int|float|bool|list\[.*\]|[A-Z]\w*", str(p))]
        loc = [p for p in loc if p not in ("message", "function_call", "function_call_output", "json_schema")
               or loc.index(p) == 0]
        param = ".".join(loc)
        if first["type"] == "extra_forbidden":
            raise ApiError(400, f"invalid request: {param}: this parameter is not supported", param=param) from None
        raise ApiError(400, f"invalid request: {param}: {message}", param=param) from None


def chat_request_for(req: ResponsesRequest, history: list[dict[str, Any]], known_models: set[str]) -> ChatCompletionRequest:
    """The validated chat request `req` means, its errors named in the Responses API's terms."""
    try:
        return chat_request_from(req.chat_body(history), known_models)
    except ApiError as e:
        e.message = _in_responses_terms(e.message)
        e.param = _in_responses_terms(e.param) if e.param else None
        raise


# -- the response object --------------------------------------------------------------------------


def output_items(request_id: str, response: responses_pb2.Response) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if response.answer or not response.tool_calls:
        items.append(message_item(request_id, response.answer))
    for i, call in enumerate(tool_calls_body(response)):
        items.append(function_call_item(request_id, i, call["id"], call["function"]["name"],
                                        call["function"]["arguments"]))
    return items


def message_item(request_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": f"msg_{request_id}", "status": status, "role": "assistant", "content": content}


def function_call_item(request_id: str, index: int, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{request_id}_{index}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def usage(response: responses_pb2.Response) -> dict[str, Any]:
    total = response.episode.total
    return {"input_tokens": total.input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": total.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total.input_tokens + total.output_tokens}


INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_body(request_id: str, req: ResponsesRequest, created_at: int,
                  response: responses_pb2.Response | None = None, *, status: str = "in_progress",
                  error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The response object: in progress (no `response`), completed or incomplete (with it), or failed
    (with `error`)."""
    body: dict[str, Any] = {
        "id": f"{ID_PREFIX}{request_id}", "object": "response", "created_at": created_at, "status": status,
        "error": error, "incomplete_details": None, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "model": req.model, "output": [],
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
        "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)
                 if req.text and req.text.format else {"type": "text"}},
        "tool_choice": req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction)
        else (req.tool_choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()], "truncation": "disabled",
        "usage": None, "user": req.user, "metadata": req.metadata or {},
    }
    if response is not None:
        reason = INCOMPLETE.get(response.finish_reason) if not response.tool_calls else None
        body.update(status="incomplete" if reason else "completed", output=output_items(request_id, response),
                    usage=usage(response), incomplete_details={"reason": reason} if reason else None,
                    baton={"request_id": request_id, **workflow_summary(response.episode)})
    return body


def now() -> int:
    return int(time.time())


def turn_messages(req: ResponsesRequest, response: responses_pb2.Response) -> list[dict[str, Any]]:
    """What a later turn continuing this response reads of it: its input and its answer, as chat messages."""
    answer: dict[str, Any] = {"role": "assistant", "content": response.answer or None}
    if response.tool_calls:
        answer["tool_calls"] = tool_calls_body(response)
    return [*req.turns(), answer]
