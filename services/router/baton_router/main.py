"""The router service: runs the conductor on every request and publishes the plan."""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton_platform.config import BatonConfig, load_config
from baton_platform.http import serve
from baton_platform.service import Service

from baton_router.conductor import build_backend
from baton_router.handlers import register
from baton_router.planning import Planner

SERVICE_NAME = "baton-router"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(SERVICE_NAME, config, tracer_provider)
    backend = build_backend(config)
    commit_while_idle = register(service, Planner(config, backend), backend)
    return service.asgi_app(after_startup=[commit_while_idle], on_shutdown=[backend.aclose])


def run() -> None:
    config = load_config()
    serve(create_app(config), config.router.host, config.router.port)


if __name__ == "__main__":
    run()
