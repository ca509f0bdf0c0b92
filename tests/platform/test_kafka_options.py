"""Kafka connection settings built from config.kafka: a cluster's comma-separated bootstrap list reaches
the clients as a list (aiokafka takes a string as one address), and TLS carries the service's own
client certificate when one is set."""

from __future__ import annotations

import ssl

import pytest

from baton_platform.config import KafkaConfig
from baton_platform.kafka import client_options, make_broker, servers


def test_a_bootstrap_list_becomes_a_list_of_addresses():
    cfg = KafkaConfig(bootstrap_servers="a:9092, b:9092,c:9093")
    assert servers(cfg.bootstrap_servers) == ["a:9092", "b:9092", "c:9093"]
    assert client_options(cfg)["bootstrap_servers"] == ["a:9092", "b:9092", "c:9093"]
    assert make_broker(cfg, client_id="t")._connection_kwargs["bootstrap_servers"] == ["a:9092", "b:9092", "c:9093"]


def test_sasl_needs_a_user_and_a_password(monkeypatch):
    cfg = KafkaConfig(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="baton-gateway",
                      sasl_password_env="TEST_KAFKA_PASSWORD")
    monkeypatch.delenv("TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(ValueError, match="sasl_password_env"):
        client_options(cfg)
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cret")
    options = client_options(cfg)
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("baton-gateway", "s3cret")
    assert isinstance(options["ssl_context"], ssl.SSLContext)


def test_a_missing_client_certificate_is_an_error_that_names_it(tmp_path):
    cfg = KafkaConfig(security_protocol="SSL", ssl_certfile=tmp_path / "absent.crt", ssl_keyfile=tmp_path / "absent.key")
    with pytest.raises(OSError):
        client_options(cfg)
