"""OpenAI Chat Completions adapter; also serves OpenAI-compatible servers (vLLM, Ollama, Together)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..transport import Reply
from ._http import HttpProvider, int_or_zero, iter_sse
from .base import (
    AnswerSpec,
    ProviderCall,
    ProviderError,
    ProviderReply,
    TokenLogprob,
    ToolCall,
    parse_go_duration,
    parse_retry_after,
    sampling_fields,
)

_CONTEXT_OVERFLOW = re.compile(
    r"maximum context length|context_length_exceeded|maximum model length|context window|"
    r"too many tokens|prompt is too long",
    re.IGNORECASE,
)
# Mid-stream error types that describe the request itself, so a retry cannot help.
_FINAL_STREAM_ERRORS = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "insufficient_quota"}
)


_SAMPLING = {name: name for name in ("top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "logprobs",
                                      "top_logprobs")}


def _message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m["content"]}
    if m.get("tool_calls"):
        out["content"] = m["content"] or None
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in m["tool_calls"]]
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id", "")
    elif m.get("name"):
        out["name"] = m["name"]
    return out


def _spec_fields(spec: AnswerSpec) -> dict[str, Any]:
    """The answering step's options in Chat Completions' own words (the client's, passed through)."""
    body: dict[str, Any] = {}
    if spec.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description else {}),
            "parameters": t.parameters, **({"strict": True} if t.strict else {})}} for t in spec.tools]
    if spec.tool_choice == "function":
        body["tool_choice"] = {"type": "function", "function": {"name": spec.tool_choice_name}}
    elif spec.tool_choice:
        body["tool_choice"] = spec.tool_choice
    if spec.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = spec.parallel_tool_calls
    if spec.response_format == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif spec.response_format == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": spec.schema_name, "schema": spec.schema or {}, "strict": spec.schema_strict}}
    body.update(sampling_fields(spec, _SAMPLING))
    if spec.user:
        body["user"] = spec.user
    if spec.logit_bias:
        body["logit_bias"] = spec.logit_bias
    return body


