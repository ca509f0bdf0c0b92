"""A minimal OTLP/HTTP trace receiver: what a collector would get from the services."""

from __future__ import annotations

import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path == "/v1/traces":
                    receiver._ingest(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _ingest(self, req: ExportTraceServiceRequest) -> None:
        with self._lock:
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append({"service": attrs.get("service.name"), "trace_id": s.trace_id.hex(),
                                           "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                                           "name": s.name, "kind": s.kind,
                                           "attributes": {a.key: a.value for a in s.attributes},
                                           "events": [(e.name, {a.key: a.value for a in e.attributes})
                                                      for e in s.events]})

    def services_by_trace(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        with self._lock:
            for s in self.spans:
                out[s["trace_id"]].add(s["service"])
        return out

    def close(self) -> None:
        self._server.shutdown()
