"""A service's log lines: one JSON object per line for a log collector, plain text for a person.

Each JSON line carries `time` (UTC, ISO 8601), `level`, `service`, `logger` and `event` (the message),
plus `trace_id` and `span_id` when the line is written inside a span (a record being handled, an HTTP
request), so that a line joins its trace in any backend. An exception adds `error` (its traceback).

BATON_LOG_FORMAT chooses `json` or `text`; unset, a terminal gets text and anything else (a file, a
pipe, a container's stdout) gets JSON. Every line passes through `Redactor`: the secrets the service
was configured with (provider keys, Kafka passwords) and bearer tokens never reach the output, whatever
a library put in its message.

Prompts and answers are never logged: per-request lines name the request, workers and outcomes only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable

from opentelemetry import trace

FORMAT_ENV = "BATON_LOG_FORMAT"
FORMATS = ("json", "text")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Credentials a library may echo (an Authorization header, a URL's user:password): masked by shape.
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_URL_PASSWORD = re.compile(r"(//[^/\s:@]+:)[^/\s@]+@")
_HIDDEN = "[redacted]"


class Redactor:
    """Masks known secret values and credential-shaped text in a log line."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole; short values (a stray "1")
        # would mask ordinary text and are not secrets anyone configures.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, _HIDDEN)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {_HIDDEN}", text)
        return _URL_PASSWORD.sub(rf"\1{_HIDDEN}@", text)


class JsonLines(logging.Formatter):
    """One JSON object per record, joined to the current span's trace."""

    def __init__(self, service: str, redact: Redactor) -> None:
        super().__init__()
        self.service = service
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "event": self.redact(record.getMessage()),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = trace.format_trace_id(span.trace_id)
            line["span_id"] = trace.format_span_id(span.span_id)
        if record.exc_info:
            line["error"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


class RedactedText(logging.Formatter):
    def __init__(self, redact: Redactor) -> None:
        super().__init__(_TEXT)
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


def log_format(value: str | None = None) -> str:
    """The format to write: `value`, else BATON_LOG_FORMAT, else text on a terminal and JSON elsewhere."""
    chosen = (value or os.environ.get(FORMAT_ENV) or "").strip().lower()
    if not chosen:
        return "text" if sys.stderr.isatty() else "json"
    if chosen not in FORMATS:
        raise ValueError(f"{FORMAT_ENV}={chosen!r} is not a log format; use one of {', '.join(FORMATS)}")
    return chosen


def configure_logging(service: str, secrets: Iterable[str] = (), fmt: str | None = None) -> None:
    """Send every logger's INFO and above to stderr in the chosen format, with `secrets` masked.

    httpx stays at WARNING: at INFO it writes a line per provider call with its URL, a line per step at
    full traffic (5% of the executor's CPU in `make bench`'s profile)."""
    redact = Redactor(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)  # loggers set to DEBUG (FastStream's per-record lines) stop here
    handler.setFormatter(JsonLines(service, redact) if log_format(fmt) == "json" else RedactedText(redact))
    root = logging.getLogger()
    for earlier in [h for h in root.handlers if getattr(h, "baton", False)]:
        root.removeHandler(earlier)
    handler.baton = True  # type: ignore[attr-defined]  # called again, this one is replaced
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # a library's warning is a line like any other, not raw text
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # FastStream and uvicorn give their loggers handlers of their own (coloured text on stdout): their
    # lines go through this one instead.
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("faststream", "uvicorn"):
            own = logging.getLogger(name)
            own.handlers.clear()
            own.propagate = True
