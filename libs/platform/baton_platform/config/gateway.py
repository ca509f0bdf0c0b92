"""The `gateway:` section and the `tenants:` it admits: who may call the gateway, with which key
hashes and scopes, and within which limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from baton_platform.config.base import _HttpService, _Strict


class GatewayConfig(_HttpService):
    port: int = Field(default=8080, ge=0, le=65535)
    metrics_port: int = Field(
        default=9100, ge=0, le=65535,
        description="Port of the gateway's /metrics (every tenant's requests and spend), on `host` beside the API's "
        "`port`, which does not serve it: an Ingress or load balancer in front of the API does not expose them. "
        "0: a free port.")
    request_timeout_s: float = Field(default=120.0, gt=0)
    stored_responses_days: float = Field(
        default=30.0, gt=0,
        description="Days a response created with `store: true` can be read back and continued (previous_response_id): "
        "the retention of the compacted topic baton.stored-responses, whose whole content every gateway replica "
        "holds in memory.")
    idempotency_hours: float = Field(
        default=24.0, gt=0,
        description="Hours a request's Idempotency-Key is kept: a repeat with the same key within them gets the first "
        "request's answer instead of a second workflow. The retention of baton.idempotency, which every gateway "
        "replica holds in memory; baton.responses must keep replies at least this long.")
    shutdown_drain_s: float = Field(
        default=0.0, ge=0,
        description="On SIGTERM, seconds the gateway goes on serving, each response closing its connection, "
        "before it stops: clients' keep-alive connections move to other replicas after an answer instead of "
        "being cut while idle (the chart sets 5).")
    keep_alive_s: int = Field(
        default=75, gt=0,
        description="Seconds an idle client connection stays open. Longer than clients' own idle expiry (httpx, "
        "the openai client's transport, drops its connections after 5 s) and load balancers' (60 s is common), so "
        "the client, not the gateway, ends an idle connection: a gateway that closes it first can do so just as "
        "the client sends a request on it, which the client then sees as a disconnect with no answer.")
    batch_concurrency: int = Field(default=8, gt=0, description="Lines of batches (POST /v1/batches) a replica runs "
                                   "at once.")
    batch_yield_waiting: int = Field(
        default=16, ge=0, description="A replica starts no batch line while more interactive requests than this "
        "wait on it for answers: batches take only the capacity interactive traffic leaves.")
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    files_dir: str | None = Field(
        default=None, min_length=1,
        description="Where uploaded files (POST /v1/files, purpose batch) and batch results are kept, per tenant: "
        "a local directory or an fsspec URL such as s3://bucket/prefix. Unset: `files` below "
        "reward_logger.dataset_dir, in the same store as the episodes.")
    max_file_bytes: int = Field(default=100 * 1024 * 1024, gt=0,
                                description="The largest file an upload may hold (JSON bodies: max_body_bytes).")
    max_messages: int = Field(default=256, gt=0)
    max_waiting: int = Field(
        default=2000, gt=0,
        description="Requests one replica holds waiting for answers. Past it a new request gets 429 with "
        "Retry-After at once (shed, not queued until its deadline).")
    auth: Literal["keys", "none"] = Field(
        default="keys",
        description="'keys': every call needs a tenant's API key (see `tenants`); 'none': anyone who reaches the "
        "gateway may call it, so it is refused on a non-loopback host unless allow_unauthenticated_network is set.")
    allow_unauthenticated_network: bool = Field(
        default=False, description="Let `auth: none` listen on a non-loopback host (behind your own auth proxy).")
    keys_env: str = Field(
        default="BATON_API_KEYS",
        description="Environment variable holding more key hashes, `tenant:sha256hex[:scope+scope]`, separated by "
        "commas or whitespace (how a Kubernetes Secret supplies them).")

    @model_validator(mode="after")
    def _metrics_apart(self) -> GatewayConfig:
        # One socket cannot be both: the metrics would be on the API port again, or the gateway would not start.
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"gateway.metrics_port must differ from gateway.port ({self.port}): /metrics is "
                             "served apart from the API")
        return self


Scope = Literal["chat", "feedback", "eval", "admin"]
SCOPES: tuple[str, ...] = ("chat", "feedback", "eval", "admin")
TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class TenantKey(_Strict):
    """One API key of a tenant, by its hash: the key itself is shown once by `baton keys create`."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, lowercase hex.")
    scopes: list[Scope] = Field(default_factory=lambda: list[Scope](["chat"]), min_length=1,
                                description="'chat': chat completions and models; 'feedback': POST /v1/feedback; "
                                "'eval': a chat request may name an evaluation item (metadata baton_eval), "
                                "whose graded reward trains the routing policy; 'admin': the console (every "
                                "tenant's episodes, read only).")
    name: str = Field(default="", max_length=64, description="Who holds the key, for people; never the key.")


class TenantConfig(_Strict):
    name: str = Field(pattern=TENANT_NAME)
    models: list[str] = Field(default_factory=lambda: ["*"], min_length=1,
                              description="Policies (the OpenAI `model`) the tenant may use; '*' is every one.")
    requests_per_minute: int | None = Field(default=None, gt=0, description="Per key; unset: no limit.")
    tokens_per_minute: int | None = Field(default=None, gt=0, description="Per key, input plus output; unset: no limit.")
    feedback_per_minute: int | None = Field(default=60, gt=0,
                                            description="Ratings (POST /v1/feedback) per key; unset: no limit.")
    budget_usd: float | None = Field(default=None, gt=0,
                                     description="Spend after which the tenant's calls get 429 insufficient_quota: "
                                     "every gateway replica's, kept on the compacted topic baton.spend.")
    max_open_batches: int = Field(default=10, ge=0, description="Batches (POST /v1/batches) the tenant may have "
                                  "running at once; 0: no Batch API.")
    max_batch_lines: int = Field(default=50_000, gt=0, description="Requests one batch of the tenant may hold.")
    max_request_cost_usd: float | None = Field(
        default=None, gt=0, description="With a budget: the most one request may cost, sent as its cost cap "
        "(synthesizer.max_cost_usd and the request's baton_max_cost_usd may lower it) and reserved from the budget "
        "while it runs; unset: a hundredth of budget_usd.")
    keys: list[TenantKey] = Field(default_factory=list)
