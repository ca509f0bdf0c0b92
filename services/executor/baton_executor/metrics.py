"""The executor's Prometheus metrics, labelled by provider (and worker where it matters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ExecutorMetrics:
    def __init__(self, registry: CollectorRegistry, provider: str) -> None:
        self.provider = provider
        self.steps = Counter("baton_executor_steps", "Steps answered", ["provider", "worker", "outcome"], registry=registry)
        self.requests = Counter("baton_executor_requests", "Provider calls made (rate() gives requests per minute)",
                                ["provider", "worker"], registry=registry)
        self.tokens = Counter("baton_executor_tokens", "Tokens used", ["provider", "worker", "direction"], registry=registry)
        self.cost = Counter("baton_executor_cost_usd", "Cost of provider calls", ["provider", "worker"], registry=registry)
        self.latency = Histogram("baton_executor_step_seconds", "Step latency, retries included", ["provider"],
                                 registry=registry)
        self.limit_wait = Histogram("baton_executor_limit_wait_seconds", "Time calls waited on RPM/TPM limits",
                                    ["provider", "worker"], registry=registry,
                                    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.rate_limited = Counter("baton_executor_rate_limited", "429 answers seen from the provider",
                                    ["provider", "worker"], registry=registry)
        self.in_flight = Gauge("baton_executor_in_flight", "Calls in progress on this replica", ["provider"],
                               registry=registry)
        self.lag = Gauge("baton_consumer_lag", "Records of the tasks topic not yet processed by this replica",
                         ["provider", "topic"], registry=registry)
        self.stream_records = Counter("baton_executor_stream_records", "Answer-delta records published for streaming requests",
                                      ["provider"], registry=registry)
        self.share = Gauge("baton_executor_limit_share", "Share of the provider's limits this replica holds",
                           ["provider"], registry=registry)
