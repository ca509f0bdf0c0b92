"""The sections of the Kafka connection and of the services behind the gateway: router, synthesizer,
judge, executor and reward logger (with the evaluation sets it grades against)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from baton_platform.config.base import _HttpService, _Strict
from baton_platform.config.workers import Provider

# An evaluation set's name: a client names an item as NAME:ID, so the name holds no ':'.
_EVAL_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A Prometheus duration, units largest first (1h30m, 7d); at least one of them.
_PROMETHEUS_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")


class KafkaConfig(_Strict):
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = Field(
        default=None, description="The SASL user, one per service (`baton-gateway`, ...; `baton_platform.acls`): "
        "each pod sets its own in BATON_KAFKA__SASL_USERNAME.")
    sasl_password_env: str | None = Field(default=None, description="Environment variable holding the SASL password.")
    ssl_cafile: Path | None = Field(default=None, description="The brokers' CA certificate (PEM).")
    ssl_certfile: Path | None = Field(
        default=None, description="This service's client certificate (PEM) for mutual TLS; its common name is the "
        "service's Kafka principal (`baton-gateway`, ...).")
    ssl_keyfile: Path | None = Field(default=None, description="The client certificate's private key (PEM).")
    partitions: int = Field(default=8, ge=1, description="Partitions per topic: the ceiling on replicas.")
    replication_factor: int = Field(default=1, ge=1, description="Replicas of each topic `baton-topics` creates.")
    # Short session timeouts make group joins and failover fast; production may raise them.
    session_timeout_ms: int = Field(default=10000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3000, ge=100)
    linger_ms: int = Field(default=1, ge=0)


# The policy clients reach as model "baton", and the name the trainer publishes under by default.
DEFAULT_POLICY_NAME = "baton"


class RouterConfig(_HttpService):
    port: int = Field(default=9101, ge=0, le=65535)
    explore_share: float = Field(default=0.0, ge=0, le=1,
                                 description="Share of requests for which several candidate workflows run (GRPO groups).")
    explore_group_size: int = Field(default=4, ge=2, le=64, description="Candidate workflows per explored request.")
    direct_single_step: bool = Field(
        default=True,
        description="A client request whose plan is one step, not streamed and not explored, goes from the router "
        "straight to the executor, which answers the client: two Kafka hops and the synthesizer fewer (a step that "
        "fails on a worker with a fallback is handed to the synthesizer, which runs the fallback). Such a step has "
        "no synthesizer.step_timeout_s (the request's deadline bounds it) and no synthesizer budget check (one call "
        "never exceeds one). False: every workflow goes through the synthesizer.")
    policy_name: str = Field(
        default=DEFAULT_POLICY_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="The policy this deployment serves: routers load, and the gateway offers, only the versions "
        "published on baton.policy under this name (the trainer's --name); others sharing the topic are ignored.")
    policy_store: str | None = Field(
        default=None, min_length=1,
        description="The policy store (the trainer's --store: a directory or an fsspec URL such as "
        "s3://bucket/policies). Routers load versions published on baton.policy only from inside it, and always "
        "only when their content matches the published digest. Unset: any location, digest still checked.")


class SynthesizerConfig(_HttpService):
    port: int = Field(default=9102, ge=0, le=65535)
    step_timeout_s: float = Field(default=60.0, gt=0, description="A step not answered by then fails the request.")
    max_cost_usd: float = Field(default=0.0, ge=0, description="Per-request cost budget (0: none); a request may lower it.")
    max_calls: int = Field(default=0, ge=0, description="Per-request provider-call budget (0: none); a request may lower it.")
    group_answer: Literal["primary", "judge"] = Field(
        default="primary",
        description="Which answer of an exploration group the client gets: its own candidate's ('primary'), or the "
        "one the judge scores best ('judge', needs a `judge:` section; every candidate's score is logged as feedback).",
    )


class JudgeConfig(_Strict):
    """A worker that scores the answers of an exploration group (synthesizer.group_answer: judge)."""

    worker: str = Field(description="The configured worker that judges.")
    wait_s: float = Field(
        default=15.0, gt=0,
        description="How long the client's candidate waits for the others once its own answer is ready. The "
        "candidates run at the same time, so the others are usually done by then; keep it well under "
        "gateway.request_timeout_s.")


class ExecutorConfig(_HttpService):
    port: int = Field(default=9103, ge=0, le=65535)
    provider: Provider | None = Field(default=None, description="The provider this executor process serves.")
    max_attempts: int = Field(default=3, ge=1, description="Calls per step, retries included.")
    drain_timeout_s: float = Field(default=10.0, ge=0,
                                   description="On rebalance, time given to calls in flight before the partition moves.")


GraderName = Literal["math", "choice", "code", "exact", "regex"]


class EvalSetConfig(_Strict):
    """One of the operator's evaluation sets: a file of items `id, grader, reference` (see the README)."""

    path: Path = Field(description="CSV or JSON Lines file; relative paths are relative to this config file.")
    grader: GraderName | None = Field(
        default=None, description="Grader of rows that name none, e.g. `choice` for a RouterBench matrix "
        "whose `answer` column holds the option letter.")


