"""What one Kafka hop costs with each client: a relay that consumes a topic and publishes every record
to another, as each service's hop does, measured in CPU per record (the relay's process, its client
threads included, and the broker's) and in latency, at one rate on the real broker.

The relays:

- `faststream + aiokafka`: a FastStream subscriber and publisher, as the services run (sends queued,
  not awaited, as `Publisher.send` does for a consumed record);
- `faststream + librdkafka`: the same code on FastStream's confluent-kafka broker;
- `aiokafka`: aiokafka alone, records fetched in batches (`getmany`);
- `librdkafka`: confluent-kafka alone, one record waited for and then every record already fetched.

Every producer is idempotent with acks=all and a 1 ms linger, as the services' are, and every
consumer is in a group committing automatically. The relays take turns in rounds, so a change in what
else the machine does lands on all of them alike.

Run as `python bench/kafka_clients.py relay KIND BOOTSTRAP IN OUT` it is one relay (the bench starts
each as its own process, to read its CPU from /proc).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

from procs import user_system_s

RELAYS = ("faststream + aiokafka", "faststream + librdkafka", "aiokafka", "librdkafka")
_LINGER_MS = 1
_PARTITIONS = 8


async def _faststream(kind: str, bootstrap: str, topic_in: str, topic_out: str) -> None:
    from faststream import AckPolicy

    if kind == "faststream + aiokafka":
        from faststream.kafka import KafkaBroker
    else:
        from faststream.confluent import KafkaBroker  # type: ignore[assignment]
    broker = KafkaBroker(bootstrap, linger_ms=_LINGER_MS, enable_idempotence=True, acks="all", apply_types=False,
                         logger=None)
    out = broker.publisher(topic_out)
    subscriber = broker.subscriber(topic_in, group_id=f"relay-{topic_in}", auto_offset_reset="earliest",
                                   ack_policy=AckPolicy.ACK_FIRST)

    @subscriber
    async def relay(body: bytes) -> None:
        await out.publish(broker.context.get_local("message").body, key=b"k", no_confirm=True)

    await broker.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def _aiokafka(bootstrap: str, topic_in: str, topic_out: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=_LINGER_MS, enable_idempotence=True, acks="all")
    consumer = AIOKafkaConsumer(topic_in, bootstrap_servers=bootstrap, group_id=f"relay-{topic_in}",
                                auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    print("ready", flush=True)
    while True:
        for records in (await consumer.getmany(timeout_ms=500, max_records=500)).values():
            for r in records:
                await producer.send(topic_out, r.value, key=b"k")


def _librdkafka(bootstrap: str, topic_in: str, topic_out: str) -> None:
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": _LINGER_MS, "enable.idempotence": True,
                         "acks": "all"})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"relay-{topic_in}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic_in])
    print("ready", flush=True)
    while True:
        first = consumer.poll(0.5)  # returns as soon as a record is there
        if first is None:
            continue
        for m in [first, *consumer.consume(500, timeout=0)]:
            if m.error() is None:
                producer.produce(topic_out, m.value(), key=b"k")
        producer.poll(0)  # delivery reports


def relay(kind: str, bootstrap: str, topic_in: str, topic_out: str) -> None:
    if kind == "librdkafka":
        _librdkafka(bootstrap, topic_in, topic_out)
    elif kind == "aiokafka":
        asyncio.run(_aiokafka(bootstrap, topic_in, topic_out))
    else:
        asyncio.run(_faststream(kind, bootstrap, topic_in, topic_out))


async def _drive(bootstrap: str, topic_in: str, topic_out: str, rate: float, seconds: float, warm_s: float,
                 on_steady) -> tuple[int, int, list[float]]:
    """Sends `rate` records a second for `warm_s` (the relay joins its group, imports, makes its first
    fetches) and then for `seconds`, each carrying its send time, and reads them back; calls
    `on_steady(True)` as the measured part starts and `on_steady(False)` once its records are back
    (or 5 s later)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=_LINGER_MS)
    consumer = AIOKafkaConsumer(topic_out, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    latencies: list[float] = []

    async def read() -> None:
        async for m in consumer:
            if m.value.startswith(b"m"):
                latencies.append(time.time() - int(m.value[1:]) / 1e9)

    reader = asyncio.create_task(read())
    try:
        async def send(n: int, tag: bytes) -> None:
            start = time.monotonic()
            for i in range(n):
                wait = start + i / rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await producer.send(topic_in, tag + str(time.time_ns()).encode())

        await send(int(rate * warm_s), b"w")
        await asyncio.sleep(1)
        on_steady(True)
        sent = int(rate * seconds)
        await send(sent, b"m")
        deadline = time.monotonic() + 5
        while len(latencies) < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        on_steady(False)
    finally:
        reader.cancel()
        await producer.stop()
        await consumer.stop()
    return sent, len(latencies), latencies


def measure(kind: str, bootstrap: str, broker_pid: int, rate: float, seconds: float, warm_s: float = 5.0) -> dict:
    """One relay of `kind` on fresh topics, driven at `rate` for `seconds`: its CPU and the broker's over
    the measured part, records sent and relayed, and latency."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    run = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"bench-relay-in-{run}", f"bench-relay-out-{run}"

    async def topics() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, _PARTITIONS, 1) for t in (topic_in, topic_out)])
        finally:
            await admin.close()

    asyncio.run(topics())
    child = subprocess.Popen([sys.executable, __file__, "relay", kind, bootstrap, topic_in, topic_out],
                             stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout is None or child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} relay did not start")
        marks: dict[bool, tuple[float, float, float]] = {}

        def on_steady(start: bool) -> None:
            marks[start] = (sum(user_system_s(child.pid)), sum(user_system_s(broker_pid)), time.monotonic())

        sent, back, latencies = asyncio.run(_drive(bootstrap, topic_in, topic_out, rate, seconds, warm_s, on_steady))
    finally:
        child.terminate()
        child.wait(timeout=10)
    (relay0, broker0, t0), (relay1, broker1, t1) = marks[True], marks[False]
    latencies.sort()
    return {"sent": sent, "relayed": back, "relay_cpu_s": relay1 - relay0, "broker_cpu_s": broker1 - broker0,
            "wall_s": t1 - t0, "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else None}


def bench(plan, bootstrap: str, broker_pid: int, echo, emit) -> dict:
    """Each relay at `plan.clients_rps` for `plan.clients_s`, in `plan.clients_rounds` rounds."""
    runs: dict[str, list[dict]] = {kind: [] for kind in RELAYS}
    for round_ in range(plan.clients_rounds):
        for kind in RELAYS:
            echo(f"Kafka clients, round {round_ + 1}: {kind} relay at {plan.clients_rps:g} records/s "
                 f"for {plan.clients_s:g} s ...")
            runs[kind].append(measure(kind, bootstrap, broker_pid, plan.clients_rps, plan.clients_s))
    rows = [summarize(kind, measured) for kind, measured in runs.items()]
    for row in rows:
        emit({"bench": "clients", "kind": "relay", **{k: v for k, v in row.items() if k != "runs"}})
    return {"rate": plan.clients_rps, "seconds": plan.clients_s, "rounds": plan.clients_rounds,
            "partitions": _PARTITIONS, "relays": rows}


def summarize(kind: str, runs: list[dict]) -> dict:
    sent = sum(r["sent"] for r in runs) or 1
    per_round = [round(1000 * r["relay_cpu_s"] / max(r["sent"], 1), 3) for r in runs]
    p50s = [r["p50_ms"] for r in runs if r["p50_ms"] is not None]
    p99s = [r["p99_ms"] for r in runs if r["p99_ms"] is not None]
    return {"relay": kind, "relay_cpu_ms_per_record": round(1000 * sum(r["relay_cpu_s"] for r in runs) / sent, 3),
            "per_round_ms": per_round,
            "broker_cpu_ms_per_record": round(1000 * sum(r["broker_cpu_s"] for r in runs) / sent, 3),
            "relayed": sum(r["relayed"] for r in runs), "sent": sum(r["sent"] for r in runs),
            "p50_ms": round(max(p50s), 1) if p50s else None, "p99_ms": round(max(p99s), 1) if p99s else None,
            "runs": runs}


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "relay" or sys.argv[2] not in RELAYS:
        raise SystemExit(f"usage: kafka_clients.py relay {{{'|'.join(RELAYS)}}} BOOTSTRAP IN OUT")
    relay(*sys.argv[2:])
