"""The router's Prometheus metrics: plans and their latency, the requests it sent straight to an
executor or dropped as expired, the policies it loaded, and the rewards its conductor learned from."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class PlanningMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.plans = Counter("baton_plans", "Plans published", ["backend", "outcome"], registry=registry)
        self.latency = Histogram("baton_planning_seconds", "Time to plan one request", registry=registry)
        self.direct = Counter("baton_router_direct", "One-step workflows sent straight to an executor", ["provider"],
                              registry=registry)
        self.expired = Counter("baton_router_expired", "Requests not planned: their deadline had passed",
                               registry=registry)


class PolicyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.loaded = Counter("baton_policies_loaded", "Policies loaded from baton.policy", ["version", "kind"],
                              registry=registry)
        self.failed = Counter("baton_policies_failed", "Policies from baton.policy that could not be loaded", ["kind"],
                              registry=registry)


class LearningMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.learned = Counter("baton_rewards_learned", "Graded episodes that taught a new worker's online head",
                               registry=registry)
