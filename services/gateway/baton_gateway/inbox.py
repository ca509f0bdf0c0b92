"""What the gateway reads from Kafka: replies, handed to the requests waiting on them (a final reply
also settles its tenant's spend and frees a place in admission), and the policy versions a client may
ask for by `model`."""

from __future__ import annotations

from baton.v1 import policy_pb2, responses_pb2
from baton_gateway.admission import Admission
from baton_gateway.auth import Gatekeeper
from baton_gateway.metrics import GatewayMetrics
from baton_gateway.replies import INTERIM, Replies
from baton_platform.config import DEFAULT_POLICY_NAME
from baton_platform.consumer import Record


class Inbox:
    def __init__(self, replies: Replies, gate: Gatekeeper, admission: Admission, metrics: GatewayMetrics,
                 policy_name: str) -> None:
        self._replies, self._gate, self._admission, self._metrics = replies, gate, admission, metrics
        self._policy_name = policy_name
        # The policies a client may ask for by `model`: the default plus every version published on
        # baton.policy (a small compacted topic every replica reads whole).
        self.models = {DEFAULT_POLICY_NAME}

    async def on_response(self, response: responses_pb2.Response, record: Record) -> None:
        """A reply on this replica's partitions of baton.responses."""
        if response.WhichOneof("outcome") not in INTERIM:
            self._settle(response, record)
        self._take(response)

    async def on_handed_over(self, response: responses_pb2.Response) -> None:
        """A reply read again after a rebalance (baton_gateway.handover)."""
        if response.WhichOneof("outcome") not in INTERIM:
            # Only the key's reservation and tokens: the partition's owner counts the tenant's spend.
            total = response.episode.total
            self._gate.settle(response.request_id, total.input_tokens, total.output_tokens)
        self._take(response)

    async def on_policy(self, update: policy_pb2.PolicyUpdate, record: Record) -> None:
        if update.version and (update.name or DEFAULT_POLICY_NAME) == self._policy_name:
            # Both spellings route to that version: `v3`, and `baton@v3` as the README names it.
            self.models.update({update.version, f"{update.name or DEFAULT_POLICY_NAME}@{update.version}"})

    def _take(self, response: responses_pb2.Response) -> None:
        if self._replies.deliver(response) and response.WhichOneof("outcome") not in INTERIM:
            self._admission.answered()

    def _settle(self, response: responses_pb2.Response, record: Record) -> None:
        """Spend and tokens of every final response (exploration candidates too: the tenant caused them)."""
        tenant, total = response.episode.request.tenant, response.episode.total
        self._gate.ledger.count(tenant, record.tp.partition, record.offset, total.cost_usd)
        self._gate.settle(response.request_id, total.input_tokens, total.output_tokens)
        if tenant:
            m = self._metrics
            m.tenant_requests.labels(tenant, "answered" if response.WhichOneof("outcome") == "answer" else "failed").inc()
            m.tenant_tokens.labels(tenant, "input").inc(total.input_tokens)
            m.tenant_tokens.labels(tenant, "output").inc(total.output_tokens)
            m.tenant_cost.labels(tenant).inc(total.cost_usd)
