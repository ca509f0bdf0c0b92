"""Stand-in for the Gemini API (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent``)."""

from __future__ import annotations

import json
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
)

# The API speaks protobuf JSON, which accepts both spellings of every field.
_KNOWN_FIELDS = frozenset(
    {
        "contents", "systemInstruction", "system_instruction", "generationConfig", "generation_config",
        "safetySettings", "safety_settings", "tools", "toolConfig", "tool_config", "cachedContent",
        "cached_content",
    }
)  # fmt: skip
_KNOWN_GENERATION_FIELDS = frozenset(
    {
        "maxOutputTokens", "max_output_tokens", "temperature", "topP", "top_p", "topK", "top_k",
        "candidateCount", "candidate_count", "stopSequences", "stop_sequences", "responseMimeType",
        "response_mime_type", "responseSchema", "response_schema", "responseJsonSchema",
        "response_json_schema", "presencePenalty", "presence_penalty", "frequencyPenalty",
        "frequency_penalty", "seed", "responseLogprobs", "response_logprobs", "logprobs",
        "thinkingConfig", "thinking_config", "responseModalities", "response_modalities",
        "mediaResolution", "media_resolution", "speechConfig", "speech_config",
    }
)  # fmt: skip
_METHODS = ("generateContent", "streamGenerateContent")
_SEPARATOR = "\r\n\r\n"  # Gemini ends each SSE event with CRLF CRLF


def _status_error(code: int, status: str, message: str, details: list[dict[str, Any]] | None = None,
                  headers: dict[str, str] | None = None) -> JSONResponse:  # fmt: skip
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return json_error(code, {"error": error}, headers)


def _invalid(message: str) -> JSONResponse:
    return _status_error(400, "INVALID_ARGUMENT", message)


def _unknown_field(name: str, where: str | None = None) -> JSONResponse:
    at = f" at '{where}'" if where else ""
    message = f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.'
    return _status_error(
        400,
        "INVALID_ARGUMENT",
        message,
        [{"@type": "type.googleapis.com/google.rpc.BadRequest",
          "fieldViolations": [{"field": where or "", "description": message}]}],
    )  # fmt: skip


def _field(body: dict[str, Any], camel: str, snake: str) -> Any:
    return body[camel] if camel in body else body.get(snake)


