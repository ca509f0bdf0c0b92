"""The executor's client (httpx over aiohttp's pool) honours the environment's proxies as httpx does."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from baton_executor.transport import provider_client


async def _server(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


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
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with provider_client() as client:
            proxied = await client.post(far, json={}, headers={"authorization": "Bearer k"})
            direct = await client.post(origin_url + "/v1/x", json={}, headers={"authorization": "Bearer k"})
        assert proxied.json() == {"via": "proxy"} and direct.json() == {"via": "origin"}
        assert seen == [("proxy", far, "Bearer k"), ("origin", "/v1/x", "Bearer k")]
        async with provider_client(trust_env=False) as client:  # told to ignore the environment
            with pytest.raises(httpx.ConnectError):  # so it looks provider.invalid up itself
                await client.post(far, json={})
        assert len(seen) == 2
    finally:
        await proxy_runner.cleanup()
        await origin_runner.cleanup()
