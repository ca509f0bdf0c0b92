"""OpenAI Chat Completions adapter; also serves OpenAI-compatible servers (vLLM, Ollama, Together)."""

from __future__ import annotations

import re
from typing import Any, Mapping

import httpx

from ._http import HttpProvider, int_or_zero, iter_sse
from .base import ProviderCall, ProviderError, ProviderReply, parse_go_duration, parse_retry_after

_CONTEXT_OVERFLOW = re.compile(
    r"maximum context length|context_length_exceeded|maximum model length|context window|"
    r"too many tokens|prompt is too long",
    re.IGNORECASE,
)
# Mid-stream error types that describe the request itself, so a retry cannot help.
_FINAL_STREAM_ERRORS = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "insufficient_quota"}
)


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
        body: dict[str, Any] = {
            "model": call.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in call.messages],
        }
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
        return ProviderReply(
            text=text,
            input_tokens=int_or_zero(usage.get("prompt_tokens")),
            output_tokens=int_or_zero(usage.get("completion_tokens")),
            model=body.get("model") or call.model,
            finish_reason=choice.get("finish_reason"),
        )

    async def _read_stream(self, response: httpx.Response, call: ProviderCall) -> ProviderReply:
        parts: list[str] = []
        refusal: list[str] = []
        usage: dict[str, Any] = {}
        finish_reason: str | None = None
        model: str | None = None
        done = False
        async for event in iter_sse(response):
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
