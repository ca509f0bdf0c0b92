"""A service's HTTP server told to stop (SIGTERM): with a drain period it goes on answering, each
response closing its connection, then exits cleanly; without one it stops listening at once. A real
process and real sockets: keep-alive and signals are what is tested."""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import time

from baton_tools.procs import free_port

APP = """
import sys
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from baton_platform.http import serve

async def hello(request):
    return PlainTextResponse("hi")

serve(Starlette(routes=[Route("/", hello)]), "127.0.0.1", int(sys.argv[1]), service="drain-test",
      drain_s=float(sys.argv[2]))
"""


def start(drain_s: float) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", APP, str(port), str(drain_s)])
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)


def get(conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
    conn.request("GET", "/")
    reply = conn.getresponse()
    assert reply.status == 200 and reply.read() == b"hi"
    return reply


def test_a_draining_server_answers_on_and_closes_each_connection_after_its_response():
    proc, port = start(drain_s=3)
    try:
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert get(kept).getheader("connection") is None, "kept alive before the signal"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert get(kept).getheader("connection") == "close", "the same connection, answered, then closed"
        fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert get(fresh).getheader("connection") == "close", "still listening while it drains"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_without_a_drain_the_server_stops_listening_at_once():
    proc, port = start(drain_s=0)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            raise AssertionError("still listening after it stopped")
        except ConnectionRefusedError:
            pass
    finally:
        proc.kill()
