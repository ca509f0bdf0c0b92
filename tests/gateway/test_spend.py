"""The spend ledger on a real broker: what one gateway replica counted is what the next one starts
from, a newer total of a key wins over an older one whatever order they are read in, and records
that are not spend totals of a known tenant are skipped."""

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from testbed import ensure_topics, kafka_section

from baton_gateway.spend import SpendLedger
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.service import Service

RUN = uuid.uuid4().hex[:8]  # the session's broker is shared: this run's tenants are its own
ACME, ZETA = f"acme-{RUN}", f"zeta-{RUN}"
TENANTS = {ACME, ZETA}


async def ledger_of(kafka: KafkaConfig, service: Service) -> SpendLedger:
    ledger = SpendLedger(TENANTS, kafka, service.publisher(topics.SPEND, None, "spend"))
    await ledger.start()
    for _ in range(100):
        if await ledger.caught_up():
            return ledger
    raise AssertionError("the ledger never read baton.spend up to its end")


async def write(bootstrap: str, records: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topics.SPEND, value, key=key.encode())
    finally:
        await producer.stop()


async def test_a_new_replica_starts_from_what_the_last_one_counted(kafka_bootstrap):
    await ensure_topics(kafka_bootstrap)
    kafka = KafkaConfig(**kafka_section(kafka_bootstrap))
    service = Service.create("spend-test", kafka)
    await service.broker.start()
    try:
        first = await ledger_of(kafka, service)
        first.count(ACME, 0, 10, 0.25)
        first.count(ACME, 1, 4, 0.5)
        first.count(ZETA, 0, 11, 1.0)
        await first.stop()  # a clean stop publishes what changed

        await write(kafka_bootstrap, [
            (f"{ACME}/0", json.dumps({"cost_usd": 0.01, "through": 3}).encode()),  # older than offset 10: loses
            (f"{ACME}/2", b"not json"), (f"{ACME}/3", json.dumps({"cost_usd": -5, "through": 99}).encode()),
            (f"ghost-{RUN}/0", json.dumps({"cost_usd": 7, "through": 99}).encode()), (ACME, b"{}")])
        second = await ledger_of(kafka, service)
        assert second.spent(ACME) == pytest.approx(0.75) and second.spent(ZETA) == pytest.approx(1.0)
        assert second.spent(f"ghost-{RUN}") == 0
        second.count(ACME, 0, 10, 0.25)  # offset 10 read again after the handover: counted already
        second.count(ACME, 0, 12, 0.125)
        assert second.spent(ACME) == pytest.approx(0.875)
        await second.stop()
    finally:
        await service.broker.stop()


def test_a_total_is_kept_only_when_counted_through_a_later_offset():
    ledger = SpendLedger(TENANTS)
    ledger._take(f"{ACME}/0", json.dumps({"cost_usd": 1.0, "through": 5}).encode())
    ledger._take(f"{ACME}/0", json.dumps({"cost_usd": 0.5, "through": 4}).encode())  # read late, older
    ledger._take(f"{ACME}/1", json.dumps({"cost_usd": 2.0, "through": 1}).encode())
    assert ledger.spent(ACME) == pytest.approx(3.0)
    ledger._take(f"{ACME}/0", json.dumps({"cost_usd": 1.5, "through": 9}).encode())
    assert ledger.spent(ACME) == pytest.approx(3.5)
    ledger._take(f"{ACME}/0", json.dumps({"cost_usd": float("inf"), "through": 99}).encode())
    assert ledger.spent(ACME) == pytest.approx(3.5)


def test_a_flush_that_fails_is_sent_again_with_the_next():
    class Away:
        def __init__(self):
            self.sent, self.fail = [], True

        async def send(self, body, *, key):
            if self.fail:
                raise ConnectionError("broker away")
            self.sent.append((key, json.loads(body)))

    out = Away()
    ledger = SpendLedger(TENANTS, out=out)  # type: ignore[arg-type] - a publisher's send alone
    ledger.count(ACME, 0, 1, 0.5)
    asyncio.run(ledger.flush())
    out.fail = False
    asyncio.run(ledger.flush())
    assert [(k, r["cost_usd"], r["through"]) for k, r in out.sent] == [(f"{ACME}/0", 0.5, 1)]
