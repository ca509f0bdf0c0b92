"""Health, readiness and Prometheus endpoints every service serves, and the process runner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton_platform.logs import configure_logging

ReadyCheck = Callable[[], Awaitable[str | None]]


async def broker_ready(broker, timeout: float = 3.0) -> str | None:
    """None when the broker answers a ping, else why not."""
    try:
        ok = await asyncio.wait_for(broker.ping(timeout=timeout), timeout + 1)
    except Exception as e:  # noqa: BLE001 - readiness reports any failure as "not ready"
        return f"broker unreachable: {type(e).__name__}"
    return None if ok else "broker unreachable"


def live_endpoint():
    async def live(request: Request) -> Response:
        return JSONResponse({"status": "live"})

    return live


def ready_endpoint(checks: list[ReadyCheck]):
    async def ready(request: Request) -> Response:
        problems = [p for p in [await c() for c in checks] if p]
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    return ready


def metrics_endpoint(registry: CollectorRegistry):
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


class _Server(uvicorn.Server):
    """uvicorn's server, which on the first SIGTERM/SIGINT can first go on serving for `drain_s`
    seconds, closing each connection after its response; then it stops as uvicorn does (it stops
    listening, closes idle connections, lets requests in flight finish, runs the app's shutdown)."""

    def __init__(self, config: uvicorn.Config, drain_s: float) -> None:
        super().__init__(config)
        self.drain_s = drain_s
        self.draining_since: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.drain_s > 0 and self.draining_since is None:
            self.draining_since = time.monotonic()
            return
        super().handle_exit(sig, frame)  # a second signal stops at once

    async def on_tick(self, counter: int) -> bool:
        if self.draining_since is not None and time.monotonic() - self.draining_since >= self.drain_s:
            self.should_exit = True
        return await super().on_tick(counter)


def _closing_when(draining: Callable[[], bool], app):
    """`app`, whose HTTP responses say `Connection: close` while `draining()`."""

    async def asgi(scope, receive, send):
        if scope["type"] != "http" or not draining():
            return await app(scope, receive, send)

        async def send_closing(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return await app(scope, receive, send_closing)

    return asgi


def _by_port(app, metrics_port: int, metrics_app):
    """`app`, except that HTTP requests that arrived on `metrics_port` go to `metrics_app`; lifespan
    events go to `app` only."""

    async def asgi(scope, receive, send):
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == metrics_port:
            return await metrics_app(scope, receive, send)
        return await app(scope, receive, send)

    return asgi


def metrics_app(registry: CollectorRegistry):
    """An app that serves only /metrics (GET): a service's metrics on a port of their own."""
    return Starlette(routes=[Route("/metrics", metrics_endpoint(registry), methods=["GET"])])


def serve(app, host: str, port: int, *, service: str, secrets: Iterable[str] = (), drain_s: float = 0.0,
          keep_alive_s: int = 5, metrics: tuple[int, object] | None = None) -> None:
    """Run an ASGI app until SIGTERM/SIGINT; uvicorn drives the app's lifespan (broker start/stop).

    With `drain_s`, the signal starts that many seconds of serving on, each response closing its
    connection: a client's keep-alive connection then ends after an answer, where it reconnects to
    another replica, instead of being cut while idle, where a request it sends at that moment is lost.
    `keep_alive_s` is how long an idle connection stays open (uvicorn's default is 5 s). Logs are
    `service`'s, with `secrets` masked (baton_platform.logs).

    `metrics`, a (port, app) pair, is served by the same server on that port of `host` (and only there):
    metrics that must not be reachable where the API is, e.g. behind an Ingress that routes the API port."""
    configure_logging(service, secrets)
    server: _Server | None = None
    # uvloop and httptools: per-message loop work (timers, futures, socket reads) and HTTP parsing are
    # a large share of every service's CPU, and these do them in C.
    asgi = app
    sockets = None
    if metrics is not None:
        metrics_port, metrics_asgi = metrics
        # Bound here, as uvicorn would bind `port` alone (its address family, SO_REUSEADDR); log_config=None
        # leaves the service's logging as configure_logging set it.
        sockets = [uvicorn.Config(app, host=host, port=p, log_level="warning", log_config=None).bind_socket()
                   for p in (port, metrics_port)]
        asgi = _by_port(app, sockets[1].getsockname()[1], metrics_asgi)
    config = uvicorn.Config(_closing_when(lambda: server is not None and server.draining_since is not None, asgi),
                            host=host, port=port, log_level="warning", lifespan="on", loop="uvloop", http="httptools",
                            timeout_keep_alive=keep_alive_s, log_config=None)
    server = _Server(config, drain_s)
    server.run(sockets=sockets)
