"""The reward logger: grades finished workflows and writes episodes and feedback exactly once."""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import Counter

from baton_platform import topics
from baton_platform.config import BatonConfig, load_config
from baton_platform.http import serve
from baton_platform.service import Service

from baton_reward_logger.episodes import EPISODE_SCHEMA, FEEDBACK_SCHEMA, DatasetWriter
from baton_reward_logger.handlers import Flusher, Sink, feedback_row_maker, response_row_maker

SERVICE_NAME = "baton-reward-logger"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(SERVICE_NAME, config, tracer_provider)
    cfg = config.reward_logger
    root = cfg.dataset_dir.rstrip("/")  # a local path or a URL: joined as text, which both accept
    written = Counter("baton_dataset_rows", "Rows written to the datasets", ["topic"], registry=service.registry)
    sinks = [
        Sink(service, topics.RESPONSES, DatasetWriter(f"{root}/episodes", topics.RESPONSES, EPISODE_SCHEMA),
             response_row_maker(cfg.reward_scheme, cfg.cost_weight), written),
        Sink(service, topics.FEEDBACK, DatasetWriter(f"{root}/feedback", topics.FEEDBACK, FEEDBACK_SCHEMA),
             feedback_row_maker(), written),
    ]
    for sink in sinks:
        sink.register()
    flusher = Flusher(sinks, cfg.flush_interval_s)
    return service.asgi_app(after_startup=[flusher.start], on_shutdown=[flusher.stop])


def run() -> None:
    config = load_config()
    serve(create_app(config), config.reward_logger.host, config.reward_logger.port)


if __name__ == "__main__":
    run()
