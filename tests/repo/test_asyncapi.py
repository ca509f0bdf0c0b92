"""docs/asyncapi.yaml is generated from the services' wiring and must match it."""

from __future__ import annotations

import importlib.util

import yaml
from testbed import REPO


def generator():
    spec = importlib.util.spec_from_file_location("asyncapi_doc", REPO / "tools" / "asyncapi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_asyncapi_document_matches_the_wiring():
    module = generator()
    assert module.DOCUMENT.read_text() == module.document(), "docs/asyncapi.yaml is stale: run `make docs`"


def test_the_document_shows_every_consumer_and_declared_publisher():
    doc = yaml.safe_load(generator().document())
    receive = {op["channel"]["$ref"].split("/")[-1] for op in doc["operations"].values() if op["action"] == "receive"}
    send = {op["channel"]["$ref"].split("/")[-1] for op in doc["operations"].values() if op["action"] == "send"}
    assert {"baton.requests:baton-router", "baton.workflow:baton-synthesizer", "baton.tasks.sim:baton-executor-sim",
            "baton.responses:baton-gateway", "baton.responses:baton-reward-logger"} <= receive
    assert {"baton-gateway:baton.requests", "baton-router:baton.workflow", "baton-synthesizer:baton.tasks.sim",
            "baton-executor-sim:baton.workflow", "baton-reward-logger:baton.rewards", "baton-gateway:baton.dlq"} <= send
    described = doc["channels"]["baton.requests:baton-router"]["description"]
    assert "baton.v1.ChatRequest" in described, "each channel names its protobuf message type"
