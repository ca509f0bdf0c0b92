"""The gateway: Baton's only HTTP ingress, OpenAI-compatible."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette

from baton.v1 import feedback_pb2, policy_pb2, requests_pb2, responses_pb2
from baton_gateway.admission import Admission
from baton_gateway.auth import Gatekeeper
from baton_gateway.batches_routes import batch_api
from baton_gateway.files import FileStore
from baton_gateway.files_routes import FilesApi
from baton_gateway.handover import Handover
from baton_gateway.idempotency import IdempotencyKeys
from baton_gateway.inbox import Inbox
from baton_gateway.metrics import GatewayMetrics
from baton_gateway.replies import Replies
from baton_gateway.responses_routes import ResponsesApi
from baton_gateway.routes import EXCEPTION_HANDLERS, Api
from baton_gateway.spend import SpendLedger
from baton_gateway.stored import StoredResponses
from baton_platform import topics
from baton_platform.config import BatonConfig, ConfigError, load_config
from baton_platform.http import serve
from baton_platform.service import Service

SERVICE_NAME = "baton-gateway"


def create_app(config: BatonConfig, tracer_provider: TracerProvider | None = None) -> Starlette:
    service = Service.create(SERVICE_NAME, config.kafka, tracer_provider)
    requests_out = service.publisher(topics.REQUESTS, requests_pb2.ChatRequest, "Chat requests from HTTP clients.")
    feedback_out = service.publisher(topics.FEEDBACK, feedback_pb2.Feedback, "Clients' ratings of answers.")
    replies = Replies()
    gw = config.gateway
    # Each replica enforces its share of every limit: its share of baton.responses' partitions (at
    # most all of it, should the topic hold more partitions than configured).
    ledger = SpendLedger({t.name for t in config.tenants}, config.kafka, service.publisher(
        topics.SPEND, None, "Each tenant's spend per partition of baton.responses, keyed tenant/partition."))
    gate = Gatekeeper(gw, config.tenants, share=lambda: min(1.0, replies.owned / config.kafka.partitions),
                      ledger=ledger, max_cost_usd=config.synthesizer.max_cost_usd)
    metrics = GatewayMetrics(service.registry, gate.tenants, waiting=lambda: replies.waiting,
                             budgets=gate.budgeted(), budget_used=gate.budget_used)
    admission = Admission(gw.max_waiting)
    inbox = Inbox(replies, gate, admission, metrics, config.router.policy_name)
    handover = Handover(config.kafka, replies.is_waiting, inbox.on_handed_over, gw.request_timeout_s)
    replies.on_rebalanced = handover.start

    # Each replica reads its share of the partitions, from their end: a reply is only ever for a
    # request this replica is waiting on now.
    service.consumer(topics.RESPONSES, responses_pb2.Response, inbox.on_response, group=topics.GROUP_GATEWAY,
                     offset_reset="latest", on_assigned=replies.assigned, on_revoked=replies.revoked,
                     description="Replies to the requests this replica waits on.")
    service.consumer(topics.POLICY, policy_pb2.PolicyUpdate, inbox.on_policy,
                     description="Policy versions clients may ask for.")

    async def replies_ready() -> str | None:
        return None if replies.ready else "no partition of baton.responses assigned yet"

    async def spend_ready() -> str | None:
        # Only a budget needs the spend of before this replica started.
        if not gate.budgeted() or await ledger.caught_up():
            return None
        return "baton.spend not read up to its end yet"

    tracer = service.tracer_provider.get_tracer("baton.gateway")
    keys = IdempotencyKeys(config.kafka, service.publisher(
        topics.IDEMPOTENCY, None, "Claims of Idempotency-Keys, keyed by a digest of tenant and key."),
        gw.idempotency_hours * 3600)
    api = Api(gw, tracer, gate, replies, admission, metrics, inbox.models, requests_out=requests_out,
              feedback_out=feedback_out, keys=keys, handover=handover)
    store = StoredResponses(config.kafka, service.publisher(
        topics.STORED_RESPONSES, None, "Responses created with store: true, keyed by id (a delete: a newer record)."),
        gw.stored_responses_days * 86400)
    responses = ResponsesApi(api, store, tracer)
    file_store = FileStore(config.files_dir, gw.max_file_bytes)
    files = FilesApi(api, file_store, tracer)
    batches, runner = batch_api(config, service, api, responses, replies, file_store, tracer)
    tables = (keys.table, store.table, batches.table)
    app = Starlette(routes=[*api.routes(), *responses.routes(), *files.routes(), *batches.routes(),
                            *service.http_routes(ready_checks=[replies_ready, spend_ready], metrics=False)],
                    lifespan=service.lifespan(after_startup=[*(t.start for t in tables), ledger.start, runner.start],
                                              on_shutdown=[runner.stop, handover.stop, ledger.stop,
                                                           *(t.stop for t in tables)]),
                    exception_handlers=EXCEPTION_HANDLERS)
    app.state.service = service  # its broker, for tests and the AsyncAPI document
    # /metrics (every tenant's spend) is served on gateway.metrics_port only, never where the API is.
    app.state.metrics_app = service.metrics_app()
    return app


def run() -> None:
    config = load_config()
    try:
        app = create_app(config)
    except ConfigError as e:  # no usable key, a bad key entry: say which, and do not start
        raise SystemExit(f"baton-gateway: {e}") from None
    serve(app, config.gateway.host, config.gateway.port, service=SERVICE_NAME, secrets=config.secrets(),
          drain_s=config.gateway.shutdown_drain_s,
          keep_alive_s=config.gateway.keep_alive_s, metrics=(config.gateway.metrics_port, app.state.metrics_app))


if __name__ == "__main__":
    run()
