"""The console service: read-only pages of the episode dataset, and of the trainer's gate decisions in
the policy store, for operators (an `admin` key)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from baton_console import data, pages
from baton_console.access import COOKIE, AdminKeys
from baton_console.live import Follower, LiveEpisodes
from baton_console.metrics import ConsoleMetrics
from baton_console.refusals import RefusalSource
from baton_platform.config import BatonConfig, load_config
from baton_platform.http import live_endpoint, metrics_endpoint, ready_endpoint, serve

SERVICE_NAME = "baton-console"
MAX_FORM_BYTES = 4096


class Console:
    """The pages, each read from the episodes (with the live answers), the gateway's refusals and the
    gate decisions as of at most `console.refresh_s` ago."""

    def __init__(self, config: BatonConfig, env: Mapping[str, str] | None = None) -> None:
        self.keys = AdminKeys(config, env)
        self.live = LiveEpisodes(config.console.max_episodes, data.COLUMNS) if config.console.live else None
        self.follower = Follower(config.kafka, self.live) if self.live is not None else None
        self.episodes = data.Episodes(config.reward_logger.dataset_dir, config.console.refresh_s,
                                      config.console.max_episodes, self.live)
        store = config.router.policy_store
        self.decisions = data.Decisions(store, config.router.policy_name, config.console.refresh_s) \
            if store else None
        self.trace_url = config.console.trace_url
        self.budgets = {t.name: t.budget_usd for t in config.tenants}
        self.refusals = RefusalSource.of(config)
        self.registry = CollectorRegistry()
        self.metrics = ConsoleMetrics(self.registry)

    def routes(self) -> list[Route]:
        pages_ = {"/": self.overview, "/quality": self.quality, "/workflows": self.workflows, "/workers": self.workers,
                  "/tenants": self.tenants, "/episodes": self.search, "/episodes/{request_id}": self.episode}
        return [Route(path, self._guarded(path, handler)) for path, handler in pages_.items()] + [
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/health/live", live_endpoint()), Route("/health/ready", ready_endpoint([self.episodes.ready])),
            Route("/metrics", metrics_endpoint(self.registry))]

    def _guarded(self, path: str, handler):
        async def page(request: Request) -> Response:
            if not self.keys.allows(request.headers.get("authorization"), request.cookies.get(COOKIE)):
                response: Response = RedirectResponse("/login", status_code=303)
            else:
                rows = await self.episodes.current()
                self.metrics.episodes.set(len(rows))
                response = await handler(request, rows)
            self.metrics.pages.labels(path, str(response.status_code)).inc()
            return response

        return page

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.follower is not None:
            self.follower.start()
        try:
            yield
        finally:
            if self.follower is not None:
                await self.follower.stop()

    async def overview(self, request: Request, rows: list[dict]) -> Response:
        by = request.query_params.get("by", "tenant")
        return HTMLResponse(pages.overview(rows, by if by in data.SPLITS else "tenant", self.live))

    async def quality(self, request: Request, rows: list[dict]) -> Response:
        if self.decisions is None:
            return HTMLResponse(pages.quality(rows))
        decided = await self.decisions.current()
        return HTMLResponse(pages.quality(rows, decided, self.decisions.problem))

    async def workflows(self, request: Request, rows: list[dict]) -> Response:
        return HTMLResponse(pages.workflows(rows, request.query_params.get("per") == "eval"))

    async def workers(self, request: Request, rows: list[dict]) -> Response:
        return HTMLResponse(pages.workers(rows))

    async def tenants(self, request: Request, rows: list[dict]) -> Response:
        return HTMLResponse(pages.tenants(rows, self.budgets, await self.refusals.current()))

    async def search(self, request: Request, rows: list[dict]) -> Response:
        query = {k: request.query_params.get(k, "")[:200] for k in ("request_id", "tenant", "worker", "result")}
        return HTMLResponse(pages.episodes(data.search(rows, **query), query))

    async def episode(self, request: Request, rows: list[dict]) -> Response:
        found = self.episodes.find(request.path_params["request_id"])
        if found is None:
            return HTMLResponse(pages.frame("Not found", "<p>No episode has that request id (yet).</p>"), 404)
        return HTMLResponse(pages.episode(found, self.episodes.feedback.get(found["request_id"], []), self.trace_url))

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return HTMLResponse(pages.login())
        body = await request.body()
        key = parse_qs(body[:MAX_FORM_BYTES].decode(errors="replace")).get("key", [""])[0].strip()
        digest = self.keys.key_digest(key)
        if digest is None:
            return HTMLResponse(pages.login("That is not a key with the admin scope."), 401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, self.keys.session(digest), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response


def create_app(config: BatonConfig, env: Mapping[str, str] | None = None) -> Starlette:
    console = Console(config, env)
    return Starlette(routes=console.routes(), lifespan=console.lifespan)


def run() -> None:
    config = load_config()
    serve(create_app(config), config.console.host, config.console.port, service=SERVICE_NAME,
          secrets=config.secrets())


if __name__ == "__main__":
    run()
