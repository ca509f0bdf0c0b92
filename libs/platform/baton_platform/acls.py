"""Least privilege on the bus: the ACL table of the suite, and applying it to a cluster.

Each service connects to Kafka as its own principal (`User:baton-gateway`, `User:baton-executor-openai`,
...): a SCRAM user or the common name of a client certificate. `table` says what each may do: which
topics it reads and writes and which consumer groups it joins. Everything else is refused by a broker
whose authorizer allows nothing without an ACL (Kafka's StandardAuthorizer, as Strimzi's `simple`
authorization configures it). So the internet-facing gateway cannot write baton.policy, a provider's
tasks or its limit reports, and an executor cannot spend another provider's money.

The table is this module's alone: `baton-topics --acls` applies it, the chart renders it as Strimzi
KafkaUsers from the copy `python -m baton_platform.acls --chart` writes (a test keeps that copy
current), and the local harness and the tests apply it to a secured broker.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass, field

from baton_platform import topics as t

# The prefix of every identity: `<PREFIX>-<service>`.
PREFIX = "baton"
# Kafka's codes (org.apache.kafka.common.acl / resource).
_RESOURCE = {"topic": 2, "group": 3, "cluster": 4}
_PATTERN = {"literal": 3, "prefixed": 4}
_OPERATION = {"read": 3, "write": 4, "describe": 8, "idempotent-write": 12}
_ALLOW = 3


@dataclass(frozen=True)
class Access:
    """What one service may do on the bus: topics read and written, consumer groups joined (`groups`
    by exact name, `group_prefixes` by prefix, for groups named per replica)."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    group_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True, order=True)
class Grant:
    """One ACL binding: `principal` may do `operation` on the `resource` named `name` (or prefixed by it)."""

    principal: str
    resource: str
    name: str
    operation: str
    pattern: str = field(default="literal")

    def as_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "resource": self.resource, "name": self.name,
                "pattern": self.pattern, "operation": self.operation}


def identity(service: str) -> str:
    """The Kafka user a service connects as: `baton-gateway`, `baton-executor-openai`, ... (`_` becomes
    `-`: a Strimzi KafkaUser's name is its principal, and a Kubernetes name holds no `_`)."""
    return f"{PREFIX}-{service}".replace("_", "-")


def table(providers: list[str]) -> dict[str, Access]:
    """Every identity of the suite and its access, for a deployment whose workers use `providers`."""
    tasks = tuple(t.tasks_topic(p) for p in sorted(set(providers)))
    access = {
        # The internet-facing edge: requests and ratings in, answers out, and its own tables.
        "gateway": Access(
            read=(t.RESPONSES, t.POLICY, t.REQUESTS, t.IDEMPOTENCY, t.STORED_RESPONSES, t.SPEND, t.BATCHES),
            write=(t.REQUESTS, t.FEEDBACK, t.IDEMPOTENCY, t.STORED_RESPONSES, t.SPEND, t.BATCHES, t.DLQ),
            groups=(t.GROUP_GATEWAY,)),
        "router": Access(read=(t.REQUESTS, t.POLICY, t.REWARDS), write=(t.WORKFLOW, t.DLQ, *tasks),
                         groups=(t.GROUP_ROUTER,)),
        "synthesizer": Access(read=(t.WORKFLOW, t.RESPONSES),
                              write=(t.WORKFLOW, t.RESPONSES, t.REQUESTS, t.FEEDBACK, t.DLQ, *tasks),
                              groups=(t.GROUP_SYNTHESIZER,)),
        "reward-logger": Access(read=(t.RESPONSES, t.FEEDBACK), write=(t.REWARDS, t.DLQ),
                                groups=(t.GROUP_REWARD_LOGGER,)),
        "console": Access(read=(t.RESPONSES,), group_prefixes=(t.GROUP_CONSOLE,)),
        # The trainer's job publishes policy versions (and reads them, to roll back).
        "trainer": Access(read=(t.POLICY,), write=(t.POLICY,)),
    }
    for p in sorted(set(providers)):
        # Only its own provider's tasks and limit reports; results and direct answers out.
        access[f"executor-{p}"] = Access(
            read=(t.tasks_topic(p), t.limits_topic(p), t.WORKFLOW, t.RESPONSES),
            write=(t.limits_topic(p), t.WORKFLOW, t.RESPONSES, t.DLQ),
            groups=(t.executor_group(p),))
    return {identity(service): a for service, a in access.items()}


