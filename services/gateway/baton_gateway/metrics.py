"""The gateway's Prometheus metrics: requests by status, their latency, each tenant's requests, tokens
and spend, and the replica's load (requests waiting, requests shed)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, tenants: Iterable[str], waiting: Callable[[], float],
                 budgets: Iterable[str] = (), budget_used: Callable[[str], float] | None = None) -> None:
        self.requests = Counter("baton_gateway_requests", "Chat requests", ["status"], registry=registry)
        self.latency = Histogram("baton_gateway_request_seconds", "End-to-end request latency", registry=registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
        self.tenant_requests = Counter("baton_gateway_tenant_requests", "Chat requests by tenant and outcome",
                                       ["tenant", "outcome"], registry=registry)
        self.tenant_tokens = Counter("baton_gateway_tenant_tokens", "Tokens of final responses by tenant",
                                     ["tenant", "direction"], registry=registry)
        self.tenant_cost = Counter("baton_gateway_tenant_cost_usd", "Spend of final responses by tenant (USD)",
                                   ["tenant"], registry=registry)
        for tenant in tenants:  # every tenant shows from the start, at zero
            self.tenant_cost.labels(tenant)
        self.budget_used = Gauge("baton_gateway_tenant_budget_used", "Share of the tenant's budget spent (1: refused)",
                                 ["tenant"], registry=registry)
        if budget_used is not None:
            for tenant in budgets:
                self.budget_used.labels(tenant).set_function(functools.partial(budget_used, tenant))
        self.waiting = Gauge("baton_gateway_waiting", "Requests waiting for an answer", registry=registry)
        self.waiting.set_function(waiting)
        self.shed = Counter("baton_gateway_shed", "Requests refused (429) because the replica was at capacity",
                            registry=registry)
