"""An executor process: serves every worker of one provider (`BATON_EXECUTOR__PROVIDER` or --provider)."""

from __future__ import annotations

import argparse
import logging

from faststream.asgi import AsgiFastStream
from opentelemetry.sdk.trace import TracerProvider

from baton_executor.handlers import TaskConsumer
from baton_executor.limits import WorkerLimits
from baton_executor.metrics import ExecutorMetrics
from baton_executor.providers.registry import build_workers
from baton_executor.step_runner import StepRunner
from baton_executor.transport import ProviderClient
from baton_platform import topics
from baton_platform.config import PROVIDERS, BatonConfig, ConfigWatch, WorkerConfig, load_config
from baton_platform.http import serve
from baton_platform.service import Service
from baton_platform.workerpool import WorkerPool

log = logging.getLogger(__name__)


def create_app(config: BatonConfig, provider: str, tracer_provider: TracerProvider | None = None) -> AsgiFastStream:
    service = Service.create(topics.executor_service_name(provider), config.kafka, tracer_provider)
    client = ProviderClient(tracer=service.tracer_provider.get_tracer("baton.executor.http"))
    workers = build_workers(config.workers, provider, client)
    configs = {w.name: w for w in config.workers if w.provider == provider}
    limits = {w.name: worker_limits(w) for w in configs.values()}
    metrics = ExecutorMetrics(service.registry, provider)
    runner = StepRunner(workers, configs, limits, service.tracer_provider.get_tracer("baton.executor"), metrics,
                        config.executor.max_attempts)
    pool = WorkerPool(config.workers, ConfigWatch())

    def added_workers() -> dict[str, WorkerLimits]:
        """Workers of this provider added to the configuration file since it was last read: their
        clients join the runner's; their limits are returned for the consumer to share out."""
        new = [w for w in pool.refresh() if w.provider == provider]
        if not new:
            return {}
        try:
            workers.update(build_workers(new, provider, client))
        except Exception as e:  # noqa: BLE001 - a bad new worker (its API key unset) must not stop the others
            log.warning("workers added to the configuration cannot be served: %s", e)
            pool.drop(w.name for w in new)  # offered again at the file's next change
            return {}
        configs.update({w.name: w for w in new})
        log.info("serving workers added to the configuration: %s", ", ".join(w.name for w in new))
        return {w.name: worker_limits(w) for w in new}

    consumer = TaskConsumer(service, provider, runner, limits, metrics, config.executor.drain_timeout_s,
                            direct_steps=config.router.direct_single_step, added_workers=added_workers,
                            fallback_of=lambda name: configs[name].fallback if name in configs else None)

    async def close() -> None:
        await consumer.exchange.stop()
        for w in workers.values():
            await w.aclose()
        await client.aclose()

    return service.asgi_app(after_startup=[consumer.exchange.start], on_shutdown=[close])


def worker_limits(w: WorkerConfig) -> WorkerLimits:
    return WorkerLimits(w.limits.rpm, w.limits.tpm, w.limits.concurrency, w.limits.headroom)


def run() -> None:
    parser = argparse.ArgumentParser(description="Baton executor for one provider")
    parser.add_argument("--provider", choices=PROVIDERS, help="defaults to executor.provider in the config")
    parser.add_argument("--port", type=int, help="HTTP port for health and metrics (defaults to executor.port)")
    args = parser.parse_args()
    config = load_config()
    provider = args.provider or config.executor.provider
    if provider is None:
        parser.error("say which provider this executor serves: --provider or BATON_EXECUTOR__PROVIDER")
    serve(create_app(config, provider), config.executor.host, args.port if args.port is not None else config.executor.port,
          service=topics.executor_service_name(provider), secrets=config.secrets())


if __name__ == "__main__":
    run()
