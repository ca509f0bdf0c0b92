"""Shared fixtures (a real Kafka broker for the tiers that need one, the consumer tests' bus, config
files built per test) and the tier markers. Tests are filed by subject (gateway/, router/, platform/,
...), so a test's tier is not its folder: it is a marker, applied here, so that `-m "not kafka and not
e2e and not vllm"` (`make test-fast`) means no broker, no service processes and no vLLM engine."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from testbed import BUSES, Bus, default_config_data

# The S3 server's fixtures (s3_server, s3_url), for every test that asks for one.
pytest_plugins = ["moto_s3"]

# Tiers by where a test lives (e2e/ runs the whole system, every service its own process)...
DIRECTORY_TIERS = {"e2e": ("e2e", "kafka")}
# ...by what it uses (a subject's tests on the real broker ask for it)...
FIXTURE_TIERS = {"kafka_bootstrap": ("kafka",)}
# ...and by module: the Kafka harness's own tests (brokers of their own, no kafka_bootstrap), and the few
# that need the vLLM environment or take minutes.
MODULE_TIERS = {
    "conductor/test_conductor_transformers.py": ("slow",),
    "conductor/test_conductor_vllm_engine.py": ("vllm", "slow"),
    "e2e/test_chaos.py": ("slow",),
    "e2e/test_executor_scale.py": ("slow",),
    "e2e/test_llm_conductor.py": ("slow",),
    "e2e/test_local_model.py": ("vllm", "slow"),
    "e2e/test_vllm_conductor.py": ("vllm", "slow"),
    "tools/test_kafka_harness.py": ("kafka",),
    "platform/test_kafka_acls.py": ("kafka",),
}
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS)
        tiers = set(DIRECTORY_TIERS.get(path.parts[0], ())) | set(MODULE_TIERS.get(path.as_posix(), ()))
        for fixture in item.fixturenames:
            tiers |= set(FIXTURE_TIERS.get(fixture, ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("bus") == "kafka":
            tiers.add("kafka")  # the consumer tests' real-broker run
        for tier in sorted(tiers):
            item.add_marker(tier)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    from baton_tools.kafka import kafka_for_tests

    with kafka_for_tests() as bootstrap:
        yield bootstrap


@pytest.fixture(params=BUSES)
def bus(request, write_config) -> Bus:
    """Where a consumer test runs its service: FastStream's in-memory broker, then the real one."""
    bootstrap = request.getfixturevalue("kafka_bootstrap") if request.param == "kafka" else None
    return Bus(request.param, write_config, bootstrap)


@pytest.fixture
def write_config(tmp_path):
    """Write a config file from the default one with changes; returns its path."""

    def write(changes: dict | None = None, name: str = "baton.yaml", data: dict | None = None) -> Path:
        cfg = copy.deepcopy(data if data is not None else default_config_data())
        for key, value in (changes or {}).items():
            cfg[key] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(cfg))
        return path

    return write


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that ran on a stack of service processes carries the end of each service's log
    in its report: a timeout seen from the client says nothing of which service stopped, or why."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from baton_tools.procs import tail
    from baton_tools.stack import Stack

    for stack in {id(v): v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Stack)}.values():
        for svc in stack.services:
            if svc.log:
                report.sections.append((f"log of {svc.name} ({svc.log})", tail(svc.log, 60)))
