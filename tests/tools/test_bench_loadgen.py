"""The open-loop load generator (`make bench`, and `bench/loadgen.py` against a running stack): its own
HTTP/1.1 client against the OpenAI stand-in, the reply shapes that client must read (chunked bodies, a
server that closes the connection), and the one-step configuration the throughput check runs."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from baton_platform.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# The bench scripts import each other by bare name (`from loadgen import ...`), as `make bench` runs them.
sys.path.insert(0, str(BENCH))

from loadgen import _Pool  # noqa: E402
from procs import start_standin  # noqa: E402


def test_a_run_from_the_command_line_against_the_stand_in_answers_and_measures_every_request(tmp_path):
    standin, url = start_standin(tmp_path, latency_ms=20)
    try:
        out = subprocess.run([sys.executable, str(BENCH / "loadgen.py"), "--url", url, "--model", "sim",
                              "--rate", "40", "--seconds", "1.5"], capture_output=True, text=True, timeout=60)
    finally:
        standin.stop()
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["sent"] >= 30 and s["ok"] == s["sent"] and not s["errors"], s
    assert 20 <= s["p50_ms"] < 1000  # the stand-in's 20 ms and the way there and back
    assert s["client_cpu_ms_per_request"] > 0 and s["offered_rps"] == 40


def test_the_throughput_check_config_is_a_one_step_static_plan_on_the_stand_in_sent_straight_to_the_executor():
    config = load_config(ROOT / "config" / "examples" / "one-step.yaml")
    assert config.conductor.backend == "static" and config.conductor.plan.workers == ["standin"]
    assert config.router.direct_single_step
    assert [(w.provider, str(w.base_url)) for w in config.workers] == [
        ("openai_compatible", "http://127.0.0.1:18099/v1")]


def test_the_client_reads_chunked_and_closing_replies_and_reuses_only_open_connections():
    async def scenario() -> tuple[list, int]:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                if b"chunked" in body:
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n")
                elif b"close" in body:
                    writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    await writer.drain()
                    break
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"b\":2}")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = _Pool(f"http://127.0.0.1:{port}/v1")
        replies = [await pool.post_json("/x", b) for b in (b"chunked", b"plain", b"close", b"plain", b"plain")]
        pool.close()
        server.close()
        await server.wait_closed()
        return replies, connections

    replies, connections = asyncio.run(scenario())
    assert replies == [(200, b'{"a": 1}'), (200, b'{"b":2}'), (503, b"{}"), (200, b'{"b":2}'), (200, b'{"b":2}')]
    assert connections == 2  # one kept alive for three requests, a new one after the server closed it