def _logprobs(choice: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return tuple(
        TokenLogprob(token=str(t.get("token", "")), logprob=float(t.get("logprob") or 0.0),
                     top=tuple((str(a.get("token", "")), float(a.get("logprob") or 0.0))
                               for a in t.get("top_logprobs") or [] if isinstance(a, dict)))
        for t in content if isinstance(t, dict))


class OpenAIProvider(HttpProvider):
    name = "openai"
    default_base_url = "https://api.openai.com/v1"

    def __init__(self, *, compatible: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.compatible = compatible
        if compatible:
            self.name = "openai_compatible"

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def _request(self, call: ProviderCall, *, stream: bool) -> tuple[str, dict[str, Any], None]:
        body: dict[str, Any] = {"model": call.model, "messages": [_message(m) for m in call.messages]}
        body.update(_spec_fields(call.spec))
        max_tokens = self._max_tokens(call)
        if max_tokens is not None:
            # OpenAI's reasoning models reject the older max_tokens; most
            # compatible servers only know max_tokens.
            body["max_tokens" if self.compatible else "max_completion_tokens"] = max_tokens
        if call.temperature is not None:
            body["temperature"] = call.temperature
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return f"{self.base_url}/chat/completions", body, None

    def _parse_reply(self, body: Any, call: ProviderCall) -> ProviderReply:
        if not isinstance(body, dict):
            raise ProviderError(f"{self.name}: reply was not a JSON object", retryable=False)
        choices = body.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{self.name}: reply had no choices", retryable=False)
        choice = choices[0]
        message = choice.get("message") or {}
        text = message.get("content") or message.get("refusal") or ""
        usage = body.get("usage") or {}
        calls = tuple(
            ToolCall(id=c.get("id") or f"call_{i}", name=(c.get("function") or {}).get("name") or "",
                     arguments=(c.get("function") or {}).get("arguments") or "{}")
            for i, c in enumerate(message.get("tool_calls") or []) if isinstance(c, dict))
        return ProviderReply(
            text=text,
            input_tokens=int_or_zero(usage.get("prompt_tokens")),
            output_tokens=int_or_zero(usage.get("completion_tokens")),
            model=body.get("model") or call.model,
            finish_reason=choice.get("finish_reason"),
            tool_calls=calls,
            logprobs=_logprobs(choice),
        )

    async def _read_stream(self, reply: Reply, call: ProviderCall) -> ProviderReply:
        parts: list[str] = []
        refusal: list[str] = []
        calls: dict[int, dict[str, str]] = {}  # by index: a call's id and name come once, its arguments in pieces
        logprobs: list[TokenLogprob] = []
        usage: dict[str, Any] = {}
        finish_reason: str | None = None
        model: str | None = None
        done = False
        async for event in iter_sse(reply):
            if event.data.strip() == "[DONE]":
                done = True
                break
            chunk = self._decode_event(event.data)
            if chunk.get("error"):
                message, code = self._error_detail(chunk)
                raise self._classify(None, code, message or "stream error", {}, chunk)
            model = chunk.get("model") or model
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    parts.append(delta["content"])
                    call.emit(delta["content"])
                if delta.get("refusal"):
                    refusal.append(delta["refusal"])
                for piece in delta.get("tool_calls") or []:
                    call_so_far = calls.setdefault(int_or_zero(piece.get("index")), {"id": "", "name": "", "arguments": ""})
                    function = piece.get("function") or {}
                    call_so_far["id"] = piece.get("id") or call_so_far["id"]
                    call_so_far["name"] = function.get("name") or call_so_far["name"]
                    call_so_far["arguments"] += function.get("arguments") or ""
                logprobs.extend(_logprobs(choice))
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
            if chunk.get("usage"):
                usage = chunk["usage"]
        if not done:
            raise self._truncated_stream()
        return ProviderReply(
            text="".join(parts) or "".join(refusal),
            input_tokens=int_or_zero(usage.get("prompt_tokens")),
            output_tokens=int_or_zero(usage.get("completion_tokens")),
            model=model or call.model,
            finish_reason=finish_reason,
            tool_calls=tuple(ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}")
                             for i, c in sorted(calls.items())),
            logprobs=tuple(logprobs),
        )

    # --- errors ------------------------------------------------------------------

    def _error_detail(self, body: Any) -> tuple[str | None, str | None]:
        if not isinstance(body, dict):
            return None, None
        error = body.get("error")
        if isinstance(error, str):  # Ollama: {"error": "model 'x' not found"}
            return error, None
        if isinstance(error, dict):
            code = error.get("code")
            code = code if isinstance(code, str) else error.get("type")
            return error.get("message"), code
        # vLLM: {"object": "error", "message": ..., "type": ..., "code": 400}
        message = body.get("message")
        return (message, body.get("type")) if isinstance(message, str) else (None, None)

    def _is_context_overflow(self, status: int | None, code: str | None, message: str) -> bool:
        if code == "context_length_exceeded":
            return True
        return status in (None, 400, 413, 422) and bool(_CONTEXT_OVERFLOW.search(message))

    def _is_auth_failure(self, status: int | None, code: str | None, body: Any) -> bool:
        return status in (401, 403) or code == "invalid_api_key"

    def _is_permanent(self, status: int | None, code: str | None, message: str, body: Any) -> bool:
        # A 429 for an exhausted billing quota will not clear by waiting.
        return code == "insufficient_quota"

    def _stream_error_retryable(self, code: str | None) -> bool:
        return code not in _FINAL_STREAM_ERRORS

    def _retry_after(self, headers: Mapping[str, str], body: Any) -> float | None:
        standard = parse_retry_after(headers)
        if standard is not None:
            return standard
        waits = []
        for kind in ("requests", "tokens"):
            if headers.get(f"x-ratelimit-remaining-{kind}", "").strip() == "0":
                wait = parse_go_duration(headers.get(f"x-ratelimit-reset-{kind}", ""))
                if wait is not None:
                    waits.append(wait)
        return max(waits) if waits else None
