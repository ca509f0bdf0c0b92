"""The executor's HTTP client: proxies from the environment as httpx reads them, lines split as
server-sent events end them, failures as `TransportError`, and a client span per sampled call."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton_executor.transport import ProviderClient, TransportError, split_lines


async def _server(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _post(client: ProviderClient, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with client.post(url, b"{}", headers or {}, 5.0) as reply:
        return reply.status, await reply.read()


async def test_requests_go_through_the_environments_proxy_except_where_no_proxy_says(monkeypatch):
    seen = []

    async def proxy(request: web.Request) -> web.Response:  # a forward proxy sees the absolute URL
        seen.append(("proxy", str(request.url), request.headers.get("authorization")))
        return web.json_response({"via": "proxy"})

    async def origin(request: web.Request) -> web.Response:
        seen.append(("origin", request.path, request.headers.get("authorization")))
        return web.json_response({"via": "origin"})

    proxy_runner, proxy_url = await _server(proxy)
    origin_runner, origin_url = await _server(origin)
    far = "http://provider.invalid/v1/chat/completions"
    key = {"authorization": "Bearer k"}
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        client = ProviderClient()
        try:
            assert await _post(client, far, key) == (200, b'{"via": "proxy"}')
            assert await _post(client, origin_url + "/v1/x", key) == (200, b'{"via": "origin"}')
        finally:
            await client.aclose()
        assert seen == [("proxy", far, "Bearer k"), ("origin", "/v1/x", "Bearer k")]
        client = ProviderClient(trust_env=False)  # told to ignore the environment
        try:
            with pytest.raises(TransportError) as info:  # so it looks provider.invalid up itself
                await _post(client, far)
        finally:
            await client.aclose()
        assert not info.value.timeout and not info.value.bad_url
        assert len(seen) == 2
    finally:
        await proxy_runner.cleanup()
        await origin_runner.cleanup()


async def _chunks(*parts: bytes):
    for part in parts:
        yield part


@pytest.mark.parametrize("parts", [
    (b"a\r\nb\nc\rd",),
    (b"a\r", b"\nb\n", b"c\r", b"d"),  # a CRLF cut between two chunks is one line end
    (b"a", b"\r\n", b"b\nc", b"\rd\r"),
])
async def test_lines_end_at_crlf_lf_or_cr_whichever_chunks_they_come_in(parts):
    assert [line async for line in split_lines(_chunks(*parts))] == ["a", "b", "c", "d"]


async def test_blank_lines_are_kept_and_text_is_utf8():
    lines = [line async for line in split_lines(_chunks(b"data: \xc3", b"\xa9t\xc3\xa9\r\n\r\n", b"x"))]
    assert lines == ["data: été", "", "x"]


async def test_failures_say_whether_they_timed_out_or_the_url_is_bad():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.Response(text="late")

    runner, url = await _server(slow)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/"  # nothing listens once the socket closes
    client = ProviderClient(trust_env=False)
    try:
        with pytest.raises(TransportError) as timed_out:
            async with client.post(url, b"{}", {}, 0.2) as reply:
                await reply.read()
        with pytest.raises(TransportError) as refused:
            await _post(client, closed)
        with pytest.raises(TransportError) as bad:
            await _post(client, "vllm:8000/v1")
    finally:
        await client.aclose()
        await runner.cleanup()
    assert timed_out.value.timeout and not timed_out.value.bad_url
    assert not refused.value.timeout and not refused.value.bad_url
    assert bad.value.bad_url


async def test_a_sampled_call_has_a_client_span_and_passes_its_trace_on():
    seen = {}

    async def origin(request: web.Request) -> web.Response:
        seen["traceparent"] = request.headers.get("traceparent")
        return web.Response(status=429, text="slow down")

    runner, url = await _server(origin)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    client = ProviderClient(trust_env=False, tracer=tracer)
    try:
        with tracer.start_as_current_span("step") as step:
            assert await _post(client, url.replace("://", "://user:pw@") + "/v1/x?key=secret") == (429, b"slow down")
    finally:
        await client.aclose()
        await runner.cleanup()
    (post,) = [s for s in exporter.get_finished_spans() if s.name == "POST"]
    assert post.kind == trace.SpanKind.CLIENT and post.parent.span_id == step.get_span_context().span_id
    assert post.attributes["http.response.status_code"] == 429 and post.status.status_code == trace.StatusCode.ERROR
    assert post.attributes["url.full"] == url + "/v1/x"  # no credentials, no query
    assert seen["traceparent"].split("-")[1] == format(step.get_span_context().trace_id, "032x")
