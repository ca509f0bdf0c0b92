"""Machinery shared by the stand-in servers: configuration, fault injection,
counters, the request pipeline and the deterministic echo reply.

Each API module supplies a :class:`Dialect` that knows its wire format; the
pipeline here decides *what* happens to a request (auth, validation, rate
limit, injected failure, success) in the same order for every API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .behaviour import Call, Wants, apply_stop, json_answer, tool_calls

RECENT_REQUESTS_KEPT = 100


@dataclass
class StandinConfig:
    """Behaviour knobs; all of them can also be changed at runtime via ``POST /_standin/config``."""

    latency_ms: float = 0.0  # before any answer, errors included
    chunk_delay_ms: float = 0.0  # between streamed chunks
    rpm: int | None = None  # requests allowed per window; None = unlimited
    window_s: float = 60.0  # length of the sliding rate-limit window
    require_key: str | None = field(default=None, repr=False)  # None = accept any key, or none
    fail_first: int = 0  # fail this many (valid, admitted) requests ...
    fail_status: int | None = None  # ... with this status (default: the API's overload status)
    fail_mid_stream: bool = False  # streaming requests selected to fail break after a 200 instead
    context_window: int | None = None  # whitespace tokens; None = the API's usual size
    models: tuple[str, ...] | None = None  # None = every model name exists

    def public(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["require_key"] = "(set)" if self.require_key else None
        data["models"] = list(self.models) if self.models is not None else None
        return data

    def updated(self, changes: dict[str, Any]) -> StandinConfig:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown stand-in option(s): {', '.join(unknown)}")
        values = dict(changes)
        if "models" in values and values["models"] is not None:
            values["models"] = tuple(values["models"])
        new = dataclasses.replace(self, **values)
        new.validate()
        return new

    def validate(self) -> None:
        if self.rpm is not None and self.rpm < 0:
            raise ValueError("rpm must be >= 0")
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        if self.latency_ms < 0 or self.chunk_delay_ms < 0 or self.fail_first < 0:
            raise ValueError("latency_ms, chunk_delay_ms and fail_first must be >= 0")
        if self.fail_status is not None and not 400 <= self.fail_status <= 599:
            raise ValueError("fail_status must be an HTTP error status")


@dataclass
class Parsed:
    """What a dialect extracted from a valid request."""

    model: str
    transcript: list[tuple[str, str]]  # (role as received, text), system first
    max_tokens: int | None
    stream: bool
    extra: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None  # the decoded request, kept for /_standin/requests
    wants: Wants = field(default_factory=Wants)  # tools, JSON mode, stop sequences, log-probabilities

    @property
    def input_tokens(self) -> int:
        return sum(count_tokens(text) for _, text in self.transcript)


@dataclass
class Reply:
    text: str
    input_tokens: int
    output_tokens: int
    truncated: bool  # stopped at max_tokens
    request_no: int
    calls: list[Call] = field(default_factory=list)  # the tool calls the model makes instead of answering
    logprobs: int | None = None  # alternatives per token when log-probabilities were asked for

    def token_logprobs(self, text: str | None = None) -> list[tuple[str, float, list[tuple[str, float]]]]:
        """(token, logprob, alternatives) per word piece of `text` (a streamed piece; the whole answer by
        default): made up, but well formed."""
        alternatives = self.logprobs or 0
        return [(piece, -0.25, ([(piece, -0.25)] + [(f"alt{k}", -2.0 - k) for k in range(1, alternatives)])[:alternatives])
                for piece in word_pieces(self.text if text is None else text)]


def count_tokens(text: str) -> int:
    return len(text.split())


def render_transcript(transcript: list[tuple[str, str]]) -> str:
    return " | ".join(f"{role}: {text}" for role, text in transcript)


def echo_text(model: str, transcript: list[tuple[str, str]]) -> str:
    return f"[{model}] saw: {render_transcript(transcript)}"


_PIECE = re.compile(r"\S+\s*|\s+")


def limit_words(text: str, max_tokens: int | None) -> tuple[str, int, bool]:
    """Cut ``text`` to ``max_tokens`` whitespace tokens; returns (text, tokens, truncated)."""
    count = count_tokens(text)
    if max_tokens is None or count <= max_tokens:
        return text, count, False
    words = [p for p in _PIECE.findall(text) if not p.isspace()]
    return "".join(words[:max_tokens]).rstrip(), max_tokens, True


def word_pieces(text: str) -> list[str]:
    """Words with their trailing whitespace: the stand-ins' tokens."""
    return _PIECE.findall(text)


def split_for_stream(text: str, max_chunks: int = 32) -> list[str]:
    """Pieces whose concatenation is exactly ``text``; a handful of words each."""
    pieces = _PIECE.findall(text)
    if not pieces:
        return [""]
    per_chunk = max(1, math.ceil(len(pieces) / max_chunks))
    return ["".join(pieces[i : i + per_chunk]) for i in range(0, len(pieces), per_chunk)]


