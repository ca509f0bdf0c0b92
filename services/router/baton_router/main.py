"""The router service: runs the conductor on every request and publishes the plan."""

from __future__ import annotations

import asyncio
import logging

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton_platform.config import BatonConfig, load_config
from baton_platform.http import serve
from baton_platform.service import Service
from baton_router.conductor import build_backend
from baton_router.handlers import register
from baton_router.learning import register_rewards
from baton_router.planning import Planner

SERVICE_NAME = "baton-router"
log = logging.getLogger(__name__)


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(SERVICE_NAME, config.kafka, tracer_provider)
    backend = build_backend(config.conductor, config.workers)
    register(service, config.router, Planner(config.conductor, config.workers, backend), backend, config.workers)
    register_rewards(service, backend)
    loading: list[asyncio.Task] = []

    async def load_model() -> None:
        # Model-backed conductors load in the background: the process is live at once and reports
        # ready only when plans can be written without waiting for the load.
        if hasattr(backend, "start"):
            loading.append(asyncio.get_running_loop().create_task(backend.start()))

    async def conductor_ready() -> str | None:
        if getattr(backend, "ready", True):
            return None
        if loading and loading[0].done() and loading[0].exception() is not None:
            return f"the conductor model failed to load: {loading[0].exception()}"
        return "the conductor model is loading"

    return service.asgi_app(ready_checks=[conductor_ready], after_startup=[load_model],
                            on_shutdown=[backend.aclose])


def run() -> None:
    config = load_config()
    serve(create_app(config), config.router.host, config.router.port, service=SERVICE_NAME, secrets=config.secrets())


if __name__ == "__main__":
    run()
