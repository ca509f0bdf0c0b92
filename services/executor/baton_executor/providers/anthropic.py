"""Anthropic Messages API adapter."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..transport import Reply
from ._http import HttpProvider, arguments_object, int_or_zero, iter_sse, tool_turns
from .base import (
    AnswerSpec,
    ProviderCall,
    ProviderError,
    ProviderReply,
    ToolCall,
    parse_retry_after,
    parse_rfc3339_delay,
    sampling_fields,
)

ANTHROPIC_VERSION = "2023-06-01"
# Anthropic requires max_tokens even when the caller configured no default.
_REQUIRED_MAX_TOKENS_FALLBACK = 1024

_CONTEXT_OVERFLOW = re.compile(r"prompt is too long|context limit|context window|too many total text bytes", re.I)
_FINAL_STREAM_ERRORS = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
    }
)
_LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")


def _input_tokens(usage: Mapping[str, Any]) -> int:
    # With prompt caching, input_tokens counts only the uncached part; the
    # prompt the model saw is the sum of all three.
    return (
        int_or_zero(usage.get("input_tokens"))
        + int_or_zero(usage.get("cache_creation_input_tokens"))
        + int_or_zero(usage.get("cache_read_input_tokens"))
    )


def _turn(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One Messages API turn: tool results (all of one assistant turn's) go back in a user turn."""
    first = group[0]
    if first["role"] == "tool":
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                                             "content": m["content"]} for m in group]}
    if not first.get("tool_calls"):
        return {"role": first["role"], "content": first["content"]}
    blocks: list[dict[str, Any]] = [{"type": "text", "text": first["content"]}] if first["content"] else []
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": arguments_object(c["arguments"])}
               for c in first["tool_calls"]]
    return {"role": "assistant", "content": blocks}


def _spec_fields(spec: AnswerSpec) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if spec.tools:
        body["tools"] = [{"name": t.name, **({"description": t.description} if t.description else {}),
                          "input_schema": t.parameters, **({"strict": True} if t.strict else {})} for t in spec.tools]
    choice: dict[str, Any] | None = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"},
              "function": {"type": "tool", "name": spec.tool_choice_name}}.get(spec.tool_choice)
    if spec.parallel_tool_calls is False and spec.tool_choice != "none":
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        body["tool_choice"] = choice
    if spec.response_format == "json_schema":
        # Anthropic's structured outputs; json_object has no equivalent and is checked after the call.
        body["output_config"] = {"format": {"type": "json_schema", "schema": spec.schema or {}}}
    body.update(sampling_fields(spec, {"top_p": "top_p", "stop": "stop_sequences"}))
    if spec.user:
        body["metadata"] = {"user_id": spec.user}
    return body


