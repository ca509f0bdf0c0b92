"""OpenAI's Files API: `POST /v1/files` (a multipart upload, purpose batch), `GET /v1/files`,
`GET /v1/files/{id}`, `GET /v1/files/{id}/content` and `DELETE /v1/files/{id}`, each scoped to the
caller's tenant. An upload has its own limit, gateway.max_file_bytes, not the JSON bodies' one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.trace import Tracer
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive

from baton_gateway.api import ApiError
from baton_gateway.auth import Principal
from baton_gateway.files import PURPOSES, FileStore, check_upload_purpose, too_large
from baton_gateway.routes import Api, error_response

# Room for the multipart framing and the `purpose` field around the file itself.
FORM_OVERHEAD_BYTES = 64 * 1024
FORM_FIELDS = ("file", "purpose")
T = TypeVar("T")

log = logging.getLogger(__name__)


class FilesApi:
    def __init__(self, api: Api, store: FileStore, tracer: Tracer) -> None:
        self._api, self._store, self._tracer = api, store, tracer

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.create, methods=["POST"]),
            Route("/v1/files", self.list, methods=["GET"]),
            Route("/v1/files/{file_id}", self.retrieve, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        async def upload(principal: Principal) -> Response:
            filename, purpose, content = await self._form(request)
            body = await self._stored(self._store.put(principal.tenant, filename, purpose, content))
            log.info("file %s from %s: %d bytes, purpose %s", body["id"], principal.tenant, body["bytes"], purpose)
            return JSONResponse(body)
        return await self._serve("POST /v1/files", request, upload)

    async def list(self, request: Request) -> Response:
        async def listed(principal: Principal) -> Response:
            purpose = request.query_params.get("purpose")
            if purpose is not None and purpose not in PURPOSES:
                raise ApiError(400, f"invalid purpose {purpose!r}: one of {', '.join(PURPOSES)}", param="purpose")
            files = await self._stored(self._store.list(principal.tenant, purpose))
            return JSONResponse({"object": "list", "data": files, "has_more": False,
                                 "first_id": files[0]["id"] if files else None,
                                 "last_id": files[-1]["id"] if files else None})
        return await self._serve("GET /v1/files", request, listed)

    async def retrieve(self, request: Request) -> Response:
        async def found(principal: Principal) -> Response:
            return JSONResponse(await self._file(request, principal))
        return await self._serve("GET /v1/files/{file_id}", request, found)

    async def content(self, request: Request) -> Response:
        async def read(principal: Principal) -> Response:
            file_id = request.path_params["file_id"]
            data = await self._stored(self._store.content(principal.tenant, file_id))
            if data is None:
                raise not_found(file_id)
            return Response(data, media_type="application/jsonl")
        return await self._serve("GET /v1/files/{file_id}/content", request, read)

    async def delete(self, request: Request) -> Response:
        async def deleted(principal: Principal) -> Response:
            file_id = request.path_params["file_id"]
            if not await self._stored(self._store.delete(principal.tenant, file_id)):
                raise not_found(file_id)
            log.info("file %s of %s deleted", file_id, principal.tenant)
            return JSONResponse({"id": file_id, "object": "file", "deleted": True})
        return await self._serve("DELETE /v1/files/{file_id}", request, deleted)

    async def _serve(self, name: str, request: Request, handle: Callable[[Principal], Awaitable[Response]]) -> Response:
        """Authorize the caller, run `handle`, answer its ApiError in OpenAI's shape; one span each."""
        with self._tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER,
                                                context=propagate.extract(request.headers)) as span:
            try:
                principal = self._api.authorize(request, "chat")
                span.set_attribute("baton.tenant", principal.tenant)
                response = await handle(principal)
            except ApiError as e:
                response = error_response(e)
            span.set_attribute("http.response.status_code", response.status_code)
            return response

    async def _file(self, request: Request, principal: Principal) -> dict[str, Any]:
        file_id = request.path_params["file_id"]
        body = await self._stored(self._store.get(principal.tenant, file_id))
        if body is None:
            raise not_found(file_id)
        return body

    async def _stored(self, operation: Awaitable[T]) -> T:
        """The store's answer; a store that cannot be reached is a 503, not a 500."""
        try:
            return await operation
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - say the store is unreachable, keep the gateway serving
            log.warning("the file store failed: %s", type(e).__name__)
            raise ApiError(503, f"the file store could not be reached ({type(e).__name__}); retry shortly",
                           type="service_unavailable") from None

    async def _form(self, request: Request) -> tuple[str, str, bytes]:
        """The upload's filename, purpose and content; a 413 for an upload past gateway.max_file_bytes,
        before it is read whole."""
        limit = self._store.max_bytes + FORM_OVERHEAD_BYTES
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large(self._store.max_bytes)
        limited = Request(request.scope, receive=limited_receive(request.receive, limit, self._store.max_bytes))
        try:
            form = await limited.form(max_files=1, max_fields=len(FORM_FIELDS))
        except (HTTPException, MultiPartException) as e:
            raise ApiError(400, f"invalid multipart/form-data body: {getattr(e, 'detail', None) or e}") from None
        try:
            return await upload_of(form, self._store)
        finally:
            await form.close()


async def upload_of(form: FormData, store: FileStore) -> tuple[str, str, bytes]:
    """Filename, purpose and content of a parsed upload form, each checked."""
    for name in form:
        if name not in FORM_FIELDS:
            raise ApiError(400, f"invalid request: {name}: this parameter is not supported", param=name)
        if len(form.getlist(name)) > 1:
            raise ApiError(400, f"invalid request: {name}: given more than once", param=name)
    purpose = form.get("purpose")
    check_upload_purpose(purpose if isinstance(purpose, str) else None)
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise ApiError(400, "invalid request: file: a file upload is required", param="file")
    if file.size is not None:
        store.check_size(file.size)
    content = await file.read()
    return file.filename or "upload.jsonl", str(purpose), content


def limited_receive(receive: Receive, limit: int, max_bytes: int) -> Receive:
    """`receive`, with a 413 once the body passes `limit` bytes: a body sent without Content-Length
    (chunked) is cut as it arrives, not after it is buffered."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise too_large(max_bytes)
        return message
    return counted


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", param="id")
