"""The Responses API's endpoints: `POST /v1/responses` (a JSON answer or OpenAI's typed event stream),
`GET /v1/responses/{id}` and `DELETE /v1/responses/{id}` for stored responses. Requests run through
the chat-completions path (`Api`): the same admission, auth, limits, budgets and workflows."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Tracer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton.v1 import responses_pb2
from baton_gateway.api import ApiError, json_object
from baton_gateway.auth import Principal
from baton_gateway.idempotency import IdempotencyKey, key_of
from baton_gateway.responses_api import (
    ID_PREFIX,
    ResponsesRequest,
    chat_request_for,
    function_call_item,
    message_item,
    now,
    parse_responses_request,
    response_body,
    turn_messages,
)
from baton_gateway.routes import Api, error_response
from baton_gateway.stored import StoredResponses
from baton_gateway.streaming import ClosingStreamingResponse

log = logging.getLogger(__name__)


class ResponsesApi:
    def __init__(self, api: Api, store: StoredResponses, tracer: Tracer) -> None:
        self._api, self._store, self._tracer = api, store, tracer

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
        ]

    async def create(self, request: Request) -> Response:
        api, started = self._api, time.perf_counter()
        with self._tracer.start_as_current_span("POST /v1/responses", kind=trace.SpanKind.SERVER,
                                                context=propagate.extract(request.headers)) as span:
            principal = None
            try:
                principal = api.authorize(request, "chat")
                api.admit()
                raw = await api.read_body(request)
                req = parse_responses_request(json_object(raw))
                chat = chat_request_for(req, await self._history(req, principal), api.visible_models(principal))
                api.check_eval(principal, chat)
                request_id, waiter, deadline = await api.ask(chat, principal, span, key_of(request, raw, principal.tenant))
            except ApiError as e:
                return api.refused(e, principal, span)
            created = now()
            if req.stream:
                log.info("request %s from %s: streaming a response", request_id, principal.tenant)
                return ClosingStreamingResponse(
                    self._stream(req, request_id, principal, created, waiter, deadline),
                    media_type="text/event-stream", headers={"x-baton-request-id": request_id})
            try:
                response = await api.final_response(request_id, waiter, deadline)
            except ApiError as e:
                return api.failed(e, request_id, principal, span)
            headers = api.answered(request_id, principal, response, span, started)
            body = response_body(request_id, req, created, response)
            await self._keep(req, request_id, principal, body, response)
            return JSONResponse(body, headers=headers)

    async def complete(self, raw: bytes, principal: Principal, span: Span,
                       key: IdempotencyKey | None) -> tuple[str, dict[str, Any]]:
        """A response whose request body is `raw`, not streamed, as a batch line runs it (stored and
        continued as any other): its request id and response object; an ApiError as the endpoint
        would answer it."""
        api = self._api
        req = parse_responses_request(json_object(raw))
        if req.stream:
            raise ApiError(400, "stream is not supported in a batch", param="stream")
        chat = chat_request_for(req, await self._history(req, principal), api.visible_models(principal))
        api.check_eval(principal, chat)
        request_id, waiter, deadline = await api.ask(chat, principal, span, key)
        created = now()
        response = await api.final_response(request_id, waiter, deadline)
        body = response_body(request_id, req, created, response)
        await self._keep(req, request_id, principal, body, response)
        return request_id, body

    async def _history(self, req: ResponsesRequest, principal: Principal) -> list[dict[str, Any]]:
        if req.previous_response_id is None:
            return []
        history = await self._store.history(req.previous_response_id.removeprefix(ID_PREFIX), principal.tenant)
        if history is None:
            raise ApiError(400, f"Previous response with id {req.previous_response_id!r} not found.",
                           param="previous_response_id", code="previous_response_not_found")
        return history

    async def _keep(self, req: ResponsesRequest, request_id: str, principal: Principal, body: dict[str, Any],
                    response: responses_pb2.Response) -> None:
        if not req.store:
            return
        previous = req.previous_response_id.removeprefix(ID_PREFIX) if req.previous_response_id else None
        try:
            await self._store.put(request_id, principal.tenant, body, turn_messages(req, response), previous)
        except Exception as e:  # noqa: BLE001 - the answer stands; only its continuation is lost
            log.warning("response %s could not be stored (%s): a later turn cannot continue it",
                        request_id, type(e).__name__)

    async def _stream(self, req: ResponsesRequest, request_id: str, principal: Principal, created: int,
                      waiter: asyncio.Queue[responses_pb2.Response], deadline: float) -> AsyncIterator[str]:
        """OpenAI's typed events: created, in_progress, the message's text as its step produces it
        (reconciled with the final answer, as chat streams are: baton_gateway.streaming), each tool
        call, then completed; a workflow that fails ends the stream with response.failed."""
        api, events, counted = self._api, Events(request_id), False
        try:
            yield events.send("response.created", response=response_body(request_id, req, created))
            yield events.send("response.in_progress", response=response_body(request_id, req, created))
            try:
                async for kind, value in api.streamed(request_id, waiter, deadline):
                    if kind == "text":
                        for event in events.text(value):
                            yield event
                    elif kind == "progress":
                        yield value
                    else:
                        response, rest = value
            except ApiError as e:
                api.count(str(e.status))
                counted = True
                error = {"code": e.code or e.type, "message": e.message}
                yield events.send("response.failed",
                                  response=response_body(request_id, req, created, status="failed", error=error))
                return
            api.count("200")
            counted = True
            for event in events.finish(response, rest):
                yield event
            body = response_body(request_id, req, created, response)
            yield events.send(f"response.{'completed' if body['status'] == 'completed' else 'incomplete'}",
                              response=body)
            await self._keep(req, request_id, principal, body, response)
        except (asyncio.CancelledError, GeneratorExit):
            if not counted:
                api.count("499")  # the client went away; the workflow runs on and is logged
            raise
        finally:
            api.abandon(request_id, waiter)

    async def retrieve(self, request: Request) -> Response:
        try:
            principal = self._api.authorize(request, "chat")
            record = await self._stored(request, principal)
        except ApiError as e:
            return error_response(e)
        return JSONResponse(record["body"])

    async def delete(self, request: Request) -> Response:
        try:
            principal = self._api.authorize(request, "chat")
            await self._stored(request, principal)
            response_id = request.path_params["response_id"]
            try:
                await self._store.delete(response_id.removeprefix(ID_PREFIX), principal.tenant)
            except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so, delete nothing
                raise ApiError(503, f"the response could not be deleted ({type(e).__name__}); retry shortly",
                               type="service_unavailable") from None
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def _stored(self, request: Request, principal: Principal) -> dict[str, Any]:
        response_id = request.path_params["response_id"]
        record = await self._store.get(response_id.removeprefix(ID_PREFIX), principal.tenant)
        if record is None:
            raise ApiError(404, f"Response with id {response_id!r} not found.", param="response_id")
        return record


class Events:
    """One streamed response's events, numbered in order, with its message item opened at its first text."""

    def __init__(self, request_id: str) -> None:
        self._rid = request_id
        self._seq = itertools.count()
        self._message_open = False

    def send(self, type_: str, **fields: Any) -> str:
        payload = {"type": type_, "sequence_number": next(self._seq), **fields}
        return f"event: {type_}\ndata: {json.dumps(payload)}\n\n"

    def text(self, delta: str) -> Iterator[str]:
        yield from self._open()
        yield self.send("response.output_text.delta", item_id=f"msg_{self._rid}", output_index=0, content_index=0,
                        delta=delta, logprobs=[])

    def _open(self) -> Iterator[str]:
        if self._message_open:
            return
        self._message_open = True
        yield self.send("response.output_item.added", output_index=0,
                        item=message_item(self._rid, "", status="in_progress"))
        yield self.send("response.content_part.added", item_id=f"msg_{self._rid}", output_index=0,
                        content_index=0, part=_text_part(""))

    def finish(self, response: responses_pb2.Response, rest: str) -> Iterator[str]:
        """The rest of the message (if the answer has one), then each tool call whole."""
        index = 0
        if response.answer or not response.tool_calls:
            yield from self._open()
            if rest:
                yield from self.text(rest)
            item_id = f"msg_{self._rid}"
            yield self.send("response.output_text.done", item_id=item_id, output_index=0, content_index=0,
                            text=response.answer, logprobs=[])
            yield self.send("response.content_part.done", item_id=item_id, output_index=0, content_index=0,
                            part=_text_part(response.answer))
            yield self.send("response.output_item.done", output_index=0, item=message_item(self._rid, response.answer))
            index = 1
        for i, call in enumerate(response.tool_calls):
            done = function_call_item(self._rid, i, call.id, call.name, call.arguments)
            yield self.send("response.output_item.added", output_index=index + i,
                            item={**done, "arguments": "", "status": "in_progress"})
            yield self.send("response.function_call_arguments.delta", item_id=done["id"], output_index=index + i,
                            delta=call.arguments)
            yield self.send("response.function_call_arguments.done", item_id=done["id"], output_index=index + i,
                            name=call.name, arguments=call.arguments)
            yield self.send("response.output_item.done", output_index=index + i, item=done)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
