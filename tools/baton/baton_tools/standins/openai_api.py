"""Stand-in for OpenAI Chat Completions (``POST /v1/chat/completions``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .behaviour import Wants
from .core import (
    Dialect,
    Parsed,
    Reply,
    StandinConfig,
    StandinState,
    json_error,
    parse_json_object,
    retry_after_header,
    sse,
    text_of,
)

_KNOWN_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
        "stream", "stream_options", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
        "logprobs", "top_logprobs", "user", "seed", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "service_tier", "store", "metadata", "reasoning_effort", "modalities",
        "audio", "prediction", "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
    }
)  # fmt: skip
_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
_NOMINAL_TOKENS = 2_000_000
_FINGERPRINT = "fp_standin"


def _error(status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:  # fmt: skip
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json_error(status, body, headers)


def _mask(key: str) -> str:
    # The real API echoes a rejected key with its middle starred out.
    if len(key) <= 8:
        return "*" * len(key)
    return f"{key[:3]}{'*' * (len(key) - 7)}{key[-4:]}"


def go_duration(seconds: float) -> str:
    """Format like OpenAI's reset headers: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest = round(rest, 3)
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:g}s"


def _check_calls(calls: Any, i: int) -> Response | None:
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("type") == "function"
        and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments"), str) for c in calls
    ):
        return _error(400, f"Invalid 'messages[{i}].tool_calls': expected an array of function calls with id, "
                      "type and function (name, arguments).", param=f"messages[{i}].tool_calls",
                      code="invalid_type")  # fmt: skip
    return None


def _wants(body: dict[str, Any]) -> Wants | Response:
    """Tools, tool_choice, response_format, stop and logprobs, validated as the real API does."""
    wants = Wants()
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools
        ):
            return _error(400, "Invalid 'tools': expected an array of function tools.", param="tools",
                          code="invalid_type")  # fmt: skip
        wants.tools = [(t["function"]["name"], t["function"].get("parameters") or {}) for t in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        if not wants.tools:
            return _error(400, "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", param="tool_choice")  # fmt: skip
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in dict(wants.tools):
                return _error(400, f"Invalid value for 'tool_choice': no function named '{name}' was specified in "
                              "the 'tools' parameter.", param="tool_choice")  # fmt: skip
            wants.tool_choice = name
        elif choice in ("auto", "none", "required"):
            wants.tool_choice = choice
        else:
            return _error(400, f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.",
                          param="tool_choice", code="invalid_value")  # fmt: skip
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                return _error(400, "Missing required parameter: 'response_format.json_schema.name'.",
                              param="response_format.json_schema.name", code="missing_required_parameter")  # fmt: skip
            wants.json_mode, wants.schema = "schema", spec.get("schema") or {}
        elif kind == "json_object":
            wants.json_mode = "object"
        elif kind != "text":
            return _error(400, f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and "
                          "'json_schema'.", param="response_format.type", code="invalid_value")  # fmt: skip
    stop = body.get("stop")
    wants.stop = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
    if body.get("logprobs") is True:
        wants.logprobs = int(body.get("top_logprobs") or 0)
    elif body.get("top_logprobs") is not None:
        return _error(400, "Invalid value for 'logprobs': must be true when 'top_logprobs' is specified.",
                      param="logprobs")  # fmt: skip
    return wants


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in reply.calls]


def _logprob_content(tokens: list[tuple[str, float, list[tuple[str, float]]]]) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in top]}
                        for t, lp, top in tokens], "refusal": None}


def _logprobs(reply: Reply) -> dict[str, Any] | None:
    return None if reply.logprobs is None else _logprob_content(reply.token_logprobs())


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.calls else "length" if reply.truncated else "stop"