class RewardLoggerConfig(_HttpService):
    port: int = Field(default=9104, ge=0, le=65535)
    # A string, not a Path: a Path would turn s3://bucket into s3:/bucket.
    dataset_dir: str = Field(default=".baton/data",
                             description="Root of the datasets (episodes/ and feedback/ below it): a local "
                             "directory or an fsspec URL such as s3://bucket/prefix.")
    reward_scheme: Literal["quality_minus_cost", "conductor"] = Field(
        default="quality_minus_cost", description="How a graded answer becomes a reward (see the README).")
    cost_weight: float = Field(default=0.0, ge=0, description="USD-to-reward exchange rate in quality_minus_cost.")
    flush_every: int = Field(default=100, ge=1, description="Episodes per Parquet file at most.")
    flush_interval_s: float = Field(default=2.0, gt=0)
    retention_days: int | None = Field(
        default=None, ge=1, description="Days of the datasets kept: each day's folder (date=YYYY-MM-DD, by the "
        "records' UTC day) is deleted once it is this many days old, checked hourly. Unset keeps everything.")
    compact_interval_s: float | None = Field(
        default=3600.0, gt=0, description="How often each replica merges the small files of the partitions it owns "
        "(only those wholly below the partition's committed offset) into files of about compact_target_mb, per "
        "day folder. Unset: never.")
    compact_target_mb: float = Field(default=128.0, gt=0, description="The size, in MB, a merged file grows to at "
                                     "most; a file of that size or more is left as it is.")
    eval_sets: dict[str, EvalSetConfig] = Field(
        default_factory=dict,
        description="Evaluation sets by name. A request naming an item, metadata baton_eval = 'NAME:ID', is graded "
        "with that item's grader and reference; a client's own grader or reference is never used.")
    grading_timeout_s: float = Field(default=30.0, gt=0, description="Longest one grade may take; past it the "
                                     "episode is logged as 'grading failed' and the grading process replaced.")

    @field_validator("eval_sets", mode="before")
    @classmethod
    def _path_shorthand(cls, value):
        # `NAME: path` is short for `NAME: {path: path}`.
        if isinstance(value, dict):
            return {k: ({"path": v} if isinstance(v, (str, os.PathLike)) else v) for k, v in value.items()}
        return value

    @field_validator("eval_sets")
    @classmethod
    def _set_names(cls, value: dict) -> dict:
        for name in value:
            if not _EVAL_SET_NAME.match(name):
                raise ValueError(f"evaluation set name {name!r} must match {_EVAL_SET_NAME.pattern} (no ':')")
        return value

    @field_validator("dataset_dir", mode="before")
    @classmethod
    def _path_to_str(cls, value):
        return os.fspath(value) if isinstance(value, os.PathLike) else value  # callers may still pass a Path


class ConsoleConfig(_HttpService):
    """The console (services/console): read-only pages of charts and episodes, drawn from the reward
    logger's dataset (`reward_logger.dataset_dir`). It asks for a key with the `admin` scope when the
    gateway does (`gateway.auth: keys`), and is open on loopback otherwise, as the gateway is."""

    port: int = Field(default=9105, ge=0, le=65535)
    refresh_s: float = Field(default=5.0, gt=0, description="Seconds a page may show before the dataset is read again.")
    max_episodes: int = Field(default=50_000, ge=1, description="The newest episodes the console holds; older ones "
                              "stay in the dataset for the trainer.")
    live: bool = Field(default=True, description="Follow baton.responses on Kafka (a consumer group per replica, "
                       "from the end, nothing committed) to show each answer seconds after it is sent, before the "
                       "reward logger has written and graded it; false: the dataset only.")
    trace_url: str | None = Field(default=None, description="A tracing UI's search for one request's trace, with "
                                  "{request_id} in it (spans carry baton.request_id), e.g. Jaeger's "
                                  "http://jaeger:16686/search?service=baton-synthesizer&tags=%7B%22baton.request_id"
                                  "%22%3A%22{request_id}%22%7D; unset: no trace links.")
    prometheus_url: str | None = Field(
        default=None, pattern=r"^https?://",
        description="A Prometheus server's HTTP API (e.g. http://prometheus:9090) that scrapes every gateway: the "
        "Tenants page sums each tenant's refused requests over all replicas from it, over `refusals_window`. "
        "Unset: it reads one gateway's /metrics (`gateway_metrics_url`).")
    refusals_window: str = Field(
        default="24h",
        description="The span the Tenants page counts refusals over when it reads `prometheus_url`: a Prometheus "
        "duration (30m, 24h, 7d).")
    gateway_metrics_url: str | None = Field(
        default=None, pattern=r"^https?://",
        description="One gateway's /metrics, read when `prometheus_url` is unset: its refusals since it started, "
        "that replica's only. Unset: http://{gateway.host}:{gateway.metrics_port}/metrics (127.0.0.1 for 0.0.0.0).")

    @field_validator("refusals_window")
    @classmethod
    def _prometheus_duration(cls, value: str) -> str:
        if not value or not _PROMETHEUS_DURATION.fullmatch(value) or not any(c in "123456789" for c in value):
            raise ValueError(f"{value!r} is not a Prometheus duration such as 30m, 24h or 7d")
        return value
