"""Baton's one configuration file (named by BATON_CONFIG), validated, with environment overrides.

Any field can be overridden by an environment variable `BATON_<SECTION>__<FIELD>` (for example
`BATON_GATEWAY__PORT=8081`); `KAFKA_BOOTSTRAP_SERVERS` is honoured too, as every Kafka tool does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

Provider = Literal["openai", "anthropic", "gemini", "openai_compatible", "sim"]
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "gemini", "openai_compatible", "sim")


class ConfigError(ValueError):
    """The configuration is invalid; the message names every offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(_Strict):
    rpm: int | None = Field(default=None, gt=0, description="Requests per minute, all replicas together.")
    tpm: int | None = Field(default=None, gt=0, description="Tokens per minute, all replicas together.")
    concurrency: int = Field(default=8, gt=0, description="Calls in flight, all replicas together.")
    headroom: float = Field(default=0.95, gt=0, le=1,
                            description="Share of each limit Baton aims at, leaving room for replicas' clock skew.")


class Price(_Strict):
    input_per_mtok: float = Field(default=0.0, ge=0)
    output_per_mtok: float = Field(default=0.0, ge=0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


class SimSettings(_Strict):
    """The `sim` provider answers from a real outcome matrix (RouterBench CSV layout)."""

    dataset: Path
    column: str | None = Field(default=None, description="Model column in the matrix; defaults to the worker's model.")
    latency_ms: float = Field(default=50.0, ge=0)


class WorkerConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    provider: Provider
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="Name of the environment variable holding the key.")
    limits: Limits = Limits()
    price: Price = Price()
    card: str = ""
    replicas: int = Field(default=1, ge=1, description="Executor processes `make up` starts for this provider.")
    fallback: str | None = Field(default=None, description="Worker that takes a step this one failed.")
    sim: SimSettings | None = None

    @model_validator(mode="after")
    def _provider_needs(self) -> "WorkerConfig":
        if self.provider == "sim" and self.sim is None:
            raise ValueError("provider 'sim' needs a `sim:` section with a `dataset` path")
        if self.provider == "openai_compatible" and not self.base_url:
            raise ValueError("provider 'openai_compatible' needs a `base_url`")
        return self


AccessSpec = Union[Literal["all"], list[int]]


class StaticPlan(_Strict):
    """The Conductor's plan shape: one worker, one instruction and one access list per step."""

    workers: list[str] = Field(min_length=1)
    subtasks: list[str]
    access: list[AccessSpec]

    @model_validator(mode="after")
    def _equal_lengths(self) -> "StaticPlan":
        if not (len(self.workers) == len(self.subtasks) == len(self.access)):
            raise ValueError(
                f"workers, subtasks and access must have equal lengths "
                f"(got {len(self.workers)}, {len(self.subtasks)}, {len(self.access)})"
            )
        return self


class ConductorConfig(_Strict):
    backend: Literal["static"] = "static"
    plan: StaticPlan | None = None
    max_steps: int = Field(default=5, ge=1, le=32)
    fallback_plan: StaticPlan | None = Field(default=None, description="Safe plan used when a plan is invalid.")


class KafkaConfig(_Strict):
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password_env: str | None = Field(default=None, description="Environment variable holding the SASL password.")
    ssl_cafile: Path | None = None
    partitions: int = Field(default=8, ge=1, description="Partitions per topic: the ceiling on replicas.")
    # Short session timeouts make group joins and failover fast; production may raise them.
    session_timeout_ms: int = Field(default=10000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3000, ge=100)
    linger_ms: int = Field(default=1, ge=0)


class _HttpService(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)


class GatewayConfig(_HttpService):
    port: int = Field(default=8080, ge=0, le=65535)
    request_timeout_s: float = Field(default=120.0, gt=0)
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    max_messages: int = Field(default=256, gt=0)


class RouterConfig(_HttpService):
    port: int = Field(default=9101, ge=0, le=65535)


class SynthesizerConfig(_HttpService):
    port: int = Field(default=9102, ge=0, le=65535)
    step_timeout_s: float = Field(default=60.0, gt=0, description="A step not answered by then fails the request.")
    max_cost_usd: float = Field(default=0.0, ge=0, description="Per-request cost budget (0: none); a request may lower it.")
    max_calls: int = Field(default=0, ge=0, description="Per-request provider-call budget (0: none); a request may lower it.")


