"""What every Kafka-driven service shares: its broker, consumers, publishers, dead letters, metrics, and
HTTP endpoints."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from faststream.asgi import AsgiFastStream
from faststream.kafka import KafkaBroker
from google.protobuf.message import Message
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response

from baton_platform.config import KafkaConfig
from baton_platform.consumer import Consumer, DeadLetters, Publisher
from baton_platform.http import (
    ReadyCheck,
    broker_ready,
    live_endpoint,
    metrics_app,
    metrics_endpoint,
    ready_endpoint,
)
from baton_platform.kafka import make_broker
from baton_platform.telemetry import setup_tracing

Hook = Callable[[], Awaitable[None]]
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class Service:
    name: str
    kafka: KafkaConfig
    broker: KafkaBroker
    tracer_provider: TracerProvider
    registry: CollectorRegistry
    tracer: Tracer = field(init=False)
    dead_letters: DeadLetters = field(init=False)
    consumers: list[Consumer] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        dlq_total = Counter(
            "baton_dlq_messages", "Records sent to the dead-letter topic", ["topic"], registry=self.registry
        )
        self.tracer = self.tracer_provider.get_tracer("baton.kafka")
        self.dead_letters = DeadLetters(self.broker, self.name, self.tracer,
                                        on_dead_letter=lambda t: dlq_total.labels(t).inc())

    @classmethod
    def create(cls, name: str, kafka: KafkaConfig, tracer_provider: TracerProvider | None = None) -> Service:
        provider = tracer_provider if tracer_provider is not None else setup_tracing(name)
        broker = make_broker(kafka, client_id=name)
        return cls(name=name, kafka=kafka, broker=broker, tracer_provider=provider, registry=CollectorRegistry())

    def consumer(self, topic: str, kind: type[Message], handler, **options) -> Consumer:
        """Subscribe `handler` to `topic` (see baton_platform.consumer.Consumer for the options)."""
        consumer = Consumer(self.broker, self.name, self.kafka, self.dead_letters, self.tracer, topic, kind, handler,
                            **options)
        self.consumers.append(consumer)
        return consumer

    def publisher(self, topic: str, kind: type[Message] | None, description: str = "") -> Publisher:
        return Publisher(self.broker, self.name, topic, kind, self.tracer, description)

    async def start_consumers(self) -> None:
        for consumer in self.consumers:
            await consumer.start()

    async def stop_consumers(self) -> None:
        for consumer in self.consumers:
            await consumer.stop()

    async def flush_traces(self) -> None:
        self.tracer_provider.force_flush(5000)

    async def ready(self) -> str | None:
        return await broker_ready(self.broker)

    def asgi_app(self, *, ready_checks: Sequence[ReadyCheck] = (), on_startup=(), after_startup=(), on_shutdown=()) -> AsgiFastStream:
        """An ASGI app running the broker's subscribers plus /health/live, /health/ready and /metrics."""
        return AsgiFastStream(
            self.broker,
            asgi_routes=[(path, request_response(endpoint)) for path, endpoint in self._endpoints(ready_checks)],
            on_startup=list(on_startup),
            after_startup=self._after_startup(after_startup),
            on_shutdown=self._on_shutdown(on_shutdown),
        )

    def http_routes(self, *, ready_checks: Sequence[ReadyCheck] = (), metrics: bool = True) -> list[Route]:
        """/health/live, /health/ready and /metrics (GET) for a service that serves its own Starlette app;
        without `metrics`, /metrics is left to `metrics_app` on a port of its own."""
        return [Route(path, endpoint, methods=["GET"]) for path, endpoint in self._endpoints(ready_checks)
                if metrics or path != "/metrics"]

    def metrics_app(self) -> Starlette:
        """An app serving only this service's /metrics, for a port apart from its API's."""
        return metrics_app(self.registry)

    def lifespan(self, *, after_startup: Sequence[Hook] = (), on_shutdown: Sequence[Hook] = ()):
        """A Starlette lifespan that starts and stops the broker and the consumers in `asgi_app`'s order
        (`after_startup` and `on_shutdown` run where they run there), for a service that serves its own
        Starlette app."""
        startup, shutdown = self._after_startup(after_startup), self._on_shutdown(on_shutdown)

        @contextlib.asynccontextmanager
        async def lifespan(app) -> AsyncIterator[None]:
            await self.broker.start()
            for hook in startup:
                await hook()
            try:
                yield
            finally:
                for hook in shutdown:
                    await hook()
                await self.broker.stop()

        return lifespan

    def _endpoints(self, ready_checks: Sequence[ReadyCheck]) -> list[tuple[str, Endpoint]]:
        return [
            ("/health/live", live_endpoint()),
            ("/health/ready", ready_endpoint([self.ready, *ready_checks])),
            ("/metrics", metrics_endpoint(self.registry)),
        ]

    def _after_startup(self, hooks: Sequence[Hook]) -> list[Hook]:
        return [self.start_consumers, *hooks]

    def _on_shutdown(self, hooks: Sequence[Hook]) -> list[Hook]:
        # Consumers stop first: their last commits need the broker, their drains the service's clients.
        return [self.stop_consumers, *hooks, self.flush_traces]
