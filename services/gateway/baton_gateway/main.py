"""The gateway: Baton's only HTTP ingress, OpenAI-compatible."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from baton.v1 import feedback_pb2, policy_pb2, requests_pb2, responses_pb2
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
from baton_gateway.auth import Gatekeeper
from baton_gateway.handover import Handover
from baton_gateway.metrics import GatewayMetrics
from baton_gateway.openapi import openapi_document
from baton_gateway.params import answer_options, messages_proto
from baton_gateway.replies import INTERIM, Replies
from baton_gateway.streaming import ClosingStreamingResponse, StreamedAnswer, closing_chunks, content_chunk
from baton_platform import topics
from baton_platform.config import DEFAULT_POLICY_NAME, BatonConfig, ConfigError, load_config
from baton_platform.consumer import Record
from baton_platform.http import live_endpoint, metrics_endpoint, ready_endpoint, serve
from baton_platform.service import Service

SERVICE_NAME = "baton-gateway"
# Workflow errors that mean time ran out: 504, as a gateway answers for a slow upstream; others 502.
TIMEOUT_CODES = {"step_timeout", "deadline_exceeded"}


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> Starlette:
    service = Service.create(SERVICE_NAME, config.kafka, tracer_provider)
    tracer = service.tracer_provider.get_tracer("baton.gateway")
    registry = service.registry
    requests_out = service.publisher(topics.REQUESTS, requests_pb2.ChatRequest, "Chat requests from HTTP clients.")
    feedback_out = service.publisher(topics.FEEDBACK, feedback_pb2.Feedback, "Clients' ratings of answers.")
    replies = Replies()
    gw = config.gateway
    # Each replica enforces its share of every limit: its share of baton.responses' partitions (at
    # most all of it, should the topic hold more partitions than configured).
    gate = Gatekeeper(gw, config.tenants, share=lambda: min(1.0, replies.owned / config.kafka.partitions))
    # The policies a client may ask for by `model`: the default plus every version published on
    # baton.policy (a small compacted topic every replica reads whole).
    models = {DEFAULT_POLICY_NAME}

    metrics = GatewayMetrics(registry, gate.tenants, waiting=lambda: replies.waiting)
    admission = Admission(gw.max_waiting)

    def take(response: responses_pb2.Response) -> None:
        if replies.deliver(response) and response.WhichOneof("outcome") not in INTERIM:
            admission.answered()

    async def on_response(response: responses_pb2.Response, record: Record) -> None:
        if response.WhichOneof("outcome") not in INTERIM:
            settle(response)
        take(response)

    async def on_handed_over(response: responses_pb2.Response) -> None:
        if response.WhichOneof("outcome") not in INTERIM:
            # Only the key's tokens: the partition's owner counts the tenant's spend, as for any reply there.
            total = response.episode.total
            gate.settle(response.request_id, "", total.input_tokens, total.output_tokens, total.cost_usd)
        take(response)

    handover = Handover(config.kafka, replies.is_waiting, on_handed_over, gw.request_timeout_s)
    replies.on_rebalanced = handover.start

    # Each replica reads its share of the partitions, from their end: a reply is only ever for a
    # request this replica is waiting on now.
    service.consumer(topics.RESPONSES, responses_pb2.Response, on_response, group=topics.GROUP_GATEWAY,
                     offset_reset="latest", on_assigned=replies.assigned, on_revoked=replies.revoked,
                     description="Replies to the requests this replica waits on.")

    def settle(response: responses_pb2.Response) -> None:
        """Spend and tokens of every final response (exploration candidates too: the tenant caused them)."""
        tenant, total = response.episode.request.tenant, response.episode.total
        gate.settle(response.request_id, tenant, total.input_tokens, total.output_tokens, total.cost_usd)
        if tenant:
            metrics.tenant_requests.labels(tenant, "answered" if response.WhichOneof("outcome") == "answer" else "failed").inc()
            metrics.tenant_tokens.labels(tenant, "input").inc(total.input_tokens)
            metrics.tenant_tokens.labels(tenant, "output").inc(total.output_tokens)
            metrics.tenant_cost.labels(tenant).inc(total.cost_usd)

    async def on_policy(update: policy_pb2.PolicyUpdate, record: Record) -> None:
        if update.version and (update.name or DEFAULT_POLICY_NAME) == config.router.policy_name:
            # Both spellings route to that version: `v3`, and `baton@v3` as the README names it.
            models.update({update.version, f"{update.name or DEFAULT_POLICY_NAME}@{update.version}"})

    service.consumer(topics.POLICY, policy_pb2.PolicyUpdate, on_policy, description="Policy versions clients may ask for.")

    def authorize(request: Request, scope: str):
        return gate.authenticate(request.headers.get("authorization"), scope)

    def error_response(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > gw.max_body_bytes:
            raise ApiError(413, f"the request body is larger than {gw.max_body_bytes} bytes", code="request_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > gw.max_body_bytes:
                raise ApiError(413, f"the request body is larger than {gw.max_body_bytes} bytes", code="request_too_large")
        return bytes(body)

    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER,
                                          context=propagate.extract(request.headers)) as span:
            principal = None
            try:
                principal = authorize(request, "chat")
                # Before the body is read: shedding must cost next to nothing.
                try:
                    admission.admit(replies.waiting)
                except ApiError:
                    metrics.shed.inc()
                    raise
                req = parse_chat_request(await read_body(request), set(gate.visible_models(principal, models)))
                if wants_eval(req.metadata):
                    gate.require(principal, EVAL_SCOPE)
                if len(req.messages) > gw.max_messages:
                    raise ApiError(400, f"at most {gw.max_messages} messages are accepted", param="messages")
                partition = replies.reply_partition()
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
                msg.stream = bool(req.stream)
                gate.admit(principal)  # last: a request refused for another reason uses none of the key's rate
                waiter = replies.expect(request_id, partition)
                gate.opened(request_id, principal)
                # The deadline runs from here, publish included: a broker that is slow to take the
                # request (restarting, say) must not push the client's answer past it.
                deadline = time.monotonic() + gw.request_timeout_s
                try:
                    await asyncio.wait_for(requests_out.send(msg, key=request_id),
                                           max(0.0, deadline - time.monotonic()))
                except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so, keep nothing
                    replies.abandon(request_id)
                    raise ApiError(503, f"the request could not be queued ({type(e).__name__}); retry shortly",
                                   type="service_unavailable") from None
            except ApiError as e:
                metrics.requests.labels(str(e.status)).inc()
                if principal is not None:
                    metrics.tenant_requests.labels(principal.tenant, e.code if e.status == 429 else "rejected").inc()
                span.set_attribute("http.response.status_code", e.status)
                return error_response(e)
            if req.stream:
                return ClosingStreamingResponse(stream(req, request_id, waiter, deadline),
                                                media_type="text/event-stream", headers={"x-baton-request-id": request_id})
            try:
                response = await final_response(request_id, waiter, deadline)
            except ApiError as e:
                metrics.requests.labels(str(e.status)).inc()
                span.set_attribute("http.response.status_code", e.status)
                return JSONResponse(e.body(), status_code=e.status)
            span.set_attribute("http.response.status_code", 200)
            metrics.requests.labels("200").inc()
            metrics.latency.observe(time.perf_counter() - started)
            headers = {"x-baton-request-id": request_id, "x-baton-workflow": summary_header(response)}
            return JSONResponse(completion_body(request_id, req.model, response), headers=headers)

    async def next_response(request_id: str, waiter: asyncio.Queue, deadline: float) -> responses_pb2.Response:
        try:
            return await asyncio.wait_for(waiter.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            replies.abandon(request_id)
            raise ApiError(504, f"no answer within {gw.request_timeout_s:g} s (request {request_id})",
                           type="server_error", code="timeout") from None

    def check_final(request_id: str, response: responses_pb2.Response) -> responses_pb2.Response:
        if response.WhichOneof("outcome") == "error":
            status = 504 if response.error.code in TIMEOUT_CODES else 502
            raise ApiError(status, f"the workflow failed: {response.error.message} (request {request_id})",
                           type="server_error", code=response.error.code)
        return response

    async def final_response(request_id: str, waiter: asyncio.Queue, deadline: float) -> responses_pb2.Response:
        while True:
            response = await next_response(request_id, waiter, deadline)
            if response.WhichOneof("outcome") not in INTERIM:
                return check_final(request_id, response)

    async def stream(req, request_id: str, waiter: asyncio.Queue, deadline: float):
        """OpenAI chat.completion.chunk events: the answer's text as its step produces it, reconciled
        with the final answer (baton_gateway.streaming); workflow progress travels as SSE comments,
        which standard parsers skip."""
        answer, counted = StreamedAnswer(), False
        try:
            yield sse(opening_chunk(request_id, req.model))
            try:
                while True:
                    response = await next_response(request_id, waiter, deadline)
                    kind = response.WhichOneof("outcome")
                    if kind == "delta":
                        if text := answer.accept(response.delta):
                            yield sse(content_chunk(request_id, req.model, text))
                        continue
                    if kind != "progress":
                        break
                    p = response.progress
                    yield f": baton step {p.step + 1}/{p.steps} {p.worker} {p.state}\n\n"
                check_final(request_id, response)
                rest = answer.finish(response.answer)
                if rest is None:
                    raise ApiError(502, "the answer changed after part of it was streamed (a retried or fallback "
                                        f"provider call); repeat the request to get it whole (request {request_id})",
                                   type="server_error", code="stream_diverged")
            except ApiError as e:
                metrics.requests.labels(str(e.status)).inc()
                counted = True
                yield sse(e.body())
                yield "data: [DONE]\n\n"
                return
            metrics.requests.labels("200").inc()
            counted = True
            if rest:
                yield sse(content_chunk(request_id, req.model, rest))
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            for chunk in closing_chunks(request_id, req.model, response, include_usage):
                yield sse(chunk)
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            if not counted:
                metrics.requests.labels("499").inc()  # the client went away; the workflow runs on and is logged
            raise
        finally:
            replies.abandon(request_id)  # later responses for a client that left are dropped, not queued

    async def feedback(request: Request) -> Response:
        try:
            authorize(request, "feedback")
            fb = parse_feedback(await read_body(request))
            try:
                await feedback_out.send(fb, key=fb.response_id)
            except Exception as e:  # noqa: BLE001 - the broker is unreachable: say so
                raise ApiError(503, f"the feedback could not be queued ({type(e).__name__}); retry shortly",
                               type="service_unavailable") from None
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"object": "feedback", "response_id": fb.response_id, "accepted": True}, status_code=202)

    async def list_models(request: Request) -> Response:
        try:
            principal = authorize(request, "chat")
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "baton"} for m in gate.visible_models(principal, models)]})

    schemas: dict[frozenset[str], dict] = {}

    async def openapi(request: Request) -> Response:
        # Regenerated only when a policy version is published.
        key = frozenset(models)
        if key not in schemas:
            schemas.clear()
            schemas[key] = openapi_document(key)
        return JSONResponse(schemas[key])

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # registered for HTTPException only
        # OpenAI's shape for an unknown path or method too, so every error a client sees parses alike.
        message = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else exc.detail
        return JSONResponse(ApiError(exc.status_code, message).body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        return JSONResponse(ApiError(500, "The server had an error while processing your request.",
                                     type="server_error").body(), status_code=500)

    async def replies_ready() -> str | None:
        return None if replies.ready else "no partition of baton.responses assigned yet"

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.broker.start()
        await service.start_consumers()
        try:
            yield
        finally:
            await handover.stop()
            await service.stop_consumers()
            await service.broker.stop()
            await service.flush_traces()

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/feedback", feedback, methods=["POST"]),
        Route("/health/live", live_endpoint(), methods=["GET"]),
        Route("/health/ready", ready_endpoint([service.ready, replies_ready]), methods=["GET"]),
        Route("/metrics", metrics_endpoint(registry), methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ], lifespan=lifespan, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.service = service  # its broker, for tests and the AsyncAPI document
    return app


def run() -> None:
    config = load_config()
    try:
        app = create_app(config)
    except ConfigError as e:  # no usable key, a bad key entry: say which, and do not start
        raise SystemExit(f"baton-gateway: {e}") from None
    serve(app, config.gateway.host, config.gateway.port, drain_s=config.gateway.shutdown_drain_s,
          keep_alive_s=config.gateway.keep_alive_s)


if __name__ == "__main__":
    run()
