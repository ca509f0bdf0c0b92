"""The gateway's /metrics lists every tenant's requests and spend: it is served on gateway.metrics_port
only, so that whatever exposes the API port (an Ingress, a load balancer) does not expose it too."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time

import httpx
import pytest

import baton_gateway.main as gateway
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing
from baton_tools.procs import free_port


async def test_the_api_app_answers_404_for_metrics_and_the_metrics_app_serves_the_tenants(write_config):
    config = load_config(write_config({"gateway": {"auth": "none"}}))
    app = gateway.create_app(config, tracer_provider=setup_tracing("t", set_global=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as api, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app.state.metrics_app),
                              base_url="http://gw-metrics") as metrics:
        assert (await api.get("/metrics")).status_code == 404
        assert (await api.get("/health/live")).status_code == 200, "the probes' endpoints stay on the API port"
        served = await metrics.get("/metrics")
        assert served.status_code == 200
        assert "baton_gateway_tenant_requests_total" in served.text
        assert (await metrics.get("/v1/models")).status_code == 404, "the metrics port serves nothing else"


def test_the_metrics_port_must_differ_from_the_api_port(write_config):
    with pytest.raises(ValueError, match="metrics_port must differ"):
        load_config(write_config({"gateway": {"port": 9100, "metrics_port": 9100}}))


# The process runner the gateway's run() uses, with an API app of its own and the platform's metrics app.
APP = """
import sys
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from baton_platform.http import metrics_app, serve

registry = CollectorRegistry()
Counter("baton_test_spend", "Spend", ["tenant"], registry=registry).labels("acme").inc()

async def hello(request):
    return PlainTextResponse("api")

serve(Starlette(routes=[Route("/v1/models", hello)]), "127.0.0.1", int(sys.argv[1]), service="metrics-port-test",
      metrics=(int(sys.argv[2]), metrics_app(registry)))
"""


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def test_a_served_process_answers_metrics_on_the_metrics_port_and_404_on_the_api_port():
    api_port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-c", APP, str(api_port), str(metrics_port)])
    try:
        deadline = time.monotonic() + 30
        for port in (api_port, metrics_port):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
        assert get(api_port, "/v1/models") == (200, "api")
        assert get(api_port, "/metrics")[0] == 404
        status, text = get(metrics_port, "/metrics")
        assert status == 200 and 'baton_test_spend_total{tenant="acme"} 1.0' in text
        assert get(metrics_port, "/v1/models")[0] == 404
    finally:
        proc.kill()
        proc.wait(timeout=30)
