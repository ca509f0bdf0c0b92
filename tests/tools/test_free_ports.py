"""Ports picked for the processes a stack starts: distinct, free, and out of the kernel's ephemeral range."""

from __future__ import annotations

import socket

from baton_tools import procs


def test_ports_are_distinct_across_calls_and_below_the_ephemeral_range():
    picked = [procs.free_port() for _ in range(200)] + procs.free_ports(200)
    assert len(set(picked)) == 400, "no port is handed out twice"
    assert all(10000 <= p < procs._ephemeral_start() for p in picked)
    for port in picked[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_never_picked(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        draws = iter([busy, busy, 20001, 20002, 20003, 20004])
        monkeypatch.setattr(procs, "_PICKED", set())
        monkeypatch.setattr("random.randrange", lambda low, high: next(draws))
        assert busy not in procs.free_ports(2)
