"""Who may call the gateway, and how much.

A caller presents an API key; the gateway keeps only the keys' SHA-256 hashes, each belonging to one
tenant with scopes (`chat`, `feedback`, `eval`), the policies (OpenAI `model`s) it may use, a request
rate and a token rate per key, and a spend budget for the whole tenant. A key never leaves this
module: what is logged, traced or labelled is the tenant's name, and at most the first 12 hex digits
of a hash (`key_id`), which tells nothing about the key.

Limits are enforced where requests arrive, with no shared store: each gateway replica enforces its
share of every limit, equal to its share of the partitions of baton.responses (the same rule the
executors follow for provider limits). All replicas together therefore never admit more than the
configured rate or spend more than the budget; a tenant whose traffic reaches only some replicas
may be stopped before it reaches the whole of it. Spend is counted from the final responses a
replica receives, since that replica started.
"""

from __future__ import annotations

import hmac
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from baton_gateway.api import ApiError
from baton_platform.apikeys import hash_key, parse_key_entries
from baton_platform.config import SCOPES, ConfigError, GatewayConfig, TenantConfig

ANONYMOUS = "anonymous"  # the tenant of every call when gateway.auth is 'none'


@dataclass(frozen=True)
class Principal:
    """The caller behind a request: its tenant, which key (by hash prefix), and what it may do."""

    tenant: str
    key_id: str
    scopes: frozenset[str]
    models: frozenset[str]
    digest: str = field(default="", repr=False)

    def may_use(self, model: str) -> bool:
        return "*" in self.models or model in self.models


class Bucket:
    """A token bucket holding at most one minute of its rate. It may go below zero (tokens are known
    only once the answer is), and then admits nothing until it has refilled above zero."""

    def __init__(self, per_minute: float, now: float) -> None:
        self.per_minute = per_minute
        self.level = per_minute
        self.updated = now

    def refill(self, per_minute: float, now: float) -> float:
        # A rebalance may change this replica's share: the capacity follows it.
        self.per_minute = per_minute
        self.level = min(per_minute, self.level + (now - self.updated) * per_minute / 60)
        self.updated = now
        return self.level

    def seconds_until(self, level: float) -> float:
        return max(0.0, (level - self.level) * 60 / self.per_minute)


