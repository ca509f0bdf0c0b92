"""The reward logger: writes every episode to the Parquet dataset exactly as it happened."""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton_platform import topics
from baton_platform.config import BatonConfig, load_config
from baton_platform.http import serve
from baton_platform.service import Service

from baton_reward_logger.episodes import EpisodeWriter
from baton_reward_logger.handlers import RewardLoggerWiring

SERVICE_NAME = "baton-reward-logger"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(SERVICE_NAME, config, tracer_provider)
    wiring = RewardLoggerWiring(service, EpisodeWriter(config.reward_logger.dataset_dir, topics.RESPONSES))
    wiring.register()
    return service.asgi_app(after_startup=[wiring.start_timer], on_shutdown=[wiring.stop_timer])


def run() -> None:
    config = load_config()
    serve(create_app(config), config.reward_logger.host, config.reward_logger.port)


if __name__ == "__main__":
    run()
