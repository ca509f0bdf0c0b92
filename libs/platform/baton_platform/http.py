"""Health, readiness and Prometheus endpoints every service serves, and the process runner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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


def serve(app, host: str, port: int) -> None:
    """Run an ASGI app until SIGTERM/SIGINT; uvicorn drives the app's lifespan (broker start/stop)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvloop and httptools: per-message loop work (timers, futures, socket reads) and HTTP parsing are
    # a large share of every service's CPU, and these do them in C.
    uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="on", loop="uvloop", http="httptools")