class ExecutorConfig(_HttpService):
    port: int = Field(default=9103, ge=0, le=65535)
    provider: Provider | None = Field(default=None, description="The provider this executor process serves.")
    max_attempts: int = Field(default=3, ge=1, description="Calls per step, retries included.")
    drain_timeout_s: float = Field(default=10.0, ge=0,
                                   description="On rebalance, time given to calls in flight before the partition moves.")


class RewardLoggerConfig(_HttpService):
    port: int = Field(default=9104, ge=0, le=65535)
    dataset_dir: Path = Path(".baton/episodes")
    flush_every: int = Field(default=100, ge=1, description="Episodes per Parquet file at most.")
    flush_interval_s: float = Field(default=2.0, gt=0)


class BatonConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATON_", env_nested_delimiter="__", extra="forbid")

    workers: list[WorkerConfig] = Field(min_length=1)
    conductor: ConductorConfig = ConductorConfig()
    kafka: KafkaConfig = KafkaConfig()
    gateway: GatewayConfig = GatewayConfig()
    router: RouterConfig = RouterConfig()
    synthesizer: SynthesizerConfig = SynthesizerConfig()
    executor: ExecutorConfig = ExecutorConfig()
    reward_logger: RewardLoggerConfig = RewardLoggerConfig()

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file (passed as init values); no .env or secret files.
        return env_settings, init_settings

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, workers: list[WorkerConfig]) -> list[WorkerConfig]:
        seen: set[str] = set()
        for w in workers:
            if w.name in seen:
                raise ValueError(f"worker name {w.name!r} is used twice; names must be unique")
            seen.add(w.name)
        return workers

    @model_validator(mode="after")
    def _references(self) -> "BatonConfig":
        names = {w.name for w in self.workers}
        for w in self.workers:
            if w.fallback is not None and w.fallback not in names:
                raise ValueError(f"worker {w.name!r}: fallback {w.fallback!r} is not a configured worker")
        for label, plan in (("conductor.plan", self.conductor.plan), ("conductor.fallback_plan", self.conductor.fallback_plan)):
            if plan is None:
                continue
            unknown = [n for n in plan.workers if n not in names]
            if unknown:
                raise ValueError(f"{label}: unknown worker(s) {unknown}; known: {sorted(names)}")
        if self.conductor.backend == "static" and self.conductor.plan is None:
            raise ValueError("conductor.plan is required when conductor.backend is 'static'")
        return self

    def worker(self, name: str) -> WorkerConfig:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)

    @property
    def providers(self) -> list[str]:
        return sorted({w.provider for w in self.workers})

    def safe_plan(self) -> StaticPlan:
        """The plan used when the conductor's own is invalid: the configured one, else one step on the first worker."""
        if self.conductor.fallback_plan is not None:
            return self.conductor.fallback_plan
        return StaticPlan(workers=[self.workers[0].name], subtasks=["Answer the question."], access=[[]])


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike | None = None) -> BatonConfig:
    """Load and validate the YAML file named by `path` or BATON_CONFIG; raise ConfigError naming bad fields."""
    raw_path = path if path is not None else os.environ.get("BATON_CONFIG")
    if not raw_path:
        raise ConfigError("BATON_CONFIG is not set: point it at a Baton YAML configuration file")
    file = Path(raw_path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"configuration file {file} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"configuration file {file} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {file} must hold a mapping at the top level")
    # Kafka clients everywhere read this variable; honour it unless Baton's own override is set.
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and not os.environ.get("BATON_KAFKA__BOOTSTRAP_SERVERS"):
        data.setdefault("kafka", {})
        if isinstance(data["kafka"], dict):
            data["kafka"]["bootstrap_servers"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    try:
        config = BatonConfig(**data)
    except ValidationError as e:
        raise ConfigError(f"invalid configuration in {file}:\n{_format_errors(e)}") from None
    return _resolve_paths(config, file.resolve().parent)


def _resolve_paths(config: BatonConfig, base: Path) -> BatonConfig:
    """Relative paths in the file are relative to the file, so a config works from any directory."""
    for w in config.workers:
        if w.sim is not None and not w.sim.dataset.is_absolute():
            w.sim.dataset = (base / w.sim.dataset).resolve()
    return config
