"""BatonConfig, the whole file, composed of the sections' models and checking what no one section
can (names one section gives that another refers to); and how it is read: load_config (the YAML
file with environment overrides, relative paths resolved), ConfigWatch (read again when it changes)
and check_main (`baton-check-config`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from baton_platform.config.base import ConfigError, is_loopback
from baton_platform.config.conductor import ConductorConfig
from baton_platform.config.gateway import GatewayConfig, TenantConfig
from baton_platform.config.services import (
    ConsoleConfig,
    ExecutorConfig,
    JudgeConfig,
    KafkaConfig,
    RewardLoggerConfig,
    RouterConfig,
    SynthesizerConfig,
)
from baton_platform.config.workers import WorkerConfig
from baton_workflow import CONDUCTOR

# The name this logger had when the configuration was one module, so that log filters keep matching.
log = logging.getLogger("baton_platform.config")

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
    console: ConsoleConfig = ConsoleConfig()
    judge: JudgeConfig | None = None
    tenants: list[TenantConfig] = Field(default_factory=list,
                                        description="Who may call the gateway (gateway.auth: keys), with limits.")

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
    def _references(self) -> BatonConfig:
        names = {w.name for w in self.workers}
        if CONDUCTOR in names:
            raise ValueError(f"worker name {CONDUCTOR!r} is reserved for the conductor itself")
        for w in self.workers:
            if w.fallback is not None and w.fallback not in names:
                raise ValueError(f"worker {w.name!r}: fallback {w.fallback!r} is not a configured worker")
        # Static plans may hand a step to the conductor when recursion is on; the safe plan never does.
        recursive = names | {CONDUCTOR} if self.conductor.max_depth else names
        for label, plan, allowed in (("conductor.plan", self.conductor.plan, recursive),
                                     ("conductor.inner_plan", self.conductor.inner_plan, recursive),
                                     ("conductor.fallback_plan", self.conductor.fallback_plan, names)):
            if plan is None:
                continue
            unknown = [n for n in plan.workers if n not in allowed]
            if unknown:
                raise ValueError(f"{label}: unknown worker(s) {unknown}; known: {sorted(allowed)}")
        if self.judge is not None and self.judge.worker not in names:
            raise ValueError(f"judge.worker {self.judge.worker!r} is not a configured worker")
        if self.synthesizer.group_answer == "judge" and self.judge is None:
            raise ValueError("synthesizer.group_answer 'judge' needs a `judge:` section naming the judging worker")
        tenants = [t.name for t in self.tenants]
        if len(set(tenants)) != len(tenants):
            raise ValueError("tenants: every tenant needs its own name")
        hashes = [k.sha256 for t in self.tenants for k in t.keys]
        if len(set(hashes)) != len(hashes):
            raise ValueError("tenants: one key hash is listed twice; a key belongs to one tenant")
        if (self.gateway.auth == "none" and not is_loopback(self.gateway.host)
                and not self.gateway.allow_unauthenticated_network):
            raise ValueError(f"gateway.auth 'none' on host {self.gateway.host!r} would let anyone on the network "
                             "spend your provider budget: bind to 127.0.0.1, use `auth: keys`, or set "
                             "gateway.allow_unauthenticated_network: true behind your own auth proxy")
        if self.gateway.auth == "none" and not is_loopback(self.console.host) \
                and not self.gateway.allow_unauthenticated_network:
            raise ValueError(f"gateway.auth 'none' leaves the console open: on host {self.console.host!r} anyone on "
                             "the network could read every episode; bind it to 127.0.0.1 or use `auth: keys`")
        if self.conductor.backend == "static" and self.conductor.plan is None:
            raise ValueError("conductor.plan is required when conductor.backend is 'static'")
        return self

    def worker(self, name: str) -> WorkerConfig:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)

    @property
    def files_dir(self) -> str:
        """Where the gateway keeps files: gateway.files_dir, else `files` below the episodes' dataset."""
        return self.gateway.files_dir or f"{self.reward_logger.dataset_dir.rstrip('/')}/files"

    @property
    def providers(self) -> list[str]:
        return sorted({w.provider for w in self.workers})

    def secrets(self) -> list[str]:
        """The secret values this configuration names (provider keys, the conductor's key, the Kafka
        password), read from their environment variables: what logs must mask."""
        names = [w.api_key_env for w in self.workers] + [self.kafka.sasl_password_env]
        if self.conductor.openai is not None:
            names.append(self.conductor.openai.api_key_env)
        return [os.environ[n] for n in names if n and os.environ.get(n)]


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


class ConfigWatch:
    """The configuration file named by BATON_CONFIG, read again when it has changed: how a service
    learns of workers added to it while it runs. A file that no longer loads (half written, say) is
    logged and skipped; the next change is read again."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        raw = path if path is not None else os.environ.get("BATON_CONFIG")
        self.path = Path(raw) if raw else None
        self._stamp = self._modified()

    def _modified(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns if self.path else None
        except OSError:
            return None

    def changed(self) -> BatonConfig | None:
        """The configuration, when the file changed since the last look (or since start); else None."""
        stamp = self._modified()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            return load_config(self.path)
        except ConfigError as e:
            log.warning("the changed configuration was not taken: %s", e)
            return None


def _resolve_paths(config: BatonConfig, base: Path) -> BatonConfig:
    """Relative paths to inputs (sim datasets, conductor models and adapters, evaluation sets) are relative to the file,
    so a config works from any directory. The dataset directory is an output: relative to where the
    reward logger runs."""

    def resolved(path: Path) -> Path:
        return path if path.is_absolute() else (base / path).resolve()

    def maybe_resolved(path: Path | None) -> Path | None:
        return None if path is None else resolved(path)

    for w in config.workers:
        if w.sim is not None:
            w.sim.dataset = resolved(w.sim.dataset)
        if w.local_server is not None:
            w.local_server.model_path = maybe_resolved(w.local_server.model_path)
    config.conductor.evidence = maybe_resolved(config.conductor.evidence)
    transformers = config.conductor.transformers
    transformers.model_path = maybe_resolved(transformers.model_path)
    transformers.cache_dir = maybe_resolved(transformers.cache_dir)
    transformers.adapter = maybe_resolved(transformers.adapter)
    if config.conductor.vllm is not None:
        vllm = config.conductor.vllm
        vllm.adapters = {name: resolved(path) for name, path in vllm.adapters.items()}
    for eval_set in config.reward_logger.eval_sets.values():
        eval_set.path = resolved(eval_set.path)
    return config


def check_main(argv: list[str] | None = None) -> int:
    """`baton-check-config [--config FILE]`: validate a configuration file the way every service
    loads it, in the image that will read it (no development tools needed)."""
    import argparse

    parser = argparse.ArgumentParser(prog="baton-check-config", description=check_main.__doc__)
    parser.add_argument("--config", default=None, help="defaults to BATON_CONFIG")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"ok: {len(config.workers)} workers, providers {', '.join(config.providers)}, "
          f"conductor {config.conductor.backend}")
    return 0
