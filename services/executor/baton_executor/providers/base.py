"""The provider contract the executor core depends on, plus helpers shared by the adapters."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is its JSON Schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for, in OpenAI's terms: `arguments` is a JSON object as text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class AnswerSpec:
    """The client's wishes for the answering step beyond max_tokens and temperature. Each adapter
    sends what its API has a field for and refuses (`unsupported`) what it cannot honour."""

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = ""  # "", "auto", "none", "required" or "function" (with tool_choice_name)
    tool_choice_name: str = ""
    parallel_tool_calls: bool | None = None
    response_format: str = ""  # "", "json_object" or "json_schema"
    schema_name: str = ""
    schema: dict[str, Any] | None = None
    schema_strict: bool = False
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    user: str = ""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, int] | None = None

    def given(self) -> set[str]:
        """The names (OpenAI's) of the options this spec sets."""
        names = {"tools": bool(self.tools), "tool_choice": bool(self.tool_choice),
                 "parallel_tool_calls": self.parallel_tool_calls is False,  # True is every API's default
                 "response_format": bool(self.response_format), "top_p": self.top_p is not None,
                 "stop": bool(self.stop), "seed": self.seed is not None, "logprobs": self.logprobs,
                 "top_logprobs": bool(self.top_logprobs), "user": bool(self.user),
                 "presence_penalty": self.presence_penalty is not None,
                 "frequency_penalty": self.frequency_penalty is not None, "logit_bias": bool(self.logit_bias)}
        return {name for name, set_ in names.items() if set_}


NO_SPEC = AnswerSpec()


def sampling_fields(spec: AnswerSpec, names: Mapping[str, str]) -> dict[str, Any]:
    """The spec's sampling options that are set, under an API's field names (`names`: OpenAI's name ->
    the API's, for the options the API has)."""
    values = {"top_p": spec.top_p, "seed": spec.seed, "presence_penalty": spec.presence_penalty,
              "frequency_penalty": spec.frequency_penalty, "stop": list(spec.stop) or None,
              "logprobs": True if spec.logprobs else None,
              "top_logprobs": spec.top_logprobs if spec.logprobs and spec.top_logprobs else None}
    return {names[k]: v for k, v in values.items() if v is not None and k in names}


@dataclass(frozen=True)
class ProviderCall:
    model: str
    # Chat turns: role and content, and on tool exchanges `tool_calls` (dicts of id, name, arguments),
    # `tool_call_id` and `name`.
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    temperature: float | None = None
    timeout_s: float = 60.0
    spec: AnswerSpec = NO_SPEC
    # Receives each piece of the answer as the provider streams it; set, it makes the call stream.
    # Pieces of a call that later fails were still delivered: the caller decides what they are worth.
    on_delta: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def emit(self, text: str) -> None:
        if text and self.on_delta is not None:
            self.on_delta(text)


@dataclass(frozen=True)
class ProviderReply:
    text: str
    input_tokens: int
    output_tokens: int
    model: str
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


class ProviderError(Exception):
    """A failed provider call, already classified for the retry policy.

    ``reason`` is meant for humans and logs; adapters build it from redacted
    provider text, so it never carries credentials.
    """

    def __init__(
        self,
        reason: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.reason

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.reason!r}, retryable={self.retryable}, "
            f"status={self.status}, retry_after_s={self.retry_after_s})"
        )

    # Keyword-only constructor arguments would otherwise be lost when the
    # error crosses a process boundary (multiprocessing, pickled task results).
    def __reduce__(self):
        return (
            _rebuild_provider_error,
            (self.reason, self.retryable, self.status, self.retry_after_s),
        )


def _rebuild_provider_error(reason, retryable, status, retry_after_s) -> ProviderError:
    return ProviderError(reason, retryable=retryable, status=status, retry_after_s=retry_after_s)


@runtime_checkable
class Provider(Protocol):
    async def complete(self, call: ProviderCall) -> ProviderReply: ...

    async def aclose(self) -> None: ...


# --- helpers shared by the adapters -------------------------------------------------

REDACTED = "[redacted]"
# Providers echo a masked form of a rejected key (OpenAI: "sk-ab****wxyz"); even
# a partial key does not belong in logs or traces.
_MASKED_SECRET = re.compile(r"\S*\*{3,}\S*")
_MAX_REASON_DETAIL = 300


def redact(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, REDACTED)
    return _MASKED_SECRET.sub(REDACTED, text)


def clip(text: str, limit: int = _MAX_REASON_DETAIL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _non_negative(value: float) -> float | None:
    if math.isnan(value) or math.isinf(value):
        return None
    return max(0.0, value)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from the standard headers: ``retry-after-ms``, then ``retry-after``.

    ``retry-after`` may be delta-seconds or an HTTP date (RFC 9110).
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            value = _non_negative(float(raw_ms) / 1000.0)
            if value is not None:
                return value
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        return _non_negative(float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_go_duration(text: str) -> float | None:
    """Parse durations like ``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s`` into seconds."""
    text = text.strip()
    if not text:
        return None
    pos = 0
    total = 0.0
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * scale[match.group(2)]
        pos = match.end()
    if pos != len(text):
        return None
    return total


def parse_rfc3339_delay(text: str, *, now: float | None = None) -> float | None:
    from datetime import datetime

    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def status_label(status: int) -> str:
    labels = {
        400: "bad request",
        401: "authentication failed",
        403: "permission denied",
        404: "not found",
        408: "request timeout",
        409: "conflict",
        413: "request too large",
        422: "unprocessable request",
        429: "rate limited",
        500: "server error",
        502: "bad gateway",
        503: "service unavailable",
        504: "gateway timeout",
        529: "overloaded",
    }
    if status in labels:
        return labels[status]
    return "server error" if status >= 500 else "request rejected"


def status_is_retryable(status: int) -> bool:
    return status in (408, 409, 429) or status >= 500
