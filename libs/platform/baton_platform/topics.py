"""Every topic and consumer group name of the suite, in one place."""

REQUESTS = "baton.requests"
WORKFLOW = "baton.workflow"
RESPONSES = "baton.responses"
FEEDBACK = "baton.feedback"
POLICY = "baton.policy"
REWARDS = "baton.rewards"
DLQ = "baton.dlq"
TASKS_PREFIX = "baton.tasks."
LIMITS_PREFIX = "baton.limits."
STORED_RESPONSES = "baton.stored-responses"
IDEMPOTENCY = "baton.idempotency"
SPEND = "baton.spend"
BATCHES = "baton.batches"

GROUP_ROUTER = "baton-router"
GROUP_SYNTHESIZER = "baton-synthesizer"
GROUP_GATEWAY = "baton-gateway"
GROUP_REWARD_LOGGER = "baton-reward-logger"
GROUP_CONSOLE = "baton-console"  # a prefix: each console replica reads in a group of its own

# The record header that carries a dead letter's reason.
DLQ_REASON_HEADER = "baton-dlq-reason"


def tasks_topic(provider: str) -> str:
    return f"{TASKS_PREFIX}{provider}"


def limits_topic(provider: str) -> str:
    """Where a provider's executor replicas report the load that their limit shares follow."""
    return f"{LIMITS_PREFIX}{provider}"


def executor_group(provider: str) -> str:
    return f"baton-executor-{provider}"


def executor_service_name(provider: str) -> str:
    return f"baton-executor-{provider}"


# Every topic that is not compacted is kept this long: the episode log can always be rebuilt from
# baton.responses, and a consumer stopped over a long weekend loses nothing.
RETENTION_DAYS = 7
DAY_MS = 86_400_000


def topic_plan(partitions: int, providers: list[str], *, stored_days: float = 30.0, idempotency_hours: float = 24.0,
               replication_factor: int = 1) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """Partition counts and topic configs for the whole suite.

    Partitions bound the replicas that can share a topic's work, so every topic gets the same
    configured count; the policy topic has one (it is a tiny compacted log of current versions).
    Every topic has an explicit retention: RETENTION_DAYS; baton.responses at least as long as
    idempotency keys (a repeat reads the first answer there); stored responses compacted by id and
    deleted after `stored_days` (gateway.stored_responses_days); idempotency keys kept
    `idempotency_hours`, uncompacted (the first claim of a key must stay the first). With three
    replicas or more, a write needs two in sync (min.insync.replicas=2), so an acknowledged record
    survives losing a broker.
    """
    week = {"retention.ms": str(RETENTION_DAYS * DAY_MS)}
    counts = {t: partitions for t in (REQUESTS, WORKFLOW, RESPONSES, FEEDBACK, DLQ, STORED_RESPONSES, IDEMPOTENCY)}
    configs: dict[str, dict[str, str]] = {t: dict(week) for t in (REQUESTS, WORKFLOW, FEEDBACK, DLQ)}
    configs[RESPONSES] = {"retention.ms": str(max(RETENTION_DAYS * DAY_MS, int(idempotency_hours * 3_600_000)))}
    counts[POLICY] = 1
    configs[POLICY] = {"cleanup.policy": "compact"}
    configs[STORED_RESPONSES] = {"cleanup.policy": "compact,delete", "retention.ms": str(int(stored_days * DAY_MS))}
    configs[IDEMPOTENCY] = {"retention.ms": str(int(idempotency_hours * 3_600_000))}
    # Each tenant's spend per partition of baton.responses (baton_gateway.spend): compacted, never deleted.
    counts[SPEND] = 1
    configs[SPEND] = {"cleanup.policy": "compact"}
    # Batches (baton_gateway.batches), keyed by id: compacted, kept as long as stored responses.
    counts[BATCHES] = 1
    configs[BATCHES] = {"cleanup.policy": "compact,delete", "retention.ms": str(int(stored_days * DAY_MS))}
    # Graded episodes for the routers' online learning: one partition, since every replica reads
    # all of it (the trainer folds new workers in from the episode files long before it expires).
    counts[REWARDS] = 1
    configs[REWARDS] = dict(week)
    for provider in sorted(set(providers)):
        counts[tasks_topic(provider)] = partitions
        configs[tasks_topic(provider)] = dict(week)
        # One small compacted log per provider: the newest report of each executor replica.
        counts[limits_topic(provider)] = 1
        configs[limits_topic(provider)] = {"cleanup.policy": "compact", "segment.ms": "60000"}
    if replication_factor >= 3:
        for config in configs.values():
            config["min.insync.replicas"] = "2"
    return counts, configs


def topic_plan_for(config) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """`topic_plan` for a BatonConfig: its partitions, providers, retentions and replication."""
    return topic_plan(config.kafka.partitions, config.providers, stored_days=config.gateway.stored_responses_days,
                      idempotency_hours=config.gateway.idempotency_hours,
                      replication_factor=config.kafka.replication_factor)
