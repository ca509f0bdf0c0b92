"""The Batch API's endpoints, in OpenAI's formats: `POST /v1/batches`, `GET /v1/batches/{id}`,
`GET /v1/batches` and `POST /v1/batches/{id}/cancel`. The lines run through baton_gateway.batch_runner."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Tracer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton_gateway.api import ApiError, json_object
from baton_gateway.auth import Principal
from baton_gateway.batch_runner import BatchRunner
from baton_gateway.batches import ENDPOINTS, WINDOW, Batch, Batches, new_batch_object, parse_lines
from baton_gateway.files import FileStore
from baton_gateway.replies import Replies
from baton_gateway.responses_routes import ResponsesApi
from baton_gateway.routes import Api, error_response
from baton_platform import topics
from baton_platform.config import BatonConfig, TenantConfig
from baton_platform.service import Service

CREATE_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata"}
MAX_METADATA = 16
PAGE_MOST = 100
ID = re.compile(r"^batch_[0-9a-f]{24}$")


def batch_api(config: BatonConfig, service: Service, api: Api, responses: ResponsesApi, replies: Replies,
              files: FileStore, tracer: Tracer) -> tuple[BatchesApi, BatchRunner]:
    """The Batch API's endpoints and the runner of this replica's batches."""
    batches = Batches(config.kafka, service.publisher(
        topics.BATCHES, None, "Batches (POST /v1/batches), keyed by id; a record keyed cancel/<id> asks to stop one."))
    endpoints = {"/v1/chat/completions": api.complete, "/v1/responses": responses.complete}
    runner = BatchRunner(batches, files, config.files_dir, endpoints, tracer, config.gateway, replies.owns,
                         lambda: replies.waiting)
    return BatchesApi(api, batches, files, {t.name: t for t in config.tenants}, replies.reply_partition), runner


class BatchesApi:
    def __init__(self, api: Api, batches: Batches, files: FileStore, tenants: Mapping[str, TenantConfig],
                 home: Callable[[], int | None]) -> None:
        """`home`: a partition of baton.responses this replica owns, for a new batch to live on."""
        self._api, self._batches, self._files, self._tenants, self._home = api, batches, files, tenants, home
        self.table = batches.table

    def routes(self) -> list[Route]:
        return [
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.list, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    async def create(self, request: Request) -> Response:
        api = self._api
        try:
            principal = api.authorize(request, "chat")
            body = json_object(await api.read_body(request))
            endpoint, file_id, metadata = self._create_fields(body)
            limits = self._limits(principal)
            if self._batches.open_count(principal.tenant) >= limits.max_open_batches:
                raise ApiError(429, f"tenant {principal.tenant!r} has {limits.max_open_batches} batches running, its "
                               "max_open_batches; wait for one to finish", type="requests", code="batch_limit")
            content = await self._files.content(principal.tenant, file_id)
            meta = await self._files.get(principal.tenant, file_id)
            if content is None or meta is None or meta.get("purpose") != "batch":
                raise ApiError(404, f"No file with id {file_id!r} and purpose batch.", param="input_file_id")
            lines = parse_lines(content, endpoint, limits.max_batch_lines)
            home = self._home()
            if home is None:
                raise ApiError(503, "the gateway is not ready yet; retry shortly", type="service_unavailable")
            batch = Batch(principal.tenant, principal.key_id, sorted(principal.scopes), sorted(principal.models),
                          new_batch_object(file_id, endpoint, metadata, len(lines)), home)
            await self._save(batch)
        except ApiError as e:
            return error_response(e)
        return JSONResponse(self._batches.shown(batch))

    async def retrieve(self, request: Request) -> Response:
        try:
            batch = self._batch(request, self._api.authorize(request, "chat"))
        except ApiError as e:
            return error_response(e)
        return JSONResponse(self._batches.shown(batch))

    async def cancel(self, request: Request) -> Response:
        try:
            batch = self._batch(request, self._api.authorize(request, "chat"))
            if batch.status in ("validating", "in_progress", "finalizing"):
                try:
                    await self._batches.cancel(batch)
                except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so
                    raise ApiError(503, f"the batch could not be cancelled ({type(e).__name__}); retry shortly",
                                   type="service_unavailable") from None
        except ApiError as e:
            return error_response(e)
        return JSONResponse(self._batches.shown(batch))

    async def list(self, request: Request) -> Response:
        try:
            principal = self._api.authorize(request, "chat")
            limit = _limit(request.query_params.get("limit", "20"))
        except ApiError as e:
            return error_response(e)
        mine = self._batches.of(principal.tenant)
        after = request.query_params.get("after")
        if after:
            ids = [b.id for b in mine]
            mine = mine[ids.index(after) + 1:] if after in ids else []
        page = [self._batches.shown(b) for b in mine[:limit]]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None, "has_more": len(mine) > limit})

    def _batch(self, request: Request, principal: Principal) -> Batch:
        batch_id = request.path_params["batch_id"]
        batch = self._batches.get(principal.tenant, batch_id) if ID.match(batch_id) else None
        if batch is None:
            raise ApiError(404, f"No batch found with id {batch_id[:80]!r}.", param="batch_id")
        return batch

    def _limits(self, principal: Principal) -> TenantConfig:
        """The tenant's limits; with gateway.auth none, the one anonymous tenant has the defaults'."""
        tenant = self._tenants.get(principal.tenant)
        return tenant if tenant is not None else TenantConfig(name=principal.tenant)

    async def _save(self, batch: Batch) -> None:
        try:
            await self._batches.save(batch)
        except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so, keep nothing
            raise ApiError(503, f"the batch could not be created ({type(e).__name__}); retry shortly",
                           type="service_unavailable") from None

    @staticmethod
    def _create_fields(body: dict[str, Any]) -> tuple[str, str, dict[str, str] | None]:
        unknown = sorted(set(body) - CREATE_FIELDS)
        if unknown:
            raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
        endpoint, file_id = body.get("endpoint"), body.get("input_file_id")
        if endpoint not in ENDPOINTS:
            raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
        if body.get("completion_window") != WINDOW:
            raise ApiError(400, f"completion_window must be {WINDOW!r}", param="completion_window")
        if not isinstance(file_id, str) or not file_id:
            raise ApiError(400, "input_file_id must be the id of a file uploaded with purpose batch",
                           param="input_file_id")
        metadata = body.get("metadata")
        if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items())):
            raise ApiError(400, f"metadata must hold at most {MAX_METADATA} string pairs (keys up to 64 characters, "
                           "values up to 512)", param="metadata")
        return str(endpoint), file_id, metadata


def _limit(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= PAGE_MOST:
        raise ApiError(400, f"limit must be an integer from 1 to {PAGE_MOST}", param="limit")
    return int(raw)
