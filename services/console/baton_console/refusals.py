"""The requests the gateway refused, per tenant and reason, from its counter
baton_gateway_tenant_requests: summed over every replica by a Prometheus server
(`console.prometheus_url`), or read from one gateway's /metrics. Read again when older than
`refresh_s`; a source that cannot be read yields the reason, never an error page."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from baton_platform.config import BatonConfig

log = logging.getLogger(__name__)

METRIC = "baton_gateway_tenant_requests"
SETTLED = ("answered", "failed")  # the outcomes of requests the gateway took; every other one is a refusal
# What each outcome means, in the order the page shows them; an outcome not named here shows as is.
REASONS = {"rate_limit_exceeded": "rate limit", "insufficient_quota": "budget spent",
           "overloaded": "at capacity", "rejected": "other rejections"}
TIMEOUT_S = 2.0


def shown_url(url: str) -> str:
    """`url` without its user, password, query or fragment: what a page or a log may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def gateway_metrics_url(config: BatonConfig) -> str:
    """The configured gateway's /metrics (on gateway.metrics_port, apart from its API); an address it listens on
    every interface of is read on loopback."""
    host = config.gateway.host
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{config.gateway.metrics_port}/metrics"


@dataclass
class Refusals:
    """Refused requests by tenant, then by outcome; where they were read and over what span, or why not."""

    counts: dict[str, dict[str, float]]
    source: str
    span: str
    error: str | None = None

    def reasons(self) -> list[str]:
        seen = {o for by in self.counts.values() for o in by}
        return [o for o in REASONS if o in seen] + sorted(seen - set(REASONS))


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """The refusals in a gateway's Prometheus text exposition."""
    counts: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            outcome, tenant = sample.labels.get("outcome", ""), sample.labels.get("tenant", "")
            if sample.name == METRIC + "_total" and outcome not in SETTLED and sample.value > 0:
                counts.setdefault(tenant, {})[outcome] = sample.value
    return counts


def parse_query(body: dict) -> dict[str, dict[str, float]]:
    """The refusals in a Prometheus instant query's answer (a vector of tenant and outcome)."""
    if body.get("status") != "success" or body.get("data", {}).get("resultType") != "vector":
        raise ValueError(f"Prometheus answered {body.get('errorType') or body.get('status')}: {body.get('error', '')}")
    counts: dict[str, dict[str, float]] = {}
    for item in body["data"]["result"]:
        value = float(item["value"][1])
        if value > 0:
            counts.setdefault(item["metric"].get("tenant", ""), {})[item["metric"].get("outcome", "")] = value
    return counts


@dataclass
class RefusalSource:
    """Where the refusals are read (a Prometheus server's API, else one gateway's /metrics), with the
    last read kept for `refresh_s` seconds."""

    url: str
    prometheus: bool
    window: str
    refresh_s: float = 5.0
    last: Refusals | None = None
    read_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def of(cls, config: BatonConfig) -> RefusalSource:
        c = config.console
        if c.prometheus_url:
            return cls(c.prometheus_url, True, c.refusals_window, c.refresh_s)
        return cls(c.gateway_metrics_url or gateway_metrics_url(config), False, c.refusals_window, c.refresh_s)

    @property
    def span(self) -> str:
        return f"in the last {self.window}" if self.prometheus else "since the gateway started (that replica only)"

    def query(self) -> str:
        return (f'sum by (tenant, outcome) (increase({METRIC}_total{{outcome!~"{"|".join(SETTLED)}"}}'
                f"[{self.window}]))")

    async def current(self) -> Refusals:
        async with self._lock:
            if self.last is None or time.monotonic() - self.read_at >= self.refresh_s:
                self.last = await self._read()
                self.read_at = time.monotonic()
        return self.last

    async def _read(self) -> Refusals:
        shown = shown_url(self.url)
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
                if self.prometheus:
                    r = await client.get(self.url.rstrip("/") + "/api/v1/query", params={"query": self.query()})
                    counts = parse_query(r.json()) if r.status_code in (200, 400, 422) else None
                else:
                    r = await client.get(self.url)
                    counts = parse_metrics(r.text) if r.status_code == 200 else None
            if counts is None:
                raise ValueError(f"HTTP {r.status_code}")
        except Exception as e:  # noqa: BLE001 - the page says why it has no refusals; it never fails for them
            reason = self._scrub(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            if self.last is None or self.last.error != reason:
                log.warning("refusals: cannot read %s: %s", shown, reason)
            return Refusals({}, shown, self.span, reason)
        return Refusals(counts, shown, self.span)

    def _scrub(self, text: str) -> str:
        """`text` without the configured URL's credentials or query, should an error quote them."""
        parts = urlsplit(self.url)
        for secret in (self.url, parts.password, parts.username, parts.query):
            if secret:
                text = text.replace(secret, shown_url(self.url) if secret == self.url else "***")
        return text[:300]