class Gatekeeper:
    """Authentication, model policy, rates and budgets of the gateway's callers."""

    def __init__(self, settings: GatewayConfig, tenants: Sequence[TenantConfig], *, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, share: Callable[[], float] = lambda: 1.0) -> None:
        self.open = settings.auth == "none"
        self._clock = clock
        self._share = share
        self._tenants: dict[str, TenantConfig] = {t.name: t for t in tenants}
        self._keys: list[Principal] = []
        env = os.environ if env is None else env
        entries = [(t.name, k.sha256, frozenset(k.scopes)) for t in tenants for k in t.keys]
        entries += parse_key_entries(env.get(settings.keys_env, ""), settings.keys_env)
        seen: set[str] = set()
        for tenant, digest, scopes in entries:
            if tenant not in self._tenants:
                raise ConfigError(f"a key of tenant {tenant!r} was given, but `tenants:` has no such tenant; "
                                  f"known: {sorted(self._tenants) or 'none'}")
            if digest in seen:
                raise ConfigError(f"key {digest[:12]}… is given twice; a key belongs to one tenant")
            seen.add(digest)
            self._keys.append(Principal(tenant, digest[:12], scopes, frozenset(self._tenants[tenant].models), digest))
        if not self.open and not self._keys:
            raise ConfigError("gateway.auth is 'keys' but no key is configured: add key hashes to `tenants:` or to "
                              f"{settings.keys_env} (`baton keys create --tenant NAME` mints one), or set "
                              "gateway.auth: none for a gateway on loopback")
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self._ratings: dict[str, Bucket] = {}
        self.spent: dict[str, float] = {}
        # request id -> the key that sent it, until its final response settles it.
        self._pending: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._pending_ttl = settings.request_timeout_s + 600

    @property
    def tenants(self) -> list[str]:
        return sorted(self._tenants) if not self.open else [ANONYMOUS]

    # -- who ---------------------------------------------------------------------------------------

    def authenticate(self, authorization: str | None, scope: str) -> Principal:
        if self.open:
            return Principal(ANONYMOUS, "", frozenset(SCOPES), frozenset({"*"}))
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "You didn't provide an API key. You need to provide your API key in an Authorization "
                           "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        digest = hash_key(token).encode()
        found = None
        # Every stored hash is compared, in constant time, so timing tells nothing about which matched.
        for p in self._keys:
            if hmac.compare_digest(digest, p.digest.encode()):
                found = p
        if found is None:
            raise ApiError(401, "Incorrect API key provided. Ask the operator of this gateway for a valid key.",
                           code="invalid_api_key")
        self.require(found, scope)
        return found

    @staticmethod
    def require(principal: Principal, scope: str) -> None:
        """Refuse a key that lacks a scope; `auth: none` holds every scope."""
        if scope not in principal.scopes:
            # OpenAI answers a restricted key that lacks a scope this way: 401, code null.
            raise ApiError(401, f"You have insufficient permissions for this operation. Missing scopes: {scope}. "
                           "Ask the operator of this gateway for a key with that scope.")

    def visible_models(self, principal: Principal, known: set[str]) -> list[str]:
        return sorted(m for m in known if principal.may_use(m))

    # -- how much ----------------------------------------------------------------------------------

    def _share_now(self) -> float:
        share = self._share()
        return share if share > 0 else 1.0

    def budgeted(self) -> list[str]:
        """The tenants with a spend budget."""
        return sorted(name for name, t in self._tenants.items() if t.budget_usd is not None)

    def budget_used(self, tenant: str) -> float:
        """The share of the tenant's budget spent, as this replica counts it against its part of it
        (1.0 and above: its calls get 429 insufficient_quota here)."""
        budget = self._tenants[tenant].budget_usd
        return self.spent.get(tenant, 0.0) / (budget * self._share_now()) if budget else 0.0

    def admit(self, principal: Principal) -> None:
        """Raise a 429 when the tenant's budget is spent or the key is over a rate; else count the request."""
        if self.open:
            return
        tenant = self._tenants[principal.tenant]
        share = self._share_now()
        now = self._clock()
        if tenant.budget_usd is not None:
            spent = self.spent.get(tenant.name, 0.0)
            if spent >= tenant.budget_usd * share:
                raise ApiError(429, f"You exceeded your current quota: tenant {tenant.name!r} has spent its budget of "
                               f"${tenant.budget_usd:g}. Ask the operator of this gateway to raise it.",
                               type="insufficient_quota", code="insufficient_quota")
        requests = tokens = None
        if tenant.requests_per_minute is not None:
            limit = max(1.0, tenant.requests_per_minute * share)
            requests = self._requests.setdefault(principal.digest, Bucket(limit, now))
            if requests.refill(limit, now) < 1:
                self._limited("requests per minute (RPM)", limit, requests.seconds_until(1))
        if tenant.tokens_per_minute is not None:
            limit = max(1.0, tenant.tokens_per_minute * share)
            tokens = self._tokens.setdefault(principal.digest, Bucket(limit, now))
            if tokens.refill(limit, now) <= 0:
                self._limited("tokens per minute (TPM)", limit, tokens.seconds_until(1))
        if requests is not None:
            requests.level -= 1

    def admit_feedback(self, principal: Principal) -> None:
        """Raise a 429 when the key is over its tenant's feedback rate; else count the rating."""
        if self.open:
            return
        per_minute = self._tenants[principal.tenant].feedback_per_minute
        if per_minute is None:
            return
        limit, now = max(1.0, per_minute * self._share_now()), self._clock()
        bucket = self._ratings.setdefault(principal.digest, Bucket(limit, now))
        if bucket.refill(limit, now) < 1:
            self._limited("ratings per minute", limit, bucket.seconds_until(1))
        bucket.level -= 1

    @staticmethod
    def _limited(what: str, limit: float, wait_s: float) -> None:
        retry = max(1, math.ceil(wait_s))
        kind = "tokens" if what.startswith("tokens") else "requests"
        raise ApiError(429, f"Rate limit reached for this API key on {what}: limit {limit:g}. Please try again in "
                       f"{retry}s.", type=kind, code="rate_limit_exceeded", headers={"retry-after": str(retry)})

    def opened(self, request_id: str, principal: Principal) -> None:
        """Remember which key sent a request until its final response settles its tokens."""
        now = self._clock()
        self._pending[request_id] = (principal, now)
        # Answers that never come (a lost workflow) must not hold memory for ever.
        while self._pending:
            rid, (_, since) = next(iter(self._pending.items()))
            if now - since <= self._pending_ttl:
                break
            del self._pending[rid]

    def settle(self, request_id: str, tenant: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        """Count a final response's spend against its tenant, and its tokens against the key that sent it
        (only known for requests this replica admitted)."""
        if tenant:
            self.spent[tenant] = self.spent.get(tenant, 0.0) + cost_usd
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        bucket = self._tokens.get(pending[0].digest)
        if bucket is not None:
            bucket.refill(bucket.per_minute, self._clock())
            bucket.level -= input_tokens + output_tokens
