"""Plumbing shared by the HTTP adapters: client ownership, request encoding, deadlines,
transport-error mapping, HTTP error classification and SSE parsing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from ..transport import Client, HttpxClient, ProviderClient, Reply, TransportError
from .base import (
    ProviderCall,
    ProviderError,
    ProviderReply,
    clip,
    parse_retry_after,
    redact,
    status_is_retryable,
    status_label,
)

_ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str


async def iter_sse(reply: Reply) -> AsyncIterator[SSEEvent]:
    """Server-sent events per the WHATWG rules that matter here: ``event``/``data``
    fields, multi-line data, comments, and any of CRLF/LF/CR line endings
    (Gemini terminates events with CRLF CRLF)."""
    event: str | None = None
    data: list[str] = []
    async for line in reply.lines():
        if line == "":
            if data:
                yield SSEEvent(event, "\n".join(data))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield SSEEvent(event, "\n".join(data))


class HttpProvider:
    """Base for the adapters. Subclasses implement request building and parsing."""

    name = "provider"
    default_base_url = ""
    # Request parameters (OpenAI's names) this API cannot honour.
    unsupported: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        stream: bool,
        client: Client | httpx.AsyncClient | None,
        max_output_tokens_default: int | None,
    ) -> None:
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.stream = stream
        self.max_output_tokens_default = max_output_tokens_default
        self._api_key = api_key or None
        self._client: Client | None = HttpxClient(client) if isinstance(client, httpx.AsyncClient) else client
        self._owns_client = client is None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.name!r}, base_url={self.base_url!r}, stream={self.stream})"

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = ProviderClient()
        return self._client

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # --- the public call ---------------------------------------------------------

    async def complete(self, call: ProviderCall) -> ProviderReply:
        self._check_call(call)
        try:
            # The client's timeouts bound each phase (connect, each read); the
            # deadline below bounds the whole call, including slow streams.
            async with asyncio.timeout(call.timeout_s):
                if self.stream or call.on_delta is not None:
                    return await self._complete_streaming(call)
                return await self._complete_plain(call)
        except TimeoutError:
            raise ProviderError(
                f"{self.name}: no complete reply within {call.timeout_s:g}s", retryable=True
            ) from None
        except TransportError as exc:
            raise self._transport_failure(exc, call) from None

    def _transport_failure(self, exc: TransportError, call: ProviderCall) -> ProviderError:
        detail = clip(redact(str(exc), self._api_key)) or "no detail"
        if exc.timeout:
            return ProviderError(f"{self.name}: {detail} (timeout {call.timeout_s:g}s)", retryable=True)
        if exc.bad_url:
            return ProviderError(f"{self.name}: bad base_url {self.base_url!r}: {detail}", retryable=False)
        return ProviderError(f"{self.name}: connection failed ({detail})", retryable=True)

    def _check_call(self, call: ProviderCall) -> None:
        if not call.messages:
            raise ProviderError(f"{self.name}: call has no messages", retryable=False)
        for index, message in enumerate(call.messages):
            role = message.get("role")
            if role not in _ROLES:
                raise ProviderError(
                    f"{self.name}: message {index} has unsupported role {role!r}"
                    " (expected system, user, assistant or tool)",
                    retryable=False,
                )
            if not isinstance(message.get("content"), str):
                raise ProviderError(f"{self.name}: message {index} content must be a string", retryable=False)
        refused = sorted(call.spec.given() & self.unsupported)
        if refused:
            # The client asked for it and would not get it: fail clearly (a fallback worker may take it).
            raise ProviderError(f"{self.name}: the provider's API has no equivalent of the request parameter "
                                f"{', '.join(refused)}", retryable=False)

    def _max_tokens(self, call: ProviderCall) -> int | None:
        return call.max_tokens if call.max_tokens is not None else self.max_output_tokens_default

    # --- transport ---------------------------------------------------------------

    def _post(self, call: ProviderCall, *, stream: bool) -> contextlib.AbstractAsyncContextManager[Reply]:
        url, body, params = self._request(call, stream=stream)
        if params:
            url = f"{url}?{urlencode(params)}"
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        headers = {"content-type": "application/json", **self._headers()}
        return self.client.post(url, content, headers, call.timeout_s)

    async def _complete_plain(self, call: ProviderCall) -> ProviderReply:
        async with self._post(call, stream=False) as reply:
            content = await reply.read()
            if reply.status >= 400:
                raise self._error_from_response(reply.status, reply.headers, content)
        return self._parse_reply(self._decode_json(content), call)

    async def _complete_streaming(self, call: ProviderCall) -> ProviderReply:
        async with self._post(call, stream=True) as reply:
            if reply.status >= 400:
                raise self._error_from_response(reply.status, reply.headers, await reply.read())
            if reply.headers.get("content-type", "").startswith("application/json"):
                # Some OpenAI-compatible servers ignore the stream flag.
                return self._parse_reply(self._decode_json(await reply.read()), call)
            return await self._read_stream(reply, call)

    def _decode_json(self, content: bytes) -> Any:
        try:
            return json.loads(content)
        except ValueError:
            raise ProviderError(f"{self.name}: reply was not valid JSON", retryable=False) from None

    def _decode_event(self, data: str) -> dict[str, Any]:
        try:
            payload = json.loads(data)
        except ValueError:
            raise ProviderError(f"{self.name}: stream carried a malformed event", retryable=True) from None
        if not isinstance(payload, dict):
            raise ProviderError(f"{self.name}: stream carried an unexpected event", retryable=True)
        return payload

    def _truncated_stream(self) -> ProviderError:
        return ProviderError(f"{self.name}: stream ended before the reply was complete", retryable=True)

    # --- errors ------------------------------------------------------------------

    def _error_from_response(self, status: int, headers: Mapping[str, str], content: bytes) -> ProviderError:
        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = None
        message, code = self._error_detail(body)
        if not message:
            text = content.decode("utf-8", errors="replace") if content else ""
            message = text or status_label(status)
        return self._classify(status, code, message, headers, body)

    def _classify(
        self,
        status: int | None,
        code: str | None,
        message: str,
        headers: Mapping[str, str],
        body: Any,
    ) -> ProviderError:
        detail = clip(redact(message, self._api_key))
        where = f"HTTP {status}" if status is not None else "in stream"
        if self._is_context_overflow(status, code, message):
            return ProviderError(
                f"{self.name}: prompt exceeds the model's context window ({where}): {detail}",
                retryable=False,
                status=status,
            )
        if self._is_auth_failure(status, code, body):
            what = "access denied for this API key" if status == 403 else "API key rejected"
            return ProviderError(f"{self.name}: {what} ({where}): {detail}", retryable=False, status=status)
        if status is not None:
            retryable = status_is_retryable(status)
            label = status_label(status)
        else:
            retryable = self._stream_error_retryable(code)
            label = "error"
        if retryable and self._is_permanent(status, code, message, body):
            retryable = False
            label = "quota or spend limit exhausted"
        retry_after = self._retry_after(headers, body) if retryable else None
        return ProviderError(
            f"{self.name}: {label} ({where}): {detail}",
            retryable=retryable,
            status=status,
            retry_after_s=retry_after,
        )

    def _retry_after(self, headers: Mapping[str, str], body: Any) -> float | None:
        return parse_retry_after(headers)

    # --- adapter hooks -----------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _request(self, call: ProviderCall, *, stream: bool) -> tuple[str, dict[str, Any], dict[str, str] | None]:
        raise NotImplementedError

    def _parse_reply(self, body: Any, call: ProviderCall) -> ProviderReply:
        raise NotImplementedError

    async def _read_stream(self, reply: Reply, call: ProviderCall) -> ProviderReply:
        raise NotImplementedError

    def _error_detail(self, body: Any) -> tuple[str | None, str | None]:
        """(message, machine-readable code or type) from an error body."""
        return None, None

    def _is_context_overflow(self, status: int | None, code: str | None, message: str) -> bool:
        return False

    def _is_auth_failure(self, status: int | None, code: str | None, body: Any) -> bool:
        return status in (401, 403)

    def _is_permanent(self, status: int | None, code: str | None, message: str, body: Any) -> bool:
        """A normally transient status that the body marks as permanent (billing)."""
        return False

    def _stream_error_retryable(self, code: str | None) -> bool:
        return True


def arguments_object(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object APIs other than OpenAI's want."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        raise ProviderError(f"tool call arguments are not JSON: {clip(arguments, 80)!r}", retryable=False) from None
    if not isinstance(value, dict):
        raise ProviderError("tool call arguments must be a JSON object", retryable=False)
    return value


def tool_turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive tool turns grouped: Anthropic and Gemini take all the results of one assistant turn's
    calls in a single user turn."""
    groups: list[list[dict[str, Any]]] = []
    for m in messages:
        if m["role"] == "tool" and groups and groups[-1][0]["role"] == "tool":
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def int_or_zero(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
