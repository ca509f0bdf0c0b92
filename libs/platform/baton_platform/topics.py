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

GROUP_ROUTER = "baton-router"
GROUP_SYNTHESIZER = "baton-synthesizer"
GROUP_GATEWAY = "baton-gateway"
GROUP_REWARD_LOGGER = "baton-reward-logger"

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


def topic_plan(partitions: int, providers: list[str], stored_days: float = 30.0,
               idempotency_hours: float = 24.0) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """Partition counts and topic configs for the whole suite.

    Partitions bound the replicas that can share a topic's work, so every topic gets the same
    configured count; the policy topic has one (it is a tiny compacted log of current versions).
    Stored responses are compacted by id and deleted after `stored_days` (gateway.stored_responses_days);
    idempotency keys are kept `idempotency_hours` (gateway.idempotency_hours), uncompacted: the first
    claim of a key must stay the first.
    """
    counts = {t: partitions for t in (REQUESTS, WORKFLOW, RESPONSES, FEEDBACK, DLQ, STORED_RESPONSES, IDEMPOTENCY)}
    counts[POLICY] = 1
    configs = {POLICY: {"cleanup.policy": "compact"},
               STORED_RESPONSES: {"cleanup.policy": "compact,delete", "retention.ms": str(int(stored_days * 86_400_000))},
               IDEMPOTENCY: {"retention.ms": str(int(idempotency_hours * 3_600_000))}}
    # Graded episodes for the routers' online learning: one partition, since every replica reads
    # all of it, kept a week (the trainer folds new workers in from the episode files long before).
    counts[REWARDS] = 1
    configs[REWARDS] = {"retention.ms": str(7 * 24 * 3600 * 1000)}
    for provider in sorted(set(providers)):
        counts[tasks_topic(provider)] = partitions
        # One small compacted log per provider: the newest report of each executor replica.
        counts[limits_topic(provider)] = 1
        configs[limits_topic(provider)] = {"cleanup.policy": "compact", "segment.ms": "60000"}
    return counts, configs
