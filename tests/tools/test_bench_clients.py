"""The Kafka-client benchmark's relays run on the real broker, each relaying every record once, and
its report gives a row per relay."""

import os
import sys
from pathlib import Path

import pytest

# The bench scripts import each other by bare name, as `make bench` runs them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kafka_clients  # noqa: E402
import report  # noqa: E402


@pytest.mark.parametrize("kind", kafka_clients.RELAYS)
def test_each_relay_passes_on_every_record_once_and_its_cpu_is_read(kafka_bootstrap, kind):
    run = kafka_clients.measure(kind, kafka_bootstrap, os.getpid(), rate=40, seconds=1, warm_s=0.5)
    assert (run["sent"], run["relayed"]) == (40, 40)
    assert run["relay_cpu_s"] > 0 and run["p50_ms"] is not None and run["p50_ms"] <= run["p99_ms"]


def test_the_report_has_a_row_per_relay(tmp_path):
    runs = [{"sent": 100, "relayed": 100, "relay_cpu_s": 0.05, "broker_cpu_s": 0.1, "wall_s": 1.0,
             "p50_ms": 4.0, "p99_ms": 9.0}]
    data = {"rate": 100.0, "seconds": 1.0, "rounds": 1, "partitions": 8,
            "relays": [kafka_clients.summarize(kind, runs) for kind in kafka_clients.RELAYS]}
    lines = report._clients(data, tmp_path, None)
    rows = [line for line in lines if line.startswith("| ") and "relay CPU" not in line]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == list(kafka_clients.RELAYS)
    assert all("| 0.500 | 0.500 | 1.000 | 100 / 100 | 4.0 | 9.0 |" in r for r in rows)