def grants(providers: list[str]) -> list[Grant]:
    """The ACL bindings of `table`, sorted: Read and Write on topics (each implies Describe), Read on
    groups, and IdempotentWrite on the cluster for a writer (every producer of the suite is idempotent,
    and aiokafka asks for a producer id with the cluster-wide right)."""
    out: set[Grant] = set()
    for principal, access in table(providers).items():
        user = f"User:{principal}"
        out |= {Grant(user, "topic", name, "read") for name in access.read}
        out |= {Grant(user, "topic", name, "write") for name in access.write}
        if access.write:
            out.add(Grant(user, "cluster", "kafka-cluster", "idempotent-write"))
        out |= {Grant(user, "group", name, "read") for name in access.groups}
        out |= {Grant(user, "group", name, "read", "prefixed") for name in access.group_prefixes}
    return sorted(out)


async def apply(options: dict, bindings: list[Grant], *, timeout: float = 30) -> None:
    """Create `bindings` on the cluster (creating one that exists is a no-op). `options` are aiokafka
    client options of a principal allowed to alter the cluster's ACLs (a super user)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import for_code

    admin = AIOKafkaAdminClient(**options, request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        creations: list[tuple] = [(_RESOURCE[b.resource], b.name, _PATTERN[b.pattern], b.principal, "*",
                      _OPERATION[b.operation], _ALLOW, {}) for b in bindings]
        response = await admin._client.send(admin._client.get_random_node(), _create_acls_request()(creations))
    finally:
        await admin.close()
    failures = [f"{b.principal} {b.operation} {b.resource} {b.name}: {for_code(code).__name__} ({message})"
                for b, (code, message, _tags) in zip(bindings, response.results, strict=True) if code]
    if failures:
        raise RuntimeError("could not create ACLs: " + "; ".join(failures))


@functools.cache
def _create_acls_request():
    """CreateAcls v2 (the flexible encoding; Kafka 4 serves v2 and v3 only), which aiokafka lacks."""
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import CompactArray, CompactString, Int8, Int16, Int32, Schema, TaggedFields

    class CreateAclsResponse_v2(Response):
        API_KEY = 30
        API_VERSION = 2
        SCHEMA = Schema(("throttle_time_ms", Int32),
                        ("results", CompactArray(("error_code", Int16), ("error_message", CompactString("utf-8")),
                                                 ("tags", TaggedFields))),
                        ("tags", TaggedFields))

    class CreateAclsRequest_v2(RequestStruct):
        FLEXIBLE_VERSION = True
        API_KEY = 30
        API_VERSION = 2
        RESPONSE_TYPE = CreateAclsResponse_v2
        SCHEMA = Schema(("creations", CompactArray(
            ("resource_type", Int8), ("resource_name", CompactString("utf-8")), ("resource_pattern_type", Int8),
            ("principal", CompactString("utf-8")), ("host", CompactString("utf-8")), ("operation", Int8),
            ("permission_type", Int8), ("tags", TaggedFields))), ("tags", TaggedFields))

    class CreateAcls(Request[CreateAclsRequest_v2]):
        API_KEY = 30

        def __init__(self, creations: list[tuple]) -> None:
            self._creations = creations

        def build(self, request_struct_class):
            return request_struct_class(self._creations, {})

    return CreateAcls


# What the chart reads (charts/baton/files/kafka-acls.json): the table for one provider named PLACEHOLDER,
# which its templates replace with each provider of config.workers.
PLACEHOLDER = "{provider}"
CHART_TABLE = "charts/baton/files/kafka-acls.json"


def chart_table() -> str:
    """The ACL table as the chart reads it: {identity: [binding, ...]}, with PLACEHOLDER for a provider."""
    rows: dict[str, list[dict[str, str]]] = {}
    for grant in grants([PLACEHOLDER]):
        row = grant.as_dict()
        rows.setdefault(row.pop("principal").removeprefix("User:"), []).append(row)
    return json.dumps(rows, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the ACL bindings for the workers' providers as JSON, or write the chart's table."""
    parser = argparse.ArgumentParser(prog="python -m baton_platform.acls", description=main.__doc__)
    parser.add_argument("--providers", default="", help="comma-separated providers of the workers")
    parser.add_argument("--chart", metavar="FILE", help=f"write the chart's table to FILE ({CHART_TABLE})")
    args = parser.parse_args(argv)
    if args.chart:
        with open(args.chart, "w") as fh:
            fh.write(chart_table())
        return 0
    providers = [p for p in args.providers.split(",") if p]
    json.dump([g.as_dict() for g in grants(providers)], sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
