"""The synthesizer service: runs every planned workflow to an answer."""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton_platform.config import BatonConfig, ConfigWatch, load_config
from baton_platform.http import serve
from baton_platform.service import Service
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.handlers import RunConsumer
from baton_synthesizer.runs import Runs

SERVICE_NAME = "baton-synthesizer"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(SERVICE_NAME, config.kafka, tracer_provider)
    workers = WorkerPool(config.workers, ConfigWatch())
    workflows = Runs(config.synthesizer, workers, max_steps=config.conductor.max_steps, judge=config.judge)
    RunConsumer(service, workflows, workers)
    return service.asgi_app()


def run() -> None:
    config = load_config()
    serve(create_app(config), config.synthesizer.host, config.synthesizer.port, service=SERVICE_NAME,
          secrets=config.secrets())


if __name__ == "__main__":
    run()
