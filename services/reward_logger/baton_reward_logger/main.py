"""The reward logger: grades finished workflows and writes episodes and feedback exactly once."""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton.v1 import feedback_pb2, responses_pb2
from baton_graders import EvalRegistry, IsolatedGrader
from baton_platform import topics
from baton_platform.config import BatonConfig, load_config
from baton_platform.dataset import EPISODE_SCHEMA, FEEDBACK_SCHEMA
from baton_platform.http import serve
from baton_platform.service import Service
from baton_reward_logger.episodes import DatasetWriter
from baton_reward_logger.handlers import (
    TopicRecorder,
    feedback_row_maker,
    response_row_maker,
    reward_publisher,
)
from baton_reward_logger.metrics import DatasetMetrics, GradingMetrics
from baton_reward_logger.rewards import names_eval_item

SERVICE_NAME = "baton-reward-logger"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    cfg = config.reward_logger
    service = Service.create(SERVICE_NAME, config.kafka, tracer_provider)
    root = cfg.dataset_dir.rstrip("/")  # a local path or a URL: joined as text, which both accept
    metrics = DatasetMetrics(service.registry)
    outcomes = GradingMetrics(service.registry).outcomes
    # The operator's evaluation sets, loaded once: a missing or malformed file stops the start.
    evals = EvalRegistry.load({name: (s.path, s.grader) for name, s in cfg.eval_sets.items()})
    grader = IsolatedGrader(timeout_s=cfg.grading_timeout_s)
    recorders = [
        TopicRecorder(service, cfg, topics.RESPONSES, responses_pb2.Response,
             DatasetWriter(f"{root}/episodes", topics.RESPONSES, EPISODE_SCHEMA),
             response_row_maker(cfg.reward_scheme, cfg.cost_weight, evals, grader.grade, outcomes), metrics,
             after_write=reward_publisher(service), blocks=names_eval_item),
        TopicRecorder(service, cfg, topics.FEEDBACK, feedback_pb2.Feedback,
             DatasetWriter(f"{root}/feedback", topics.FEEDBACK, FEEDBACK_SCHEMA), feedback_row_maker(), metrics),
    ]

    async def stop_grader() -> None:
        grader.close()

    return service.asgi_app(ready_checks=[s.ready for s in recorders], on_shutdown=[stop_grader])


def run() -> None:
    config = load_config()
    serve(create_app(config), config.reward_logger.host, config.reward_logger.port, service=SERVICE_NAME,
          secrets=config.secrets())


if __name__ == "__main__":
    run()
