"""The executor's HTTP client: httpx's API over aiohttp's connection pool.

The adapters build requests and read replies with httpx. httpx's own pool (httpcore on anyio)
spends many times the CPU per request that aiohttp's does, as much as the rest of a workflow across
every service (the executor's profile in `make bench` shows it). This transport hands each httpx
request to aiohttp and its reply back as an httpx response, so the adapters, their tests and the
httpx tracing instrumentation stay as they are. Failures come back as the httpx exceptions the adapters map.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

# Per-request timeouts come from each call (the adapters pass the call's own); these are fallbacks.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


@contextlib.contextmanager
def _as_httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except aiohttp.ConnectionTimeoutError as e:
        raise httpx.ConnectTimeout(f"connecting timed out: {e}", request=request) from e
    except TimeoutError as e:  # aiohttp.SocketTimeoutError and the other timeouts subclass it
        raise httpx.ReadTimeout(f"reading timed out: {e}", request=request) from e
    except aiohttp.ClientConnectorError as e:
        raise httpx.ConnectError(str(e), request=request) from e
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as e:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {e}", request=request) from e
    except aiohttp.ServerDisconnectedError as e:
        raise httpx.RemoteProtocolError(f"the server closed the connection: {e}", request=request) from e
    except aiohttp.ClientPayloadError as e:
        raise httpx.ReadError(f"the reply's body broke off: {e}", request=request) from e
    except aiohttp.ClientError as e:
        raise httpx.NetworkError(f"{type(e).__name__}: {e}", request=request) from e


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests sent through one aiohttp session, made in the running loop on first use."""

    def __init__(self, *, max_connections: int = 256, verify: bool = True, trust_env: bool = True) -> None:
        self._limit, self._verify, self._trust_env = max_connections, verify, trust_env
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[tuple[str, str, int | None], tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit, ssl=self._verify,
                                             keepalive_timeout=15)
            # httpx decodes the content-encoding itself: aiohttp must hand the body over as it came. No
            # cookies are kept between calls. The environment's proxies are looked up here once per
            # origin: aiohttp's own trust_env reads them (and ~/.netrc) in a thread on every request.
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def _proxy(self, url: httpx.URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        origin = (url.scheme, url.host, url.port)
        if origin not in self._proxies:
            self._proxies[origin] = (None, None)
            if self._trust_env:  # HTTP(S)_PROXY and NO_PROXY, as httpx reads them
                with contextlib.suppress(LookupError):
                    self._proxies[origin] = get_env_proxy_for_url(URL(str(url)))
        return self._proxies[origin]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        proxy, proxy_auth = self._proxy(request.url)
        with _as_httpx_errors(request):
            response = await self._open().request(
                request.method, str(request.url), headers=request.headers.multi_items(), data=body or None,
                allow_redirects=False, compress=False, proxy=proxy, proxy_auth=proxy_auth,
                timeout=aiohttp.ClientTimeout(connect=timeout.get("pool"), sock_connect=timeout.get("connect"),
                                              sock_read=timeout.get("read")))
        return httpx.Response(response.status, headers=response.raw_headers, stream=_Body(response, request),
                              request=request, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def provider_client(*, verify: bool = True, trust_env: bool = True) -> httpx.AsyncClient:
    """The client every adapter of an executor shares (proxies from the environment, as httpx does)."""
    return httpx.AsyncClient(transport=AiohttpTransport(verify=verify, trust_env=trust_env), timeout=DEFAULT_TIMEOUT)
