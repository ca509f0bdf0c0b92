"""Shared fixtures: a real Kafka broker for the tiers that need one, and config files built per test."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from testbed import default_config_data


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    from baton_tools.kafka import kafka_for_tests

    with kafka_for_tests() as bootstrap:
        yield bootstrap


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
