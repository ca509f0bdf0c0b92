"""Baton's one configuration file (named by BATON_CONFIG), validated, with environment overrides.

Any field can be overridden by an environment variable `BATON_<SECTION>__<FIELD>` (for example
`BATON_GATEWAY__PORT=8081`); `KAFKA_BOOTSTRAP_SERVERS` is honoured too, as every Kafka tool does.

One module per part of the file, each importing only those below it: base (the strict model base,
ConfigError), workers, conductor, gateway (and tenants), services (Kafka and the services behind the
gateway), and root (BatonConfig, which composes them, and how the file is loaded). Every name is
imported from here, `baton_platform.config`, whichever module defines it.
"""

from baton_platform.config.base import ConfigError, is_loopback
from baton_platform.config.conductor import (
    AccessSpec,
    ConductorConfig,
    OpenAIConductorConfig,
    PolicyConductorConfig,
    StaticPlan,
    TransformersConductorConfig,
    VllmConductorConfig,
)
from baton_platform.config.gateway import SCOPES, TENANT_NAME, GatewayConfig, Scope, TenantConfig, TenantKey
from baton_platform.config.root import BatonConfig, ConfigWatch, check_main, load_config
from baton_platform.config.services import (
    DEFAULT_POLICY_NAME,
    ConsoleConfig,
    EvalSetConfig,
    ExecutorConfig,
    GraderName,
    JudgeConfig,
    KafkaConfig,
    RewardLoggerConfig,
    RouterConfig,
    SynthesizerConfig,
)
from baton_platform.config.workers import (
    PROVIDERS,
    Limits,
    LocalServerSettings,
    Price,
    Provider,
    SimSettings,
    WorkerConfig,
)

__all__ = [
    "DEFAULT_POLICY_NAME",
    "PROVIDERS",
    "SCOPES",
    "TENANT_NAME",
    "AccessSpec",
    "BatonConfig",
    "ConductorConfig",
    "ConfigError",
    "ConfigWatch",
    "EvalSetConfig",
    "ExecutorConfig",
    "GatewayConfig",
    "GraderName",
    "JudgeConfig",
    "KafkaConfig",
    "Limits",
    "LocalServerSettings",
    "OpenAIConductorConfig",
    "PolicyConductorConfig",
    "Price",
    "Provider",
    "RewardLoggerConfig",
    "ConsoleConfig",
    "RouterConfig",
    "Scope",
    "SimSettings",
    "StaticPlan",
    "SynthesizerConfig",
    "TenantConfig",
    "TenantKey",
    "TransformersConductorConfig",
    "VllmConductorConfig",
    "WorkerConfig",
    "check_main",
    "is_loopback",
    "load_config",
]