def _parts_text(content: Any, where: str) -> str | JSONResponse:
    if not isinstance(content, dict):
        return _invalid(f"* GenerateContentRequest.{where}: must be an object\n")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        return _invalid(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.\n")
    texts: list[str] = []
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            texts.append(f"[{call.get('name')}({json.dumps(call.get('args') or {})})]")
        elif isinstance(part, dict) and isinstance(part.get("functionResponse"), dict):
            answer = part["functionResponse"]
            if not isinstance(answer.get("name"), str) or not answer["name"]:
                return _invalid(f"* GenerateContentRequest.{where}.parts.function_response.name: Name cannot be empty.\n")
            result = answer.get("response")
            texts.append(result["result"] if isinstance(result, dict) and isinstance(result.get("result"), str)
                         else json.dumps(result))
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            return _invalid(f"* GenerateContentRequest.{where}.parts: only text and function parts are supported by "
                            "the stand-in\n")
    return "".join(texts)


def _answers_calls(content: Any) -> bool:
    parts = content.get("parts") if isinstance(content, dict) else None
    return isinstance(parts, list) and any(isinstance(p, dict) and "functionResponse" in p for p in parts)


def _wants(body: dict[str, Any], config: dict[str, Any]) -> Wants | JSONResponse:
    wants = Wants()
    for group in body.get("tools") or []:
        for f in (group.get("functionDeclarations") or group.get("function_declarations") or []
                  if isinstance(group, dict) else []):
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                return _invalid("* GenerateContentRequest.tools[0].function_declarations: name is required\n")
            wants.tools.append((f["name"], f.get("parametersJsonSchema") or f.get("parameters") or {}))
    calling = (_field(body, "toolConfig", "tool_config") or {}).get("functionCallingConfig") or {}
    mode = calling.get("mode", "AUTO")
    allowed = calling.get("allowedFunctionNames") or []
    if mode == "ANY" and len(allowed) == 1:
        wants.tool_choice = allowed[0]
    else:
        wants.tool_choice = {"AUTO": "auto", "ANY": "required", "NONE": "none"}.get(mode, "auto")
    if _field(config, "responseMimeType", "response_mime_type") == "application/json":
        schema = _field(config, "responseJsonSchema", "response_json_schema") or _field(config, "responseSchema",
                                                                                       "response_schema")
        wants.json_mode, wants.schema = ("schema", schema) if schema else ("object", None)
    wants.stop = [x for x in _field(config, "stopSequences", "stop_sequences") or [] if isinstance(x, str)]
    if _field(config, "responseLogprobs", "response_logprobs"):
        wants.logprobs = int(config.get("logprobs") or 0)
    return wants


class GeminiDialect(Dialect):
    kind = "gemini"
    default_fail_status = 503
    default_context_window = 1_048_576

    def routes(self, endpoint: Callable) -> list[Route]:
        return [Route("/v1beta/models/{target:path}", endpoint, methods=["POST"])]

    def authenticate(self, request: Request, config: StandinConfig) -> Response | None:
        if not config.require_key:
            return None
        key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
        if not key:
            return _status_error(
                403,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established identity). "
                "Please use API Key or other form of API consumer identity to call this API.",
            )
        if key != config.require_key:
            return _status_error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                        "metadata": {"service": "generativelanguage.googleapis.com"},
                    }
                ],
            )
        return None

    def parse(self, request: Request, raw: bytes, config: StandinConfig) -> Parsed | Response:
        target = request.path_params.get("target", "")
        model, _, method = target.rpartition(":")
        if not model or method not in _METHODS:
            return _status_error(404, "NOT_FOUND", f"Method not found: models/{target}")
        body = parse_json_object(raw)
        if body is None:
            return _invalid("Invalid JSON payload received. Expected an object.")
        for name in body:
            if name not in _KNOWN_FIELDS:
                return _unknown_field(name)
        transcript: list[tuple[str, str]] = []
        system = _field(body, "systemInstruction", "system_instruction")
        if system is not None:
            text = _parts_text(system, "system_instruction")
            if isinstance(text, Response):
                return text
            transcript.append(("system", text))
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            return _invalid("* GenerateContentRequest.contents: contents is not specified\n")
        for i, content in enumerate(contents):
            role = content.get("role", "user") if isinstance(content, dict) else None
            if role not in ("user", "model"):
                return _invalid("Please use a valid role: user, model.")
            text = _parts_text(content, f"contents[{i}]")
            if isinstance(text, Response):
                return text
            transcript.append(("tool_result" if _answers_calls(content) else role, text))
        config_body = _field(body, "generationConfig", "generation_config") or {}
        if not isinstance(config_body, dict):
            return _invalid("Invalid value at 'generation_config': expected an object")
        for name in config_body:
            if name not in _KNOWN_GENERATION_FIELDS:
                return _unknown_field(name, "generation_config")
        max_tokens = _field(config_body, "maxOutputTokens", "max_output_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            return _invalid(f"Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), {max_tokens!r}")
        temperature = config_body.get("temperature")
        if temperature is not None:
            if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
                return _invalid(f"Invalid value at 'generation_config.temperature' (TYPE_FLOAT), {temperature!r}")
            if not 0 <= temperature <= 2:
                return _invalid(
                    "* GenerateContentRequest.generation_config.temperature: must be in the range [0.0, 2.0]\n"
                )
        stream = method == "streamGenerateContent"
        extra = {
            "sse": request.query_params.get("alt") == "sse",
            "key_in_query": "key" in request.query_params,
        }
        wants = _wants(body, config_body)
        if isinstance(wants, Response):
            return wants
        return Parsed(model.removeprefix("models/"), transcript, max_tokens or None, stream, extra=extra, body=body,
                      wants=wants)

    def unknown_model(self, parsed: Parsed) -> Response:
        return _status_error(
            404,
            "NOT_FOUND",
            f"models/{parsed.model} is not found for API version v1beta, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their supported methods.",
        )

    def context_overflow(self, parsed: Parsed, window: int) -> Response:
        return _invalid(
            f"The input token count ({parsed.input_tokens}) exceeds the maximum number of tokens allowed ({window})."
        )

    def rate_limited(self, parsed: Parsed, retry_after_s: float, state: StandinState) -> Response:
        delay = retry_after_header(retry_after_s)
        details: list[dict[str, Any]] = [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                        "quotaDimensions": {"location": "global", "model": parsed.model},
                        "quotaValue": str(state.config.rpm),
                    }
                ],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{delay}s"},
        ]
        # Google itself reports the delay only in RetryInfo; the header is a
        # convenience for clients that only read headers.
        return _status_error(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. For more information "
            "on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
            details,
            headers={"retry-after": delay},
        )

    def server_error(self, status: int) -> Response:
        if status == 503:
            return _status_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
        if status == 429:
            return _status_error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).")
        if status == 504:
            return _status_error(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete.")
        if status >= 500:
            return _status_error(
                status,
                "INTERNAL",
                "An internal error has occurred. Please retry or report in "
                "https://developers.generativeai.google/guide/troubleshooting",
            )
        return _status_error(status, "FAILED_PRECONDITION", "Request rejected")

    # --- replies ---------------------------------------------------------------------

    @staticmethod
    def _usage(reply: Reply, output_tokens: int | None) -> dict[str, Any]:
        usage: dict[str, Any] = {"promptTokenCount": reply.input_tokens}
        if output_tokens is not None:
            usage["candidatesTokenCount"] = output_tokens
        usage["totalTokenCount"] = reply.input_tokens + (output_tokens or 0)
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": reply.input_tokens}]
        return usage

    def _response(self, parsed: Parsed, reply: Reply, text: str, finish: str | None,
                  output_tokens: int | None) -> dict[str, Any]:  # fmt: skip
        parts: list[dict[str, Any]] = [{"text": text}] if text or not reply.calls else []
        if finish:  # function calls come whole, with the last chunk
            parts += [{"functionCall": {"name": c.name, "args": c.arguments}} for c in reply.calls]
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish:
            candidate["finishReason"] = finish
        if reply.logprobs is not None and text:
            chosen = reply.token_logprobs(text)
            candidate["logprobsResult"] = {
                "topCandidates": [{"candidates": [{"token": a, "logProbability": alp} for a, alp in top]}
                                  for _, _, top in chosen],
                "chosenCandidates": [{"token": t, "logProbability": lp} for t, lp, _ in chosen]}
        candidate["index"] = 0
        return {
            "candidates": [candidate],
            "usageMetadata": self._usage(reply, output_tokens),
            "modelVersion": parsed.model,
            "responseId": f"standin{reply.request_no:012d}",
        }

    def reply(self, parsed: Parsed, reply: Reply) -> Response:
        finish = "MAX_TOKENS" if reply.truncated and not reply.calls else "STOP"
        return JSONResponse(self._response(parsed, reply, reply.text, finish, reply.output_tokens))

    def _chunks(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[dict[str, Any]]:
        finish = "MAX_TOKENS" if reply.truncated else "STOP"
        out = []
        for i, piece in enumerate(chunks):
            last = i == len(chunks) - 1
            out.append(
                self._response(parsed, reply, piece, finish if last else None, reply.output_tokens if last else None)
            )
        return out

    def _encode(self, parsed: Parsed, chunks: list[dict[str, Any]]) -> list[bytes]:
        if parsed.extra.get("sse"):
            return [sse(chunk, terminator=_SEPARATOR) for chunk in chunks]
        # Without alt=sse the method streams one JSON array.
        text = json.dumps(chunks, indent=2)
        return [text.encode()]

    def stream_media_type(self, parsed: Parsed) -> str:
        return "text/event-stream" if parsed.extra.get("sse") else "application/json"

    def stream_events(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        return self._encode(parsed, self._chunks(parsed, reply, chunks))

    def stream_failure(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        head = self._chunks(parsed, reply, chunks)[: max(1, len(chunks) // 2)]
        for chunk in head:
            chunk["candidates"][0].pop("finishReason", None)
        error = {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",
                           "status": "UNAVAILABLE"}}  # fmt: skip
        return self._encode(parsed, [*head, error])
