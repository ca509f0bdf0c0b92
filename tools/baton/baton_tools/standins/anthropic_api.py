"""Stand-in for the Anthropic Messages API (``POST /v1/messages``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
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
        "model", "messages", "max_tokens", "system", "temperature", "top_p", "top_k", "stop_sequences",
        "stream", "metadata", "tools", "tool_choice", "thinking", "service_tier", "container",
        "mcp_servers", "context_management", "output_config",
    }
)  # fmt: skip
_NOMINAL_TOKENS = 400_000


def _error(status: int, type_: str, message: str, request_no: int = 0,
           headers: dict[str, str] | None = None) -> JSONResponse:  # fmt: skip
    body = {"type": "error", "error": {"type": type_, "message": message}, "request_id": _request_id(request_no)}
    return json_error(status, body, {"request-id": _request_id(request_no), **(headers or {})})


def _request_id(request_no: int) -> str:
    return f"req_standin{request_no:012d}"


def _rfc3339(seconds_from_now: float) -> str:
    when = datetime.fromtimestamp(time.time() + seconds_from_now, tz=UTC)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _tool_blocks(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    blocks = [b for b in content if isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")]
    return blocks and [b for b in content if isinstance(b, dict)]


def _tool_turn(role: str, blocks: list[dict[str, Any]], used: set[str], i: int) -> tuple[str, str] | str:
    """An assistant turn with tool_use blocks or a user turn with tool_result blocks, as a transcript entry;
    a string is the error the real API gives."""
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("input"), dict):
                return f"messages.{i}.content.{j}.tool_use: id and input are required"
            used.add(block["id"])
            texts.append(f"[{block.get('name')}({json.dumps(block['input'])})]")
        elif kind == "tool_result" and role == "user":
            if block.get("tool_use_id") not in used:
                return (f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message.")
            texts.append(text_of(block.get("content")) or "")
        else:
            return f"messages.{i}.content.{j}: unexpected block type {kind!r} in a {role} message"
    return ("tool_result" if role == "user" else role, " ".join(texts))


def _wants(body: dict[str, Any]) -> Wants | str:
    wants = Wants()
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  and isinstance(t.get("input_schema"), dict) for t in tools):
            return "tools: each tool needs a name and an input_schema object"
        wants.tools = [(t["name"], t["input_schema"]) for t in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool":
            if choice.get("name") not in dict(wants.tools):
                return f"tool_choice: tool {choice.get('name')!r} not found in tools"
            wants.tool_choice = choice["name"]
        elif kind in ("auto", "any", "none"):
            wants.tool_choice = "required" if kind == "any" else kind
        else:
            return "tool_choice: Input tag does not match any of the expected tags: 'auto', 'any', 'tool', 'none'"
    fmt = (body.get("output_config") or {}).get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            return "output_config.format: expected {type: json_schema, schema: {...}}"
        wants.json_mode, wants.schema = "schema", fmt["schema"]
    stops = body.get("stop_sequences")
    wants.stop = [s for s in stops or [] if isinstance(s, str)]
    return wants


def _tool_id(call_id: str) -> str:
    return call_id.replace("call_", "toolu_", 1)


class AnthropicDialect(Dialect):
    kind = "anthropic"
    default_fail_status = 529
    default_context_window = 200_000

    def routes(self, endpoint: Callable) -> list[Route]:
        return [Route("/v1/messages", endpoint, methods=["POST"])]

    def authenticate(self, request: Request, config: StandinConfig) -> Response | None:
        if config.require_key:
            key = request.headers.get("x-api-key")
            if not key:
                return _error(401, "authentication_error", "x-api-key header is required")
            if key != config.require_key:
                return _error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    def parse(self, request: Request, raw: bytes, config: StandinConfig) -> Parsed | Response:
        def bad(message: str) -> Response:
            return _error(400, "invalid_request_error", message)

        body = parse_json_object(raw)
        if body is None:
            return bad("There was an error parsing the body of your request: expected a JSON object")
        unknown = sorted(set(body) - _KNOWN_FIELDS)
        if unknown:
            return bad(f"{unknown[0]}: Extra inputs are not permitted")
        for name in ("model", "messages", "max_tokens"):
            if name not in body:
                return bad(f"{name}: Field required")
        model = body["model"]
        if not isinstance(model, str) or not model:
            return bad("model: Input should be a valid string")
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return bad("max_tokens: Input should be a valid integer")
        if max_tokens < 1:
            return bad("max_tokens: Input should be greater than or equal to 1")
        temperature = body.get("temperature")
        if temperature is not None:
            if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
                return bad("temperature: Input should be a valid number")
            if not 0 <= temperature <= 1:
                return bad("temperature: range: 0..1")
        transcript: list[tuple[str, str]] = []
        system = body.get("system")
        if system is not None:
            text = text_of(system)
            if text is None:
                return bad("system: Input should be a valid string or a list of text blocks")
            if text:
                transcript.append(("system", text))
        messages = body["messages"]
        if not isinstance(messages, list):
            return bad("messages: Input should be a valid list")
        if not messages:
            return bad("messages: at least one message is required")
        used: set[str] = set()
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                return bad(f"messages.{i}: Input should be a valid dictionary")
            role = message.get("role")
            if role == "system":
                return bad(
                    'messages: Unexpected role "system". The Messages API accepts a top-level `system` '
                    'parameter, not "system" as an input message role.'
                )
            if role not in ("user", "assistant"):
                return bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            if "content" not in message:
                return bad(f"messages.{i}.content: Field required")
            tool_blocks = _tool_blocks(message["content"])
            if tool_blocks:
                turn = _tool_turn(role, tool_blocks, used, i)
                if isinstance(turn, str):
                    return bad(turn)
                transcript.append(turn)
                continue
            text = text_of(message["content"])
            if text is None:
                return bad(f"messages.{i}.content: Input should be a valid string or a list of content blocks")
            if not text and not (role == "assistant" and i == len(messages) - 1):
                return bad(
                    f"messages.{i}: all messages must have non-empty content except for the optional "
                    "final assistant message"
                )
            transcript.append((role, text))
        stream = body.get("stream") is True
        wants = _wants(body)
        if isinstance(wants, str):
            return bad(wants)
        return Parsed(model, transcript, max_tokens, stream, body=body, wants=wants)

    def unknown_model(self, parsed: Parsed) -> Response:
        return _error(404, "not_found_error", f"model: {parsed.model}")

    def context_overflow(self, parsed: Parsed, window: int) -> Response:
        message = f"prompt is too long: {parsed.input_tokens} tokens > {window} maximum"
        return _error(400, "invalid_request_error", message)

    def _limit_headers(self, state: StandinState) -> dict[str, str]:
        limit, remaining, reset = state.window_status(time.monotonic())
        if limit is None:
            limit, remaining = self.nominal_rpm, self.nominal_rpm - len(state.window)
        headers = {
            "anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": _rfc3339(reset),
        }
        for kind in ("tokens", "input-tokens", "output-tokens"):
            headers[f"anthropic-ratelimit-{kind}-limit"] = str(_NOMINAL_TOKENS)
            headers[f"anthropic-ratelimit-{kind}-remaining"] = str(_NOMINAL_TOKENS)
            headers[f"anthropic-ratelimit-{kind}-reset"] = _rfc3339(0)
        return headers

    def headers(self, state: StandinState, request_no: int) -> dict[str, str]:
        return {"request-id": _request_id(request_no), **self._limit_headers(state)}

    def rate_limited(self, parsed: Parsed, retry_after_s: float, state: StandinState) -> Response:
        headers = {**self._limit_headers(state), "retry-after": retry_after_header(retry_after_s)}
        return _error(
            429,
            "rate_limit_error",
            "This request would exceed the rate limit for your organization of "
            f"{state.config.rpm} requests per minute. Please reduce the request rate or try again later.",
            headers=headers,
        )

    def server_error(self, status: int) -> Response:
        if status == 529:
            return _error(529, "overloaded_error", "Overloaded")
        if status == 429:
            return _error(429, "rate_limit_error", "Number of concurrent connections has exceeded your rate limit.")
        if status >= 500:
            return _error(status, "api_error", "Internal server error")
        return _error(status, "invalid_request_error", "Request rejected")

    # --- replies ---------------------------------------------------------------------

    @staticmethod
    def _message(parsed: Parsed, reply: Reply, *, content: list[dict[str, Any]], stop_reason: str | None,
                 output_tokens: int) -> dict[str, Any]:  # fmt: skip
        return {
            "id": f"msg_standin{reply.request_no:012d}",
            "type": "message",
            "role": "assistant",
            "model": parsed.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": output_tokens,
                "service_tier": "standard",
            },
        }

    @staticmethod
    def _stop(reply: Reply) -> str:
        return "tool_use" if reply.calls else "max_tokens" if reply.truncated else "end_turn"

    def reply(self, parsed: Parsed, reply: Reply) -> Response:
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text or not reply.calls else []
        content += [{"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": c.arguments} for c in reply.calls]
        return JSONResponse(
            self._message(
                parsed, reply, content=content, stop_reason=self._stop(reply), output_tokens=reply.output_tokens,
            )  # fmt: skip
        )

    def _opening(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        start = self._message(parsed, reply, content=[], stop_reason=None, output_tokens=1)
        events = [
            sse({"type": "message_start", "message": start}, event="message_start"),
            sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                event="content_block_start",
            ),
            sse({"type": "ping"}, event="ping"),
        ]
        for piece in chunks:
            if piece:
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                events.append(sse(delta, event="content_block_delta"))
        return events

    def stream_events(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        events = self._opening(parsed, reply, chunks)
        stop = self._stop(reply)
        events.append(sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"))
        for index, c in enumerate(reply.calls, start=1):
            block = {"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": {}}
            events.append(sse({"type": "content_block_start", "index": index, "content_block": block},
                              event="content_block_start"))
            arguments = c.arguments_json
            for start in range(0, len(arguments), 8):
                delta = {"type": "input_json_delta", "partial_json": arguments[start:start + 8]}
                events.append(sse({"type": "content_block_delta", "index": index, "delta": delta},
                                  event="content_block_delta"))
            events.append(sse({"type": "content_block_stop", "index": index}, event="content_block_stop"))
        events += [
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": reply.output_tokens},
                },
                event="message_delta",
            ),
            sse({"type": "message_stop"}, event="message_stop"),
        ]
        return events

    def stream_failure(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        events = self._opening(parsed, reply, chunks[: max(1, len(chunks) // 2)])
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        events.append(sse(error, event="error"))
        return events
