"""Gemini API (generativelanguage.googleapis.com, v1beta) adapter.

The key travels only in the ``x-goog-api-key`` header: a ``?key=`` query
parameter would end up in access logs and in the URL attribute of HTTP spans.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..transport import Reply
from ._http import HttpProvider, arguments_object, int_or_zero, iter_sse, tool_turns
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
    r"exceeds the maximum number of tokens|token count.*exceed|exceeds the context window|too many tokens",
    re.IGNORECASE,
)
_RETRYABLE_STATUSES = frozenset(
    {"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED", "UNKNOWN"}
)
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def _error_object(body: Any) -> dict[str, Any] | None:
    # streamGenerateContent without alt=sse wraps everything, errors included, in a list.
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return None


def _details(body: Any) -> list[dict[str, Any]]:
    error = _error_object(body)
    details = error.get("details") if error else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def _content(group: list[dict[str, Any]]) -> dict[str, Any]:
    first = group[0]
    if first["role"] == "tool":
        # Gemini matches a result to its call by the function's name.
        return {"role": "user", "parts": [{"functionResponse": {"name": m.get("name", ""),
                                                                "response": {"result": m["content"]}}} for m in group]}
    parts: list[dict[str, Any]] = [{"text": first["content"]}] if first["content"] or not first.get("tool_calls") else []
    parts += [{"functionCall": {"name": c["name"], "args": arguments_object(c["arguments"])}}
              for c in first.get("tool_calls") or ()]
    return {"role": "model" if first["role"] == "assistant" else "user", "parts": parts}


def _tool_fields(spec: AnswerSpec) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if spec.tools:
        body["tools"] = [{"functionDeclarations": [
            {"name": t.name, **({"description": t.description} if t.description else {}),
             "parametersJsonSchema": t.parameters} for t in spec.tools]}]
    mode = {"auto": "AUTO", "none": "NONE", "required": "ANY", "function": "ANY"}.get(spec.tool_choice)
    if mode:
        config: dict[str, Any] = {"mode": mode}
        if spec.tool_choice == "function":
            config["allowedFunctionNames"] = [spec.tool_choice_name]
        body["toolConfig"] = {"functionCallingConfig": config}
    return body


def _generation_fields(spec: AnswerSpec) -> dict[str, Any]:
    config = sampling_fields(spec, {"top_p": "topP", "seed": "seed", "presence_penalty": "presencePenalty",
                                    "frequency_penalty": "frequencyPenalty", "stop": "stopSequences",
                                    "logprobs": "responseLogprobs", "top_logprobs": "logprobs"})
    if spec.response_format:
        config["responseMimeType"] = "application/json"
        if spec.response_format == "json_schema":
            config["responseJsonSchema"] = spec.schema or {}
    return config


def _function_calls(candidates: list[Mapping[str, Any]]) -> tuple[ToolCall, ...]:
    calls = [p["functionCall"] for c in candidates for p in (c.get("content") or {}).get("parts") or []
             if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)]
    # The Developer API often leaves the id out; OpenAI's clients need one to answer the call by.
    return tuple(ToolCall(id=f.get("id") or f"call_{i}", name=f.get("name") or "", arguments=json.dumps(f.get("args") or {}))
                 for i, f in enumerate(calls))


def _logprobs(candidate: Mapping[str, Any]) -> tuple[TokenLogprob, ...]:
    result = candidate.get("logprobsResult") or {}
    tops = result.get("topCandidates") or []
    out = []
    for i, chosen in enumerate(result.get("chosenCandidates") or []):
        top = tops[i].get("candidates") or [] if i < len(tops) and isinstance(tops[i], dict) else []
        out.append(TokenLogprob(token=str(chosen.get("token", "")), logprob=float(chosen.get("logProbability") or 0.0),
                                top=tuple((str(a.get("token", "")), float(a.get("logProbability") or 0.0)) for a in top)))
    return tuple(out)


class GeminiProvider(HttpProvider):
    name = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    unsupported = frozenset({"logit_bias", "parallel_tool_calls"})

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if self._api_key:
            headers["x-goog-api-key"] = self._api_key
        return headers

    def _request(self, call: ProviderCall, *, stream: bool) -> tuple[str, dict[str, Any], dict[str, str] | None]:
        model = call.model.removeprefix("models/")
        system = [m["content"] for m in call.messages if m["role"] == "system"]
        body: dict[str, Any] = {
            "contents": [_content(group) for group in tool_turns([m for m in call.messages if m["role"] != "system"])]
        }
        if system:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
        config: dict[str, Any] = {}
        max_tokens = self._max_tokens(call)
        if max_tokens is not None:
            config["maxOutputTokens"] = max_tokens
        if call.temperature is not None:
            config["temperature"] = call.temperature
        config.update(_generation_fields(call.spec))
        body.update(_tool_fields(call.spec))
        if config:
            body["generationConfig"] = config
        method = "streamGenerateContent" if stream else "generateContent"
        url = f"{self.base_url}/v1beta/models/{quote(model, safe='-._~')}:{method}"
        return url, body, ({"alt": "sse"} if stream else None)

    @staticmethod
    def _candidate_text(candidate: Mapping[str, Any]) -> str:
        parts = (candidate.get("content") or {}).get("parts") or []
        # Thought summaries are not part of the answer.
        return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought"))

    @staticmethod
    def _output_tokens(usage: Mapping[str, Any]) -> int:
        # candidatesTokenCount leaves out thinking tokens, which are billed as output.
        return int_or_zero(usage.get("candidatesTokenCount")) + int_or_zero(usage.get("thoughtsTokenCount"))

    def _blocked(self, body: Mapping[str, Any]) -> ProviderError:
        reason = (body.get("promptFeedback") or {}).get("blockReason")
        if reason:
            return ProviderError(f"{self.name}: prompt blocked by the provider ({reason})", retryable=False)
        return ProviderError(f"{self.name}: reply had no candidates", retryable=False)

    def _parse_reply(self, body: Any, call: ProviderCall) -> ProviderReply:
        if not isinstance(body, dict):
            raise ProviderError(f"{self.name}: reply was not a JSON object", retryable=False)
        candidates = body.get("candidates") or []
        if not candidates:
            raise self._blocked(body)
        candidate = candidates[0]
        usage = body.get("usageMetadata") or {}
        return ProviderReply(
            text=self._candidate_text(candidate),
            input_tokens=int_or_zero(usage.get("promptTokenCount")),
            output_tokens=self._output_tokens(usage),
            model=body.get("modelVersion") or call.model,
            finish_reason=candidate.get("finishReason"),
            tool_calls=_function_calls([candidate]),
            logprobs=_logprobs(candidate),
        )

    async def _read_stream(self, reply: Reply, call: ProviderCall) -> ProviderReply:
        parts: list[str] = []
        usage: Mapping[str, Any] = {}
        finish_reason: str | None = None
        model: str | None = None
        last: dict[str, Any] = {}
        seen: list[Mapping[str, Any]] = []  # candidates of every chunk: function calls come whole, in any
        logprobs: list[TokenLogprob] = []
        async for event in iter_sse(reply):
            chunk = self._decode_event(event.data)
            if isinstance(chunk.get("error"), dict):
                message, code = self._error_detail(chunk)
                raise self._classify(None, code, message or "stream error", {}, chunk)
            last = chunk
            model = chunk.get("modelVersion") or model
            usage = chunk.get("usageMetadata") or usage
            for candidate in chunk.get("candidates") or []:
                if candidate.get("index", 0) != 0:
                    continue
                parts.append(self._candidate_text(candidate))
                call.emit(parts[-1])
                seen.append(candidate)
                logprobs.extend(_logprobs(candidate))
                finish_reason = candidate.get("finishReason") or finish_reason
        if finish_reason is None:
            if last and not last.get("candidates") and (last.get("promptFeedback") or {}).get("blockReason"):
                raise self._blocked(last)
            raise self._truncated_stream()
        return ProviderReply(
            text="".join(parts),
            input_tokens=int_or_zero(usage.get("promptTokenCount")),
            output_tokens=self._output_tokens(usage),
            model=model or call.model,
            finish_reason=finish_reason,
            tool_calls=_function_calls(seen),
            logprobs=tuple(logprobs),
        )

    # --- errors ------------------------------------------------------------------

    def _error_detail(self, body: Any) -> tuple[str | None, str | None]:
        error = _error_object(body)
        if error is None:
            return None, None
        return error.get("message"), error.get("status")

    def _is_context_overflow(self, status: int | None, code: str | None, message: str) -> bool:
        return status in (None, 400) and bool(_CONTEXT_OVERFLOW.search(message))

    def _is_auth_failure(self, status: int | None, code: str | None, body: Any) -> bool:
        if status in (401, 403) or code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            return True
        # An invalid key is a 400 INVALID_ARGUMENT whose ErrorInfo says API_KEY_INVALID.
        return any(d.get("@type") == _ERROR_INFO and d.get("reason") == "API_KEY_INVALID" for d in _details(body))

    def _stream_error_retryable(self, code: str | None) -> bool:
        return code in _RETRYABLE_STATUSES

    def _retry_after(self, headers: Mapping[str, str], body: Any) -> float | None:
        standard = parse_retry_after(headers)
        if standard is not None:
            return standard
        for detail in _details(body):
            if detail.get("@type") == _RETRY_INFO and isinstance(detail.get("retryDelay"), str):
                return parse_go_duration(detail["retryDelay"])
        return None
