"""Per-hop latency from the services' own trace spans.

The services export spans over OTLP/HTTP (the standard OTEL_* variables, see baton_platform.telemetry)
to a small receiver in the bench process; a sampler keeps a fraction of workflows, whole (the gateway
decides, every later service follows the parent's choice through the Kafka headers). Spans are kept
only while `collecting` is on, then grouped by trace into the hops of one workflow.
"""

from __future__ import annotations

import gzip
import threading
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from loadgen import percentile
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_OK = ExportTraceServiceResponse().SerializeToString()
# OTLP's span kinds (opentelemetry.proto.trace.v1.Span.SpanKind).
SERVER, PRODUCER, CONSUMER = 2, 4, 5


@dataclass(frozen=True)
class Span:
    trace_id: str
    service: str
    name: str
    kind: int
    start_ns: int
    end_ns: int


class SpanReceiver:
    """An OTLP/HTTP trace endpoint on loopback; `endpoint` goes into OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self) -> None:
        self.collecting = False
        self.spans: list[Span] = []
        self.received = 0  # spans seen, collected or not: shows the export works at all
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server interface)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(_OK)))
                self.end_headers()
                self.wfile.write(_OK)

            def log_message(self, *args) -> None:
                pass  # one line per export batch would drown the bench's progress

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> SpanReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        spans = []
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "?")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(Span(s.trace_id.hex(), service, s.name, s.kind, s.start_time_unix_nano,
                                      s.end_time_unix_nano))
        with self._lock:
            self.received += len(spans)
            if self.collecting:
                self.spans.extend(spans)

    def take(self) -> list[Span]:
        with self._lock:
            spans, self.spans = self.spans, []
        return spans


def _role(service: str) -> str:
    """The service's part in the path: `baton-executor-openai_compatible` is an executor."""
    name = service.removeprefix("baton-")
    return "executor" if name.startswith("executor") else name


# Spans inside one service that the table shows beside the path ("of which ...").
_INNER = {("router", "plan"): "of which: the router's plan", ("executor", "chat "): "of which: the provider call"}


def workflow_hops(spans: list[Span]) -> list[list[tuple[str, float]]]:
    """Each complete sampled workflow as its ordered hops: (hop name, milliseconds).

    A workflow's path is read off its Kafka spans in time order: every `<topic> process` span
    (consumer) is matched to the `<topic> publish` span (producer) of the same topic in the same
    trace that started last before it. "A → B (Kafka)" is the time from A starting to publish to
    B starting to process (producer batching, broker, consumer poll); "in B" is from B starting to
    process a message to B starting to publish the next one. The gateway's ends are its HTTP
    server span: from the request's arrival to its first publish, and from the answer's arrival
    (its consumer span) to the end of the HTTP span.
    """
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    out = []
    for trace in by_trace.values():
        server = next((s for s in trace if s.kind == SERVER and _role(s.service) == "gateway"), None)
        kafka = sorted((s for s in trace if s.kind in (PRODUCER, CONSUMER) and s.name.endswith((" publish", " process"))),
                       key=lambda s: s.start_ns)
        if server is None or not kafka:
            continue
        hops: list[tuple[str, float]] = []
        at, where = server.start_ns, "gateway"
        for c in kafka:
            role = _role(c.service)
            if c.kind != CONSUMER or role in (where, "reward-logger"):
                continue
            topic = c.name.removesuffix(" process")
            p = max((s for s in kafka if s.kind == PRODUCER and s.name == f"{topic} publish"
                     and s.start_ns <= c.start_ns), key=lambda s: s.start_ns, default=None)
            if p is None or _role(p.service) != where:
                break  # a publish not exported: the path cannot be read on
            hops.append((f"in {where}", (p.start_ns - at) / 1e6))
            hops.append((f"{where} → {role} (Kafka)", (c.start_ns - p.start_ns) / 1e6))
            at, where = c.start_ns, role
        if where != "gateway":
            continue  # the answer's span was not exported (yet): an incomplete workflow
        hops.append(("in gateway", (server.end_ns - at) / 1e6))
        hops.append(("end to end (gateway HTTP span)", (server.end_ns - server.start_ns) / 1e6))
        for (role, prefix), label in _INNER.items():
            inner = next((s for s in trace if _role(s.service) == role and s.name.startswith(prefix)), None)
            if inner is not None:
                hops.append((label, (inner.end_ns - inner.start_ns) / 1e6))
        out.append(hops)
    return out


def hop_table(spans: list[Span]) -> dict:
    """p50/p99 of each hop over the complete workflows, in path order (the most common path)."""
    flows = workflow_hops(spans)
    paths: dict[tuple[str, ...], int] = defaultdict(int)
    for f in flows:
        paths[tuple(h for h, _ in f)] += 1
    if not flows:
        return {"workflows": 0, "traces": len({s.trace_id for s in spans}), "spans": len(spans), "hops": []}
    path = max(paths, key=lambda p: paths[p])
    same = [f for f in flows if tuple(h for h, _ in f) == path]
    rows = []
    for i, name in enumerate(path):
        values = sorted(f[i][1] for f in same)
        rows.append({"hop": name, "p50_ms": round(percentile(values, 50) or 0, 2),
                     "p99_ms": round(percentile(values, 99) or 0, 2), "mean_ms": round(sum(values) / len(values), 2)})
    return {"workflows": len(same), "other_paths": len(flows) - len(same), "traces": len({s.trace_id for s in spans}),
            "spans": len(spans), "hops": rows}