class StandinState:
    """Counters, the sliding window and the fault budget. Only touched from the
    server's event loop, so no locking is needed."""

    def __init__(self, kind: str, config: StandinConfig) -> None:
        config.validate()
        self.kind = kind
        self.initial = config
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.config = self.initial
        self.window: deque[float] = deque()
        self.failures_left = self.config.fail_first
        self.counters = {
            "requests": 0,  # every call to the API endpoint
            "served": 0,  # successful replies (streams counted when started)
            "streamed": 0,
            "rate_limited": 0,  # 429s sent
            "injected_failures": 0,
            "rejected": 0,  # 4xx for auth/validation/unknown model/context too long
            "input_tokens": 0,
            "output_tokens": 0,
            "in_flight": 0,
            "max_in_flight": 0,
        }
        self.by_status: dict[str, int] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS_KEPT)
        self.started_at = time.time()

    def configure(self, changes: dict[str, Any]) -> None:
        self.config = self.config.updated(changes)
        if "fail_first" in changes:
            self.failures_left = self.config.fail_first

    def _expire(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self.window and self.window[0] <= horizon:
            self.window.popleft()

    def admit(self, now: float) -> float | None:
        """Record a request in the window, or return seconds until one would be admitted."""
        self._expire(now)
        rpm = self.config.rpm
        if rpm is not None and len(self.window) >= rpm:
            if rpm == 0:
                return self.config.window_s
            return max(0.001, self.window[0] + self.config.window_s - now)
        self.window.append(now)
        return None

    def window_status(self, now: float) -> tuple[int | None, int, float]:
        """(limit, remaining, seconds until the window has fully replenished)."""
        self._expire(now)
        rpm = self.config.rpm
        used = len(self.window)
        reset = (self.window[-1] + self.config.window_s - now) if self.window else 0.0
        if rpm is None:
            return None, 0, max(0.0, reset)
        return rpm, max(0, rpm - used), max(0.0, reset)

    def take_failure(self) -> bool:
        if self.failures_left > 0:
            self.failures_left -= 1
            return True
        return False

    def count_status(self, status: int) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1

    def stats(self) -> dict[str, Any]:
        limit, remaining, _ = self.window_status(time.monotonic())
        return {
            "kind": self.kind,
            **self.counters,
            "by_status": dict(self.by_status),
            "window": {"limit": limit, "used": len(self.window), "remaining": remaining if limit else None},
            "failures_left": self.failures_left,
            "uptime_s": round(time.time() - self.started_at, 3),
        }


class Dialect:
    """One API's wire format. Methods return Starlette responses or raw bytes."""

    kind = ""
    default_fail_status = 500
    default_context_window = 128_000
    nominal_rpm = 10_000  # advertised in rate-limit headers when no limit is configured

    def routes(self, endpoint: Callable) -> list[Route]:
        raise NotImplementedError

    def authenticate(self, request: Request, config: StandinConfig) -> Response | None:
        raise NotImplementedError

    def parse(self, request: Request, raw: bytes, config: StandinConfig) -> Parsed | Response:
        raise NotImplementedError

    def unknown_model(self, parsed: Parsed) -> Response:
        raise NotImplementedError

    def context_overflow(self, parsed: Parsed, window: int) -> Response:
        raise NotImplementedError

    def rate_limited(self, parsed: Parsed, retry_after_s: float, state: StandinState) -> Response:
        raise NotImplementedError

    def server_error(self, status: int) -> Response:
        raise NotImplementedError

    def reply(self, parsed: Parsed, reply: Reply) -> Response:
        raise NotImplementedError

    def stream_events(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        """The complete event stream for a successful reply."""
        raise NotImplementedError

    def stream_failure(self, parsed: Parsed, reply: Reply, chunks: list[str]) -> list[bytes]:
        """A stream that starts well and then reports a server-side failure."""
        raise NotImplementedError

    def stream_media_type(self, parsed: Parsed) -> str:
        return "text/event-stream"

    def headers(self, state: StandinState, request_no: int) -> dict[str, str]:
        return {}


def json_error(status: int, body: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def text_of(content: Any) -> str | None:
    """A message's text: a string, or a list of `{"type": "text", "text": ...}` parts (OpenAI and
    Anthropic both accept either); None for anything else, such as an image part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "".join(texts)
    return None


def parse_json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class StandinApp:
    """Runs the common pipeline around a dialect."""

    def __init__(self, dialect: Dialect, config: StandinConfig) -> None:
        self.dialect = dialect
        self.state = StandinState(dialect.kind, config)

    async def endpoint(self, request: Request) -> Response:
        state = self.state
        counters = state.counters
        counters["requests"] += 1
        request_no = counters["requests"]
        counters["in_flight"] += 1
        counters["max_in_flight"] = max(counters["max_in_flight"], counters["in_flight"])
        handed_to_stream = False
        try:
            response, stream = await self._handle(request, request_no)
            if stream is not None:
                handed_to_stream = True
                response = StreamingResponse(
                    self._release_after(stream),
                    media_type=self.dialect.stream_media_type(stream.parsed),
                    headers=stream.headers,
                )
            state.count_status(response.status_code)
            return response
        finally:
            if not handed_to_stream:
                counters["in_flight"] -= 1

    async def _handle(self, request: Request, request_no: int) -> tuple[Response, _Stream | None]:
        state, dialect = self.state, self.dialect
        config = state.config
        if config.latency_ms:
            await asyncio.sleep(config.latency_ms / 1000.0)
        raw = await request.body()
        denied = dialect.authenticate(request, config)
        if denied is not None:
            state.counters["rejected"] += 1
            return denied, None
        parsed = dialect.parse(request, raw, config)
        if isinstance(parsed, Response):
            state.counters["rejected"] += 1
            return parsed, None
        state.recent.append(
            {
                "n": request_no,
                "path": request.url.path,
                "model": parsed.model,
                "stream": parsed.stream,
                "transcript": [list(t) for t in parsed.transcript],
                "body": parsed.body,
                **parsed.extra,
            }
        )
        if config.models is not None and parsed.model not in config.models:
            state.counters["rejected"] += 1
            return dialect.unknown_model(parsed), None
        window = config.context_window or dialect.default_context_window
        if parsed.input_tokens > window:
            state.counters["rejected"] += 1
            return dialect.context_overflow(parsed, window), None
        wait = state.admit(time.monotonic())
        if wait is not None:
            state.counters["rate_limited"] += 1
            return dialect.rate_limited(parsed, wait, state), None
        fail = state.take_failure()
        if fail and not (parsed.stream and config.fail_mid_stream):
            state.counters["injected_failures"] += 1
            return dialect.server_error(config.fail_status or dialect.default_fail_status), None

        wants = parsed.wants
        calls = tool_calls(wants, parsed.transcript, request_no)
        echo = echo_text(parsed.model, parsed.transcript)
        text, _ = apply_stop("" if calls else json_answer(wants, parsed.transcript, echo) or echo, wants.stop)
        text, output_tokens, truncated = limit_words(text, parsed.max_tokens)
        if calls:
            output_tokens = sum(count_tokens(c.name + " " + c.arguments_json) for c in calls)
        reply = Reply(text, parsed.input_tokens, output_tokens, truncated, request_no, calls=calls,
                      logprobs=wants.logprobs)
        headers = dialect.headers(state, request_no)
        if not parsed.stream:
            state.counters["served"] += 1
            state.counters["input_tokens"] += reply.input_tokens
            state.counters["output_tokens"] += reply.output_tokens
            response = dialect.reply(parsed, reply)
            response.headers.update(headers)
            return response, None
        chunks = split_for_stream(reply.text)
        if fail:
            state.counters["injected_failures"] += 1
            events = dialect.stream_failure(parsed, reply, chunks)
        else:
            state.counters["served"] += 1
            state.counters["streamed"] += 1
            state.counters["input_tokens"] += reply.input_tokens
            state.counters["output_tokens"] += reply.output_tokens
            events = dialect.stream_events(parsed, reply, chunks)
        return Response(status_code=200), _Stream(parsed, events, headers, config.chunk_delay_ms)

    async def _release_after(self, stream: _Stream) -> AsyncIterator[bytes]:
        try:
            for index, event in enumerate(stream.events):
                if index and stream.delay_ms:
                    await asyncio.sleep(stream.delay_ms / 1000.0)
                yield event
        finally:
            self.state.counters["in_flight"] -= 1

    # --- control routes ------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        return JSONResponse(self.state.stats())

    async def recent(self, request: Request) -> Response:
        return JSONResponse({"requests": list(self.state.recent)})

    async def config(self, request: Request) -> Response:
        if request.method == "POST":
            changes = parse_json_object(await request.body())
            if changes is None:
                return JSONResponse({"error": "expected a JSON object of options"}, status_code=400)
            try:
                self.state.configure(changes)
            except (TypeError, ValueError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(self.state.config.public())

    async def reset(self, request: Request) -> Response:
        self.state.reset()
        return JSONResponse({"reset": True, "config": self.state.config.public()})

    def control_routes(self, prefix: str = "") -> list[Route]:
        base = f"{prefix}/_standin"
        return [
            Route(f"{base}/stats", self.stats, methods=["GET"]),
            Route(f"{base}/requests", self.recent, methods=["GET"]),
            Route(f"{base}/config", self.config, methods=["GET", "POST"]),
            Route(f"{base}/reset", self.reset, methods=["POST"]),
        ]


@dataclass
class _Stream:
    parsed: Parsed
    events: list[bytes]
    headers: dict[str, str]
    delay_ms: float


def sse(data: Any, *, event: str | None = None, terminator: str = "\n\n") -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}{terminator}".encode()
