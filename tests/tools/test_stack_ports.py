"""The local stack refuses to start over another gateway, instead of serving that one's answers."""

import socket

import pytest

from baton_tools.stack import Stack


def test_a_stack_refuses_a_gateway_port_something_else_listens_on(tmp_path, write_config):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = Stack(tmp_path / "run", config_file=write_config(), gateway_port=port)
        with pytest.raises(RuntimeError, match=f"port {port} \\(gateway.port\\) is already in use"):
            stack.start(echo=lambda *_: None)
    assert stack.kafka is None and stack.services == [], "nothing was started"


def test_a_stack_refuses_a_gateway_metrics_port_something_else_listens_on(tmp_path, write_config):
    with socket.socket() as taken, socket.socket() as free:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free.bind(("127.0.0.1", 0))
        api_port = free.getsockname()[1]  # bound, not listening: nothing answers there
        stack = Stack(tmp_path / "run", config_file=write_config(), gateway_port=api_port, gateway_metrics_port=port)
        with pytest.raises(RuntimeError, match=f"port {port} \\(gateway.metrics_port\\) is already in use"):
            stack.start(echo=lambda *_: None)
    assert stack.kafka is None and stack.services == [], "nothing was started"
