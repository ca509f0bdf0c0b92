"""Log lines: JSON joined to the current trace, text for a terminal, secrets masked in both."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from baton_platform.logs import FORMAT_ENV, JsonLines, RedactedText, Redactor, configure_logging, log_format


def written(formatter: logging.Formatter, emit) -> list[str]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("baton.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_a_json_line_inside_a_span_carries_its_trace_and_one_outside_does_not():
    # Spans of a provider that records nothing (export off) still carry the ids that travel in headers.
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t")
    spans = []

    def emit(log):
        log.info("outside")
        with tracer.start_as_current_span("handle") as span:
            log.warning("request %s planned", "r-1")
            spans.append(span.get_span_context())

    outside, inside = (json.loads(line) for line in written(JsonLines("baton-router", Redactor()), emit))
    assert set(outside) == {"time", "level", "service", "logger", "event"}
    assert outside["time"].endswith("Z") and outside["level"] == "info" and outside["service"] == "baton-router"
    assert inside["event"] == "request r-1 planned" and inside["level"] == "warning"
    assert inside["trace_id"] == format(spans[0].trace_id, "032x")
    assert inside["span_id"] == format(spans[0].span_id, "016x")


def test_an_exception_is_one_json_line_with_its_traceback():
    def emit(log):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("task t failed")

    (line,) = written(JsonLines("baton-executor-sim", Redactor()), emit)
    parsed = json.loads(line)
    assert parsed["event"] == "task t failed" and "RuntimeError: boom" in parsed["error"]


@pytest.mark.parametrize("formatter", ["json", "text"])
def test_secrets_and_credentials_never_reach_a_line(formatter):
    redact = Redactor(["sk-provider-51d2e8", "x1"])  # a value too short to be a secret is left alone
    chosen = JsonLines("gw", redact) if formatter == "json" else RedactedText(redact)

    def emit(log):
        log.info("calling with key sk-provider-51d2e8 (x1)")
        log.info("header Authorization: Bearer caller-key-7f3a9c")
        log.info("broker at sasl://user:hunter2-pass@kafka:9093")
        try:
            raise ValueError("bad key sk-provider-51d2e8")
        except ValueError:
            log.exception("failed")

    text = "\n".join(written(chosen, emit))
    for secret in ("sk-provider-51d2e8", "caller-key-7f3a9c", "hunter2-pass"):
        assert secret not in text
    assert "Bearer [redacted]" in text and "user:[redacted]@kafka" in text and "(x1)" in text


def test_the_format_follows_the_setting_and_a_terminal(monkeypatch):
    monkeypatch.delenv(FORMAT_ENV, raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert log_format() == "text"
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert log_format() == "json"
    monkeypatch.setenv(FORMAT_ENV, "TEXT")
    assert log_format() == "text"
    monkeypatch.setenv(FORMAT_ENV, "yaml")
    with pytest.raises(ValueError, match="BATON_LOG_FORMAT='yaml' is not a log format; use one of json, text"):
        log_format()


def test_configuring_twice_keeps_one_handler_and_brings_library_loggers_to_it():
    root = logging.getLogger()
    own = logging.getLogger("faststream.test.own")
    own.addHandler(logging.StreamHandler(io.StringIO()))
    own.propagate = False
    try:
        configure_logging("a", fmt="json")
        configure_logging("b", fmt="json")
        ours = [h for h in root.handlers if getattr(h, "baton", False)]
        assert len(ours) == 1 and ours[0].formatter.service == "b" and ours[0].level == logging.INFO
        assert own.handlers == [] and own.propagate
    finally:
        for handler in [h for h in root.handlers if getattr(h, "baton", False)]:
            root.removeHandler(handler)
        logging.getLogger("httpx").setLevel(logging.NOTSET)
