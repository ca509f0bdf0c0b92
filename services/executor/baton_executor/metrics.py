"""The executor's Prometheus metrics, labelled by provider (and worker where it matters), and the
GenAI client metrics of OpenTelemetry's semantic conventions (v1.41.0), named as an OpenTelemetry
Prometheus exporter names them (`gen_ai.client.token.usage` is `gen_ai_client_token_usage`), with
their advised buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

GEN_AI_LABELS = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)


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
        self.expired = Counter("baton_executor_expired", "Tasks not sent to the provider: the request's deadline had passed",
                               ["provider", "worker"], registry=registry)
        self.handed_over = Counter("baton_executor_handed_over", "One-step workflows sent here whole whose step failed, "
                                   "handed to the synthesizer for the worker's fallback", ["provider", "worker"],
                                   registry=registry)
        self.held = Counter("baton_executor_held", "Calls held back until the group confirmed this replica still "
                            "owns their task (the broker away, or the replica dropped from its group)", ["provider"],
                            registry=registry)
        self.rate_limited = Counter("baton_executor_rate_limited", "429 answers seen from the provider",
                                    ["provider", "worker"], registry=registry)
        self.in_flight = Gauge("baton_executor_in_flight", "Calls in progress on this replica", ["provider"],
                               registry=registry)
        self.lag = Gauge("baton_consumer_lag", "Records of the tasks topic not yet processed by this replica",
                         ["provider", "topic"], registry=registry)
        self.stream_records = Counter("baton_executor_stream_records", "Answer-delta records published for streaming requests",
                                      ["provider"], registry=registry)
        self.gen_ai_tokens = Histogram("gen_ai_client_token_usage", "Input and output tokens per provider call",
                                       [*GEN_AI_LABELS, "gen_ai_token_type"], registry=registry, buckets=_TOKEN_BUCKETS)
        self.gen_ai_duration = Histogram("gen_ai_client_operation_duration_seconds", "Provider call duration",
                                         [*GEN_AI_LABELS, "error_type"], registry=registry, buckets=_SECONDS_BUCKETS)
        self.gen_ai_first_chunk = Histogram("gen_ai_client_operation_time_to_first_chunk_seconds",
                                            "Time to the first chunk of a streamed provider call", GEN_AI_LABELS,
                                            registry=registry, buckets=_SECONDS_BUCKETS)
        self.share = Gauge("baton_executor_limit_share", "Share of the provider's limits this replica holds",
                           ["provider"], registry=registry)