class OpenAIDialect(Dialect):
    kind = "openai"
    default_fail_status = 500
    default_context_window = 128_000

    def routes(self, endpoint: Callable) -> list[Route]:
        return [Route("/v1/chat/completions", endpoint, methods=["POST"])]

    def authenticate(self, request: Request, config: StandinConfig) -> Response | None:
        if not config.require_key:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return _error(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header "
                "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        if key.strip() != config.require_key:
            return _error(
                401,
                f"Incorrect API key provided: {_mask(key.strip())}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )
        return None

    def parse(self, request: Request, raw: bytes, config: StandinConfig) -> Parsed | Response:
        body = parse_json_object(raw)
        if body is None:
            return _error(
                400,
                "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload, "
                "but what was sent was not valid JSON.",
            )
        unknown = sorted(set(body) - _KNOWN_FIELDS)
        if unknown:
            return _error(400, f"Unrecognized request argument supplied: {unknown[0]}")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "you must provide a model parameter")
        messages = body.get("messages")
        if messages is None:
            return _error(400, "Missing required parameter: 'messages'.", param="messages",
                          code="missing_required_parameter")  # fmt: skip
        if not isinstance(messages, list):
            return _error(400, f"Invalid type for 'messages': expected an array, but got {type(messages).__name__} "
                          "instead.", param="messages", code="invalid_type")  # fmt: skip
        if not messages:
            return _error(400, "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                          "but got an empty array instead.", param="messages", code="empty_array")  # fmt: skip
        transcript: list[tuple[str, str]] = []
        called: set[str] = set()
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                return _error(400, f"Missing required parameter: 'messages[{i}].role'.", param=f"messages[{i}].role",
                              code="missing_required_parameter")  # fmt: skip
            role = message["role"]
            if role not in _ROLES:
                supported = ", ".join(f"'{r}'" for r in _ROLES[:-1]) + f", and '{_ROLES[-1]}'"
                return _error(400, f"Invalid value: '{role}'. Supported values are: {supported}.",
                              param=f"messages[{i}].role", code="invalid_value")  # fmt: skip
            calls = message.get("tool_calls") if role == "assistant" else None
            if calls:
                problem = _check_calls(calls, i)
                if problem is not None:
                    return problem
                called.update(c["id"] for c in calls)
                said = text_of(message.get("content")) or ""
                said += " ".join(f"[{c['function']['name']}({c['function']['arguments']})]" for c in calls)
                transcript.append((role, said))
                continue
            if role == "tool" and message.get("tool_call_id") not in called:
                return _error(400, "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              "message with 'tool_calls'.", param=f"messages.[{i}].role")  # fmt: skip
            text = text_of(message.get("content"))
            if text is None:
                return _error(400, f"Invalid type for 'messages[{i}].content': expected one of a string or an "
                              "array of text parts.", param=f"messages[{i}].content", code="invalid_type")  # fmt: skip
            transcript.append((role, text))
        temperature = body.get("temperature")
        if temperature is not None:
            if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
                return _error(400, "Invalid type for 'temperature': expected a decimal.", param="temperature",
                              code="invalid_type")  # fmt: skip
            if temperature > 2:
                return _error(400, f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
                              f"but got {temperature} instead.", param="temperature",
                              code="decimal_above_max_value")  # fmt: skip
            if temperature < 0:
                return _error(400, f"Invalid 'temperature': decimal below minimum value. Expected a value >= 0, "
                              f"but got {temperature} instead.", param="temperature",
                              code="decimal_below_min_value")  # fmt: skip
        max_tokens = None
        for name in ("max_completion_tokens", "max_tokens"):
            value = body.get(name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                return _error(400, f"Invalid type for '{name}': expected an integer.", param=name,
                              code="invalid_type")  # fmt: skip
            if value < 1:
                return _error(400, f"Invalid '{name}': integer below minimum value. Expected a value >= 1, "
                              f"but got {value} instead.", param=name, code="integer_below_min_value")  # fmt: skip
            max_tokens = value if max_tokens is None else min(max_tokens, value)
        stream = body.get("stream") is True
        if body.get("stream_options") is not None and not stream:
            return _error(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options", code="invalid_value")  # fmt: skip
        include_usage = bool(stream and (body.get("stream_options") or {}).get("include_usage"))
        wants = _wants(body)
        if isinstance(wants, Response):
            return wants
        return Parsed(model, transcript, max_tokens, stream, extra={"include_usage": include_usage}, body=body,
                      wants=wants)

    def unknown_model(self, parsed: Parsed) -> Response:
        return _error(404, f"The model `{parsed.model}` does not exist or you do not have access to it.",
                      code="model_not_found")  # fmt: skip

    def context_overflow(self, parsed: Parsed, window: int) -> Response:
        return _error(
            400,
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{parsed.input_tokens} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )

    def _limit_headers(self, state: StandinState) -> dict[str, str]:
        limit, remaining, reset = state.window_status(time.monotonic())
        if limit is None:
            limit, remaining = self.nominal_rpm, self.nominal_rpm - len(state.window)
        return {
            "x-ratelimit-limit-requests": str(limit),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": go_duration(reset),
            "x-ratelimit-limit-tokens": str(_NOMINAL_TOKENS),
            "x-ratelimit-remaining-tokens": str(_NOMINAL_TOKENS),
            "x-ratelimit-reset-tokens": "0s",
        }

    def headers(self, state: StandinState, request_no: int) -> dict[str, str]:
        return {
            "x-request-id": f"req_standin{request_no:08d}",
            "openai-processing-ms": "1",
            "openai-version": "2020-10-01",
            **self._limit_headers(state),
        }

    def rate_limited(self, parsed: Parsed, retry_after_s: float, state: StandinState) -> Response:
        limit, _, _ = state.window_status(time.monotonic())
        headers = {
            **self._limit_headers(state),
            "retry-after": retry_after_header(retry_after_s),
            "retry-after-ms": str(max(1, round(retry_after_s * 1000))),
        }
        return _error(
            429,
            f"Rate limit reached for {parsed.model} in organization org-standin on requests per min (RPM): "
            f"Limit {limit}, Used {len(state.window)}, Requested 1. Please try again in {go_duration(retry_after_s)}. "
            "Visit https://platform.openai.com/account/rate-limits to learn more.",
            type_="requests",
            code="rate_limit_exceeded",
            headers=headers,
        )

    def server_error(self, status: int) -> Response:
        if status == 503:
            return _error(503, "The engine is currently overloaded, please try again later.", type_="server_error")
        if status == 429:
            return _error(429, "The engine is currently overloaded, please try again later.", type_="requests",
                          code="rate_limit_exceeded")  # fmt: skip
        return _error(
            status,
            "The server had an error while processing your request. Sorry about that!",
            type_="server_error" if status >= 500 else "invalid_request_error",
        )

    # --- replies ---------------------------------------------------------------------

    @staticmethod
    def _usage(reply: Reply) -> dict[str, Any]:
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def reply(self, parsed: Parsed, reply: Reply) -> Response:
        return JSONResponse(
            {
                "id": f"chatcmpl-standin{reply.request_no:08d}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": parsed.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None if reply.calls else reply.text,
                                    "refusal": None, "annotations": [],
                                    **({"tool_calls": _tool_calls(reply)} if reply.calls else {})},
                        "logprobs": _logprobs(reply),
                        "finish_reason": _finish(reply),
                    }
                ],
                "usage": self._usage(reply),
                "service_tier": "default",
                "system_fingerprint": _FINGERPRINT,
            }
        )

    def _chunk(self, parsed: Parsed, reply: Reply, created: int, choices: list[dict[str, Any]],
               usage: dict[str, Any] | None = None) -> bytes:  # fmt: skip
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-standin{reply.request_no:08d}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": parsed.model,
            "service_tier": "default",
            "system_fingerprint": _FINGERPRINT,
            "choices": choices,
        }
        if parsed.extra.get("include_usage"):
            chunk["usage"] = usage
        return sse(chunk)

    def _opening(self, parsed: Parsed, reply: Reply, chunks: list[str], created: int) -> list[bytes]:
        def delta(d: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]

        events = [self._chunk(parsed, reply, created, delta({"role": "assistant", "content": "", "refusal": None}))]
        for piece in chunks:
            if piece:
                d = [{"index": 0, "delta": {"content": piece}, "finish_reason": None, "logprobs": None}]
                if reply.logprobs is not None:
                    # The tokens of this piece: the whitespace pieces it is made of.
                    d[0]["logprobs"] = _logprob_content(reply.token_logprobs(piece))
                events.append(self._chunk(parsed, reply, created, d))
        for index, call in enumerate(reply.calls):
            # As the real API streams a call: id and name first, then the arguments in pieces.
            head: dict[str, Any] = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            events.append(self._chunk(parsed, reply, created, delta({"tool_calls": [head]})))
            arguments = call.arguments_json
            for start in range(0, len(arguments), 8):
                part: dict[str, Any] = {"index": index, "function": {"arguments": arguments[start:start + 8]}}
                events.append(self._chunk(parsed, reply, created, delta({"tool_calls": [part]})))
        return events

    def stream_events(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        created = int(time.time())
        events = self._opening(parsed, reply, chunks, created)
        finish = _finish(reply)
        events.append(
            self._chunk(parsed, reply, created, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}])
        )
        if parsed.extra.get("include_usage"):
            events.append(self._chunk(parsed, reply, created, [], usage=self._usage(reply)))
        events.append(sse("[DONE]"))
        return events

    def stream_failure(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        events = self._opening(parsed, reply, chunks[: max(1, len(chunks) // 2)], int(time.time()))
        error = {
            "error": {
                "message": "The server had an error while processing your request. Sorry about that!",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
        events.append(sse(error))
        return events