class AnthropicProvider(HttpProvider):
    name = "anthropic"
    default_base_url = "https://api.anthropic.com"
    unsupported = frozenset({"seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The documented base has no version segment; accept a pasted ".../v1" too.
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _request(self, call: ProviderCall, *, stream: bool) -> tuple[str, dict[str, Any], None]:
        system = [m["content"] for m in call.messages if m["role"] == "system"]
        body: dict[str, Any] = {
            "model": call.model,
            "max_tokens": self._max_tokens(call) or _REQUIRED_MAX_TOKENS_FALLBACK,
            "messages": [_turn(group) for group in tool_turns([m for m in call.messages if m["role"] != "system"])],
        }
        if system:
            body["system"] = "\n\n".join(system)
        if call.temperature is not None:
            body["temperature"] = call.temperature
        body.update(_spec_fields(call.spec))
        if stream:
            body["stream"] = True
        return f"{self.base_url}/v1/messages", body, None

    def _parse_reply(self, body: Any, call: ProviderCall) -> ProviderReply:
        if not isinstance(body, dict) or body.get("type") == "error":
            raise ProviderError(f"{self.name}: reply was not a message", retryable=False)
        blocks = [b for b in body.get("content") or [] if isinstance(b, dict)]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        calls = tuple(ToolCall(id=b.get("id") or f"toolu_{i}", name=b.get("name") or "",
                               arguments=json.dumps(b.get("input") or {}))
                      for i, b in enumerate(blocks) if b.get("type") == "tool_use")
        usage = body.get("usage") or {}
        return ProviderReply(
            text=text,
            input_tokens=_input_tokens(usage),
            output_tokens=int_or_zero(usage.get("output_tokens")),
            model=body.get("model") or call.model,
            finish_reason=body.get("stop_reason"),
            tool_calls=calls,
        )

    async def _read_stream(self, reply: Reply, call: ProviderCall) -> ProviderReply:
        parts: list[str] = []
        calls: dict[int, dict[str, str]] = {}  # by block index: id and name at the start, input in pieces
        model: str | None = None
        input_tokens = 0
        output_tokens = 0
        stop_reason: str | None = None
        done = False
        async for event in iter_sse(reply):
            payload = self._decode_event(event.data)
            kind = payload.get("type") or event.event
            if kind == "message_start":
                message = payload.get("message") or {}
                model = message.get("model") or model
                usage = message.get("usage") or {}
                input_tokens = _input_tokens(usage)
                output_tokens = int_or_zero(usage.get("output_tokens"))
            elif kind == "content_block_start":
                block = payload.get("content_block") or {}
                if block.get("type") == "tool_use":
                    calls[int_or_zero(payload.get("index"))] = {"id": block.get("id") or "", "name": block.get("name") or "",
                                                               "input": ""}
            elif kind == "content_block_delta":
                delta = payload.get("delta") or {}
                if delta.get("type") == "text_delta":
                    parts.append(delta.get("text", ""))
                    call.emit(parts[-1])
                elif delta.get("type") == "input_json_delta" and int_or_zero(payload.get("index")) in calls:
                    calls[int_or_zero(payload.get("index"))]["input"] += delta.get("partial_json") or ""
            elif kind == "message_delta":
                stop_reason = (payload.get("delta") or {}).get("stop_reason") or stop_reason
                usage = payload.get("usage") or {}
                # message_delta usage is cumulative; newer API versions repeat input counts there.
                if "output_tokens" in usage:
                    output_tokens = int_or_zero(usage["output_tokens"])
                if "input_tokens" in usage:
                    input_tokens = _input_tokens(usage)
            elif kind == "message_stop":
                done = True
                break
            elif kind == "error":
                error = payload.get("error") or {}
                raise self._classify(None, error.get("type"), error.get("message") or "stream error", {}, payload)
            # ping, content_block_start/stop and future event types carry nothing we need.
        if not done:
            raise self._truncated_stream()
        return ProviderReply(
            text="".join(parts),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=model or call.model,
            finish_reason=stop_reason,
            tool_calls=tuple(ToolCall(id=c["id"] or f"toolu_{i}", name=c["name"], arguments=c["input"] or "{}")
                             for i, c in sorted(calls.items())),
        )

    # --- errors ------------------------------------------------------------------

    def _error_detail(self, body: Any) -> tuple[str | None, str | None]:
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
            return error.get("message"), error.get("type")
        return None, None

    def _is_context_overflow(self, status: int | None, code: str | None, message: str) -> bool:
        return status in (None, 400) and bool(_CONTEXT_OVERFLOW.search(message))

    def _is_auth_failure(self, status: int | None, code: str | None, body: Any) -> bool:
        return status in (401, 403) or code in ("authentication_error", "permission_error")

    def _is_permanent(self, status: int | None, code: str | None, message: str, body: Any) -> bool:
        # A 429 for a reached monthly spend limit lasts until the limit resets.
        error = body.get("error") if isinstance(body, dict) else None
        details = error.get("details") if isinstance(error, dict) else None
        return isinstance(details, dict) and details.get("error_code") == "enforced_spend_limit_reached"

    def _stream_error_retryable(self, code: str | None) -> bool:
        return code not in _FINAL_STREAM_ERRORS

    def _retry_after(self, headers: Mapping[str, str], body: Any) -> float | None:
        standard = parse_retry_after(headers)
        if standard is not None:
            return standard
        waits = []
        for limit in _LIMITS:
            if headers.get(f"anthropic-ratelimit-{limit}-remaining", "").strip() == "0":
                wait = parse_rfc3339_delay(headers.get(f"anthropic-ratelimit-{limit}-reset", ""))
                if wait is not None:
                    waits.append(wait)
        return max(waits) if waits else None
