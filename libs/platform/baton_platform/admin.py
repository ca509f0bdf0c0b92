"""Creating the suite's topics with explicit partition counts (and, with `--acls`, its ACL table):
`baton-topics`, run by `make up`, the tests, and the Helm chart's pre-install Job. Nothing is ever
auto-created."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

from baton_platform import acls
from baton_platform import topics as names
from baton_platform.config import ConfigError, load_config
from baton_platform.kafka import client_options

TOPIC_ALREADY_EXISTS = 36


class TopicError(RuntimeError):
    pass


async def create_topics(options: dict, topics: dict[str, int], *, config: dict[str, dict[str, str]] | None = None,
                        replication_factor: int = 1, timeout: float = 30) -> None:
    """Create `topics` (name → partitions) and wait until every partition has a leader.

    Topics that already exist are left as they are, whatever their partition count or config.
    """
    config = config or {}
    stray = set(config) - set(topics)
    if stray:
        raise ValueError(f"config given for topics that are not created: {sorted(stray)}")
    if not topics:
        return
    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(**options, request_timeout_ms=max(1000, int(timeout * 1000)))
    await asyncio.wait_for(admin.start(), timeout)
    try:
        pending = dict(topics)
        while pending:
            response = await admin.create_topics(
                [NewTopic(name, n, replication_factor, topic_configs=dict(config.get(name, {})))
                 for name, n in pending.items()],
                timeout_ms=max(1000, int((deadline - time.monotonic()) * 1000)),
            )
            retry: dict[str, int] = {}
            failures: list[str] = []
            for entry in response.topic_errors:
                name, code = entry[0], entry[1]
                message = entry[2] if len(entry) > 2 else None
                if code in (0, TOPIC_ALREADY_EXISTS):
                    continue
                error = for_code(code)
                if error.retriable and time.monotonic() < deadline:
                    retry[name] = pending[name]
                else:
                    failures.append(f"{name}: {error.__name__} ({message or code})")
            if failures:
                raise TopicError("could not create topics: " + "; ".join(failures))
            pending = retry
            if pending:
                await asyncio.sleep(0.2)
        await _wait_for_leaders(admin, list(topics), deadline)
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topic_names: list[str], deadline: float) -> None:
    while True:
        described = await admin.describe_topics(topic_names)
        ready = {t["topic"] for t in described
                 if t.get("error_code") == 0 and t.get("partitions")
                 and all(p.get("leader", -1) >= 0 for p in t["partitions"])}
        missing = [n for n in topic_names if n not in ready]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TopicError(f"topics without partition leaders after the timeout: {missing}")
        await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton-topics", description="Create Baton's topics on the configured cluster")
    parser.add_argument("--config", default=None, help="defaults to BATON_CONFIG")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--acls", action="store_true",
                        help="also create the suite's ACLs (baton_platform.acls) for the workers' providers: for a "
                        "cluster whose authorizer denies what no ACL allows; the configured user must be a super user")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"baton-topics: {e}", file=sys.stderr)
        return 2
    counts, configs = names.topic_plan_for(cfg)
    asyncio.run(create_topics(client_options(cfg.kafka), counts, config=configs,
                              replication_factor=cfg.kafka.replication_factor, timeout=args.timeout))
    for name, n in sorted(counts.items()):
        print(f"{name}: {n} partition(s), replication {cfg.kafka.replication_factor}")
    if args.acls:
        bindings = acls.grants(cfg.providers)
        asyncio.run(acls.apply(client_options(cfg.kafka), bindings, timeout=args.timeout))
        print(f"{len(bindings)} ACLs for {len(acls.table(cfg.providers))} identities")
    return 0


if __name__ == "__main__":
    sys.exit(main())
