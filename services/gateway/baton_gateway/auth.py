"""Who may call the gateway, and how much.

A caller presents an API key; the gateway keeps only the keys' SHA-256 hashes, each belonging to one
tenant with scopes (`chat`, `feedback`, `eval`), the policies (OpenAI `model`s) it may use, a request
rate and a token rate per key, and a spend budget for the whole tenant. A key never leaves this
module: what is logged, traced or labelled is the tenant's name, and at most the first 12 hex digits
of a hash (`key_id`), which tells nothing about the key.

Rates are enforced where requests arrive, with no shared store: each gateway replica enforces its
share of every rate, equal to its share of the partitions of baton.responses (the same rule the
executors follow for provider limits). All replicas together therefore never admit more than the
configured rate; a tenant whose traffic reaches only some replicas may be stopped before it reaches
the whole of it.

Budgets hold across replicas and restarts: spend is the ledger on baton.spend that every replica
reads (baton_gateway.spend). A request of a budgeted tenant carries a cost cap (`cost_cap`), which
the synthesizer enforces, and reserves it before it runs, until its final response settles it; a
replica reserves at most its share of what the budget has left. Concurrent requests therefore
overrun a budget by at most what a workflow spends past its cap (its last step).
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
from baton_gateway.spend import SpendLedger
from baton_platform.apikeys import hash_key, parse_key_entries
from baton_platform.config import SCOPES, ConfigError, GatewayConfig, TenantConfig

ANONYMOUS = "anonymous"  # the tenant of every call when gateway.auth is 'none'
_NANO_USD = 1e-9  # sums of reservations are floats: a budget that holds them exactly must admit them


@dataclass(frozen=True)
class Principal:
    """The caller behind a request: its tenant, which key (by hash prefix), and what it may do."""

    tenant: str
    key_id: str
    scopes: frozenset[str]
    models: frozenset[str]
    digest: str = field(default="", repr=False)
    batch: bool = False  # a line of a batch: the tenant's budget holds it, not its key's rates

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
                 clock: Callable[[], float] = time.monotonic, share: Callable[[], float] = lambda: 1.0,
                 ledger: SpendLedger | None = None, max_cost_usd: float = 0.0) -> None:
        """`ledger`: the tenants' spend (in memory when None); `max_cost_usd`: the synthesizer's
        per-request cost cap (0: none), which a budgeted tenant's cap never exceeds."""
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
        self.ledger = ledger if ledger is not None else SpendLedger(set(self._tenants))
        self._max_cost_usd = max_cost_usd
        self._reserved: dict[str, float] = {}
        # request id -> the key that sent it, when, and the cost it reserved, until its final response settles it.
        self._pending: OrderedDict[str, tuple[Principal, float, float]] = OrderedDict()
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
        """The share of the tenant's budget spent (every replica's spend) or reserved by this replica's
        running requests (1.0 and above: its calls get 429 insufficient_quota)."""
        budget = self._tenants[tenant].budget_usd
        return (self.ledger.spent(tenant) + self._reserved.get(tenant, 0.0)) / budget if budget else 0.0

    def cost_cap(self, principal: Principal, asked_usd: float) -> float:
        """The cost cap of a request of a budgeted tenant: the least of what the request asked
        (metadata baton_max_cost_usd), the synthesizer's cap and the tenant's `max_request_cost_usd`
        (by default a hundredth of its budget); 0 for a tenant without a budget (no reservation)."""
        tenant = self._tenants.get(principal.tenant)
        if self.open or tenant is None or tenant.budget_usd is None:
            return 0.0
        own = tenant.max_request_cost_usd or tenant.budget_usd / 100
        return min(c for c in (asked_usd, self._max_cost_usd, own) if c > 0)

    def admit(self, principal: Principal, reserve_usd: float = 0.0) -> None:
        """Raise a 429 when the tenant's budget cannot hold `reserve_usd` more or the key is over a
        rate; else count the request and reserve its cost (`release` or `settle` give it back)."""
        if self.open:
            return
        tenant = self._tenants[principal.tenant]
        share = self._share_now()
        now = self._clock()
        if tenant.budget_usd is not None:
            self._check_budget(tenant, reserve_usd, share)
        if not principal.batch:
            self._check_rates(principal, tenant, share, now)
        if reserve_usd:
            self._reserved[tenant.name] = self._reserved.get(tenant.name, 0.0) + reserve_usd

    def _check_rates(self, principal: Principal, tenant: TenantConfig, share: float, now: float) -> None:
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

    def _check_budget(self, tenant: TenantConfig, reserve_usd: float, share: float) -> None:
        budget = tenant.budget_usd or 0.0
        left = budget - self.ledger.spent(tenant.name)
        held = self._reserved.get(tenant.name, 0.0)
        if left > 0 and held + reserve_usd <= left * share + _NANO_USD:
            return
        if left > 0 and held > 0:
            raise ApiError(429, f"Tenant {tenant.name!r} has ${left:.6f} of its budget of ${budget:g} left, held by its "
                           f"requests still running; this one may cost up to ${reserve_usd:g}. Please try again when "
                           "they have finished.", type="insufficient_quota", code="insufficient_quota",
                           headers={"retry-after": "1"})
        if left > 0:
            raise ApiError(429, f"Tenant {tenant.name!r} has ${left:.6f} of its budget of ${budget:g} left, less than "
                           f"this request may cost (up to ${reserve_usd:g}). Ask the operator of this gateway to raise "
                           "the budget.", type="insufficient_quota", code="insufficient_quota")
        raise ApiError(429, f"You exceeded your current quota: tenant {tenant.name!r} has spent its budget of "
                       f"${budget:g}. Ask the operator of this gateway to raise it.",
                       type="insufficient_quota", code="insufficient_quota")

    def release(self, tenant: str, reserved_usd: float) -> None:
        """Give back a reservation whose request will not run here (joined another, or not queued)."""
        if reserved_usd:
            self._reserved[tenant] = max(0.0, self._reserved.get(tenant, 0.0) - reserved_usd)

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

    def opened(self, request_id: str, principal: Principal, reserved_usd: float = 0.0) -> None:
        """Remember which key sent a request, and what it reserved, until its final response settles it."""
        now = self._clock()
        self._pending[request_id] = (principal, now, reserved_usd)
        # Answers that never come (a lost workflow) must not hold memory, or budget, for ever.
        while self._pending:
            rid, (who, since, reserved) = next(iter(self._pending.items()))
            if now - since <= self._pending_ttl:
                break
            del self._pending[rid]
            self.release(who.tenant, reserved)

    def settle(self, request_id: str, input_tokens: int, output_tokens: int) -> None:
        """Give back a final response's reservation and count its tokens against the key that sent
        it (only known for requests this replica admitted). Its spend is the ledger's."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        self.release(pending[0].tenant, pending[2])
        bucket = self._tokens.get(pending[0].digest)
        if bucket is not None:
            bucket.refill(bucket.per_minute, self._clock())
            bucket.level -= input_tokens + output_tokens
