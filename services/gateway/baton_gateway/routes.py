"""The gateway's HTTP API: OpenAI's chat completions (a JSON answer or a stream of chunks) and model
list, Baton's feedback, the OpenAPI document, and every error in OpenAI's shape."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, Tracer
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton.v1 import requests_pb2, responses_pb2
from baton_gateway.admission import Admission
from baton_gateway.api import (
    EVAL_SCOPE,
    ApiError,
    budget_from,
    completion_body,
    opening_chunk,
    parse_chat_request,
    parse_feedback,
    sse,
    summary_header,
    wants_eval,
)
from baton_gateway.auth import Gatekeeper, Principal
from baton_gateway.handover import Handover
from baton_gateway.idempotency import Claim, IdempotencyKey, IdempotencyKeys, key_of
from baton_gateway.metrics import GatewayMetrics
from baton_gateway.openapi import openapi_document
from baton_gateway.params import ChatCompletionRequest, answer_options, messages_proto
from baton_gateway.replies import INTERIM, Replies
from baton_gateway.streaming import ClosingStreamingResponse, StreamedAnswer, closing_chunks, content_chunk
from baton_platform.config import GatewayConfig
from baton_platform.consumer import Publisher
from baton_platform.kafka import MAX_RECORD_BYTES, RECORD_OVERHEAD_BYTES
from baton_workflow.errors import TIMEOUTS

# The conversation travels on with every record of its workflow (the plan, then each step's task with
# its instruction and the outputs it reads): a request keeps three quarters of a record free for them.
MAX_REQUEST_RECORD_BYTES = (MAX_RECORD_BYTES - RECORD_OVERHEAD_BYTES) // 4

# A request joined to another by its Idempotency-Key waits for that one's answer until its deadline
# and this much more (the final reply of a request that ran out of time comes just after it); one past
# its deadline is looked up on its reply partition for this long.
ANSWER_GRACE_S = 5.0
REPLAY_S = 5.0
# A live replica queues a request within this long of claiming its key: a claim this old whose request
# is not on baton.requests was left by a replica that died in between.
QUEUED_WITHIN_S = 2.0

log = logging.getLogger(__name__)


class Api:
    def __init__(self, settings: GatewayConfig, tracer: Tracer, gate: Gatekeeper, replies: Replies,
                 admission: Admission, metrics: GatewayMetrics, models: set[str], *,
                 requests_out: Publisher, feedback_out: Publisher, keys: IdempotencyKeys, handover: Handover) -> None:
        self._gw, self._tracer, self._gate, self._replies = settings, tracer, gate, replies
        self._admission, self._metrics, self._models = admission, metrics, models
        self._requests_out, self._feedback_out = requests_out, feedback_out
        self._keys, self._handover = keys, handover
        self._schemas: dict[frozenset[str], dict] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/feedback", self.feedback, methods=["POST"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        started = time.perf_counter()
        with self._tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER,
                                                context=propagate.extract(request.headers)) as span:
            principal = None
            try:
                principal = self.authorize(request, "chat")
                self.admit()
                body = await self.read_body(request)
                req = parse_chat_request(body, self.visible_models(principal))
                self.check_eval(principal, req)
                request_id, waiter, deadline = await self.ask(req, principal, span, key_of(request, body, principal.tenant))
            except ApiError as e:
                return self.refused(e, principal, span)
            if req.stream:
                log.info("request %s from %s: streaming", request_id, principal.tenant)
                return ClosingStreamingResponse(self._stream(req, request_id, waiter, deadline),
                                                media_type="text/event-stream", headers={"x-baton-request-id": request_id})
            try:
                response = await self.final_response(request_id, waiter, deadline)
            except ApiError as e:
                return self.failed(e, request_id, principal, span)
            headers = self.answered(request_id, principal, response, span, started)
            return JSONResponse(completion_body(request_id, req.model, response), headers=headers)

    async def complete(self, raw: bytes, principal: Principal, span: Span,
                       key: IdempotencyKey | None) -> tuple[str, dict[str, Any]]:
        """A chat completion whose body is `raw`, not streamed, as a batch line runs it: its request id
        and answer body; an ApiError as the endpoint would answer it."""
        req = parse_chat_request(raw, self.visible_models(principal))
        if req.stream:
            raise ApiError(400, "stream is not supported in a batch", param="stream")
        self.check_eval(principal, req)
        request_id, waiter, deadline = await self.ask(req, principal, span, key)
        response = await self.final_response(request_id, waiter, deadline)
        return request_id, completion_body(request_id, req.model, response)

    def refused(self, e: ApiError, principal: Principal | None, span: Span) -> JSONResponse:
        """Count and answer a request refused before its workflow started."""
        self._metrics.requests.labels(str(e.status)).inc()
        if principal is not None:
            self._metrics.tenant_requests.labels(principal.tenant, e.code if e.status == 429 else "rejected").inc()
        span.set_attribute("http.response.status_code", e.status)
        log.info("request refused: %d %s", e.status, e.code)
        return error_response(e)

    def failed(self, e: ApiError, request_id: str, principal: Principal, span: Span) -> JSONResponse:
        """Count and answer a request whose workflow failed or ran out of time."""
        self._metrics.requests.labels(str(e.status)).inc()
        span.set_attribute("http.response.status_code", e.status)
        log.info("request %s from %s: %d %s", request_id, principal.tenant, e.status, e.code)
        return JSONResponse(e.body(), status_code=e.status)

    def answered(self, request_id: str, principal: Principal, response: responses_pb2.Response, span: Span,
                 started: float) -> dict[str, str]:
        """Count and log a request answered whole; returns the headers its answer carries."""
        span.set_attribute("http.response.status_code", 200)
        self._metrics.requests.labels("200").inc()
        elapsed = time.perf_counter() - started
        self._metrics.latency.observe(elapsed)
        summary = summary_header(response)
        log.info("request %s from %s: 200 in %.0f ms (%s)", request_id, principal.tenant, elapsed * 1000, summary)
        return {"x-baton-request-id": request_id, "x-baton-workflow": summary}

    def visible_models(self, principal: Principal) -> set[str]:
        return set(self._gate.visible_models(principal, self._models))

    def check_eval(self, principal: Principal, req: ChatCompletionRequest) -> None:
        """Metadata that steers grading or routing needs a key with the `eval` scope."""
        if wants_eval(req.metadata):
            self._gate.require(principal, EVAL_SCOPE)

    def count(self, status: str) -> None:
        self._metrics.requests.labels(status).inc()

    def abandon(self, request_id: str, waiter: asyncio.Queue[responses_pb2.Response]) -> None:
        """Drop the replies still to come for a client that is gone or answered."""
        self._replies.abandon(request_id, waiter)

    def admit(self) -> None:
        """Shed a request when too many wait: before its body is read, so that shedding costs next to nothing."""
        try:
            self._admission.admit(self._replies.waiting)
        except ApiError:
            self._metrics.shed.inc()
            raise

    async def ask(self, req: ChatCompletionRequest, principal: Principal, span: Span,
                  key: IdempotencyKey | None = None) -> tuple[str, asyncio.Queue[responses_pb2.Response], float]:
        """Publish `req` on baton.requests; returns its id, the queue its replies arrive on, and its deadline
        (on the monotonic clock). With an idempotency `key` another request already holds, nothing is
        published: the id, replies and deadline are that request's."""
        gw = self._gw
        if len(req.messages) > gw.max_messages:
            raise ApiError(400, f"at most {gw.max_messages} messages are accepted", param="messages")
        partition = self._replies.reply_partition()
        if partition is None:
            raise ApiError(503, "the gateway is not ready yet; retry shortly", type="service_unavailable")
        request_id = uuid.uuid4().hex
        span.set_attribute("baton.request_id", request_id)
        now_ms = int(time.time() * 1000)
        msg = requests_pb2.ChatRequest(
            request_id=request_id, policy=req.model,
            messages=messages_proto(req), answer=answer_options(req),
            max_tokens=req.max_completion_tokens or req.max_tokens or 0,
            metadata=req.metadata or {}, created_unix_ms=now_ms,
            deadline_unix_ms=now_ms + int(gw.request_timeout_s * 1000), reply_partition=partition,
            tenant=principal.tenant)
        if req.temperature is not None:
            msg.temperature = req.temperature
        msg.budget.CopyFrom(budget_from(req.metadata or {}))
        cap = self._gate.cost_cap(principal, msg.budget.max_cost_usd)
        if cap:
            msg.budget.max_cost_usd = cap
        msg.stream = bool(req.stream)
        if msg.ByteSize() > MAX_REQUEST_RECORD_BYTES:
            raise ApiError(413, f"the request is {msg.ByteSize()} bytes once encoded; at most "
                                f"{MAX_REQUEST_RECORD_BYTES} fit, since each step of its workflow carries the "
                                f"conversation again", code="request_too_large", param="messages")
        self._gate.admit(principal, cap)  # last: a request refused for another reason uses none of the key's rate
        # The deadline runs from here, publish included: a broker that is slow to take the
        # request (restarting, say) must not push the client's answer past it.
        deadline = time.monotonic() + gw.request_timeout_s
        if key is not None:
            try:
                held = await self._keys.claim(key, Claim(request_id, key.fingerprint, partition, now_ms,
                                                         msg.deadline_unix_ms))
            except BaseException:
                self._gate.release(principal.tenant, cap)
                raise
            if held.request_id != request_id:
                self._gate.release(principal.tenant, cap)  # no workflow of its own
                if held.fingerprint != key.fingerprint:
                    raise ApiError(409, "this Idempotency-Key was used by another request with a different body; "
                                        "send a new key for a new request", code="idempotency_key_reused")
                span.set_attribute("baton.request_id", held.request_id)
                log.info("request %s repeats %s (Idempotency-Key): joined", request_id, held.request_id)
                return await self._join(held, msg)
        waiter = self._replies.expect(request_id, partition)
        self._gate.opened(request_id, principal, cap)
        try:
            await asyncio.wait_for(self._requests_out.send(msg, key=request_id),
                                   max(0.0, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so, keep nothing
            self._replies.abandon(request_id, waiter)
            self._gate.settle(request_id, 0, 0)
            if key is not None:
                await self._keys.release(key, request_id)
            raise ApiError(503, f"the request could not be queued ({type(e).__name__}); retry shortly",
                           type="service_unavailable") from None
        return request_id, waiter, deadline

    async def _join(self, held: Claim, msg: requests_pb2.ChatRequest) -> tuple[str, asyncio.Queue[responses_pb2.Response], float]:
        """The replies of the request that holds a key, read from its reply partition (its replica may
        be gone). A request that was never queued (its replica died between claiming the key and
        queueing it) is queued now, under its own id, with `msg`'s conversation: the same body."""
        now_ms = int(time.time() * 1000)
        if held.expired(now_ms):
            replayed = await self._replay(held)
            if replayed is not None:
                return held.request_id, replayed, time.monotonic() + ANSWER_GRACE_S
        else:
            await asyncio.sleep(max(0.0, held.asked_ms / 1000 + QUEUED_WITHIN_S - time.time()))
            if await self._keys.queued(held):
                waiter = self._replies.expect(held.request_id, held.partition)
                self._handover.start({held.request_id: (held.partition, held.asked_ms)})
                left_s = held.deadline_ms / 1000 - time.time()
                return held.request_id, waiter, time.monotonic() + left_s + ANSWER_GRACE_S
        log.info("request %s held an Idempotency-Key but was never queued or answered: queued now", held.request_id)
        now_ms = int(time.time() * 1000)
        msg.request_id, msg.reply_partition, msg.created_unix_ms = held.request_id, held.partition, now_ms
        msg.deadline_unix_ms = now_ms + int(self._gw.request_timeout_s * 1000)
        waiter = self._replies.expect(held.request_id, held.partition)
        self._handover.start({held.request_id: (held.partition, now_ms)})  # the partition may be another replica's
        deadline = time.monotonic() + self._gw.request_timeout_s
        try:
            await asyncio.wait_for(self._requests_out.send(msg, key=held.request_id),
                                   max(0.0, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so
            self._replies.abandon(held.request_id, waiter)
            raise ApiError(503, f"the request could not be queued ({type(e).__name__}); retry shortly",
                           type="service_unavailable") from None
        return held.request_id, waiter, deadline

    async def _replay(self, held: Claim) -> asyncio.Queue[responses_pb2.Response] | None:
        """The replies of a request past its deadline, read from its reply partition, if its final one is
        there; None if not."""
        waiter = self._replies.expect(held.request_id, held.partition)
        self._handover.start({held.request_id: (held.partition, held.asked_ms)})
        replies: asyncio.Queue[responses_pb2.Response] = asyncio.Queue()
        deadline = time.monotonic() + REPLAY_S
        while True:
            try:
                response = await asyncio.wait_for(waiter.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._replies.abandon(held.request_id, waiter)
                return None
            replies.put_nowait(response)
            if response.WhichOneof("outcome") not in INTERIM:
                return replies

    async def next_response(self, request_id: str, waiter: asyncio.Queue[responses_pb2.Response],
                             deadline: float) -> responses_pb2.Response:
        try:
            return await asyncio.wait_for(waiter.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self._replies.abandon(request_id, waiter)
            raise ApiError(504, f"no answer within {self._gw.request_timeout_s:g} s (request {request_id})",
                           type="server_error", code="timeout") from None

    async def final_response(self, request_id: str, waiter: asyncio.Queue[responses_pb2.Response],
                              deadline: float) -> responses_pb2.Response:
        while True:
            response = await self.next_response(request_id, waiter, deadline)
            if response.WhichOneof("outcome") not in INTERIM:
                return check_final(request_id, response)

    async def streamed(self, request_id: str, waiter: asyncio.Queue[responses_pb2.Response],
                       deadline: float) -> AsyncIterator[tuple[str, Any]]:
        """A streaming request's replies, reconciled with its final answer (baton_gateway.streaming), as
        ("text", new answer text), ("progress", an SSE comment) and last ("final", (response, the rest
        of its answer)); an ApiError when the workflow failed or the answer changed after part of it went out."""
        answer = StreamedAnswer()
        while True:
            response = await self.next_response(request_id, waiter, deadline)
            kind = response.WhichOneof("outcome")
            if kind == "delta":
                if text := answer.accept(response.delta):
                    yield "text", text
                continue
            if kind != "progress":
                break
            p = response.progress
            yield "progress", f": baton step {p.step + 1}/{p.steps} {p.worker} {p.state}\n\n"
        check_final(request_id, response)
        rest = answer.finish(response.answer)
        if rest is None:
            raise ApiError(502, "the answer changed after part of it was streamed (a retried or fallback provider "
                                f"call); repeat the request to get it whole (request {request_id})",
                           type="server_error", code="stream_diverged")
        yield "final", (response, rest)

    async def _stream(self, req: ChatCompletionRequest, request_id: str, waiter: asyncio.Queue[responses_pb2.Response],
                      deadline: float) -> AsyncIterator[str]:
        """OpenAI chat.completion.chunk events: the answer's text as its step produces it, reconciled
        with the final answer (baton_gateway.streaming); workflow progress travels as SSE comments,
        which standard parsers skip."""
        counted = False
        try:
            yield sse(opening_chunk(request_id, req.model))
            try:
                async for kind, value in self.streamed(request_id, waiter, deadline):
                    if kind == "text":
                        yield sse(content_chunk(request_id, req.model, value))
                    elif kind == "progress":
                        yield value
                    else:
                        response, rest = value
            except ApiError as e:
                self._metrics.requests.labels(str(e.status)).inc()
                counted = True
                yield sse(e.body())
                yield "data: [DONE]\n\n"
                return
            self._metrics.requests.labels("200").inc()
            counted = True
            if rest:
                yield sse(content_chunk(request_id, req.model, rest))
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            for chunk in closing_chunks(request_id, req.model, response, include_usage):
                yield sse(chunk)
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            if not counted:
                self._metrics.requests.labels("499").inc()  # the client went away; the workflow runs on and is logged
            raise
        finally:
            self._replies.abandon(request_id, waiter)  # later responses for a client that left are dropped, not queued

    async def feedback(self, request: Request) -> Response:
        try:
            principal = self.authorize(request, "feedback")
            self._gate.admit_feedback(principal)
            fb = parse_feedback(await self.read_body(request), principal.tenant)
            try:
                await self._feedback_out.send(fb, key=fb.response_id)
            except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so
                raise ApiError(503, f"the feedback could not be queued ({type(e).__name__}); retry shortly",
                               type="service_unavailable") from None
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"object": "feedback", "response_id": fb.response_id, "accepted": True}, status_code=202)

    async def list_models(self, request: Request) -> Response:
        try:
            principal = self.authorize(request, "chat")
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "baton"}
            for m in self._gate.visible_models(principal, self._models)]})

    async def openapi(self, request: Request) -> Response:
        # Regenerated only when a policy version is published.
        key = frozenset(self._models)
        if key not in self._schemas:
            self._schemas.clear()
            self._schemas[key] = openapi_document(key)
        return JSONResponse(self._schemas[key])

    def authorize(self, request: Request, scope: str) -> Principal:
        return self._gate.authenticate(request.headers.get("authorization"), scope)

    async def read_body(self, request: Request) -> bytes:
        limit = self._gw.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
        return bytes(body)


def check_final(request_id: str, response: responses_pb2.Response) -> responses_pb2.Response:
    """`response`, a request's final one, unless it is a workflow error: then the ApiError it answers."""
    if response.WhichOneof("outcome") == "error":
        # Time ran out: 504, as a gateway answers for a slow upstream; other workflow errors 502.
        status = 504 if response.error.code in TIMEOUTS else 502
        raise ApiError(status, f"the workflow failed: {response.error.message} (request {request_id})",
                       type="server_error", code=response.error.code)
    return response


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # registered for HTTPException only
    # OpenAI's shape for an unknown path or method too, so every error a client sees parses alike.
    message = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else exc.detail
    return JSONResponse(ApiError(exc.status_code, message).body(), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(ApiError(500, "The server had an error while processing your request.",
                                 type="server_error").body(), status_code=500)


EXCEPTION_HANDLERS = {HTTPException: http_error, Exception: server_error}
