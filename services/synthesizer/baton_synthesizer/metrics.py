"""The synthesizer's Prometheus metrics: responses by outcome, steps dispatched by provider, workflows
ended at their deadline, and the workflows running on this replica."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SynthesizerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter("baton_responses", "Responses published", ["outcome"], registry=registry)
        self.dispatched = Counter("baton_steps_dispatched", "Steps dispatched", ["provider"], registry=registry)
        self.expired = Counter("baton_synthesizer_expired", "Workflows ended because the request's deadline passed",
                               registry=registry)
        self.running = Gauge("baton_workflows_running", "Workflows in progress", registry=registry)
