"""The executor's HTTP client for provider calls.

Every adapter call is one POST of a JSON body whose reply is read whole or line by line (a stream of
server-sent events). `ProviderClient` sends it straight over aiohttp's connection pool, with no
general-purpose request or response objects per call: httpx's, which this client used to wrap, cost a
sixth of the executor's CPU in `make bench`'s profile. `HttpxClient` sends the same call through an
httpx client a caller brings (a test's `httpx.MockTransport`, a client with its own settings).

Both raise `TransportError` for a call that got no HTTP reply, so the adapters map one kind of
failure. `ProviderClient` opens an HTTP client span per call in a sampled trace (none otherwise) and
passes the trace on to the provider in `traceparent`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Protocol

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from opentelemetry import propagate, trace
from yarl import URL

from baton_platform.telemetry import span

_LINE_END = re.compile(rb"\r\n|\r|\n")
_MAX_CACHED_URLS = 256  # one URL per model at most: bounded all the same


class TransportError(Exception):
    """A call that got no HTTP reply. `timeout`: a phase of it timed out; `bad_url`: the URL cannot be
    sent to (not http(s), or malformed). The message never holds a header, so no API key."""

    def __init__(self, message: str, *, timeout: bool = False, bad_url: bool = False) -> None:
        super().__init__(message)
        self.timeout, self.bad_url = timeout, bad_url


class Reply(Protocol):
    """An HTTP reply: its status and headers (names in any case), then its body, whole or by lines."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes: ...

    def lines(self) -> AsyncIterator[str]: ...


class Client(Protocol):
    """What an adapter sends its calls with."""

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout_s: float) -> contextlib.AbstractAsyncContextManager[Reply]: ...

    async def aclose(self) -> None: ...


async def split_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a byte stream, ended by CRLF, LF or CR (server-sent events allow all three; Gemini
    ends events with CRLF), decoded as UTF-8, and a last line that has no end. A multi-byte character
    holds no CR or LF byte, so splitting the bytes first cannot cut one."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        held = pending.endswith(b"\r")  # maybe the first half of a CRLF: wait for the next chunk
        *done, pending = _LINE_END.split(pending[:-1] if held else pending)
        if held:
            pending += b"\r"
        for line in done:
            yield line.decode("utf-8", errors="replace")
    if pending:
        for line in _LINE_END.split(pending.removesuffix(b"\r")):
            yield line.decode("utf-8", errors="replace")


@contextlib.contextmanager
def _aiohttp_errors() -> Iterator[None]:
    try:
        yield
    except aiohttp.ConnectionTimeoutError as e:
        raise TransportError(f"connect timeout: {e}", timeout=True) from e
    except TimeoutError as e:  # aiohttp.SocketTimeoutError and the other timeouts subclass it
        raise TransportError(f"read timeout: {e}", timeout=True) from e
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as e:
        raise TransportError(f"not an http(s) URL: {e}", bad_url=True) from e
    except aiohttp.ClientConnectorError as e:
        raise TransportError(f"ConnectError: {e}") from e
    except aiohttp.ServerDisconnectedError as e:
        raise TransportError(f"the server closed the connection: {e}") from e
    except aiohttp.ClientPayloadError as e:
        raise TransportError(f"the reply's body broke off: {e}") from e
    except aiohttp.ClientError as e:
        raise TransportError(f"{type(e).__name__}: {e}") from e


def _phases(seconds: float) -> aiohttp.ClientTimeout:
    """Each phase of a call (taking a pooled connection, connecting, each read) bounded by the call's
    timeout; the adapter bounds the whole call itself."""
    return aiohttp.ClientTimeout(connect=seconds, sock_connect=seconds, sock_read=seconds)


class _Reply:
    """A reply from either client: its body read whole, or its chunks split into lines, with the
    client's own failures raised as `TransportError`."""

    def __init__(self, status: int, headers: Mapping[str, str], read: Callable[[], Awaitable[bytes]],
                 chunks: Callable[[], AsyncIterator[bytes]],
                 errors: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self.status, self.headers = status, headers
        self._read, self._chunks, self._errors = read, chunks, errors

    async def read(self) -> bytes:
        with self._errors():
            return await self._read()

    async def lines(self) -> AsyncIterator[str]:
        with self._errors():
            async for line in split_lines(self._chunks()):
                yield line


class ProviderClient:
    """Provider calls over one aiohttp session, made in the running loop on first use. Proxies come
    from the environment (HTTP(S)_PROXY and NO_PROXY, as httpx reads them) unless `trust_env` is
    false. No cookies are kept between calls and redirects are not followed."""

    def __init__(self, *, max_connections: int = 256, verify: bool = True, trust_env: bool = True,
                 tracer: trace.Tracer | None = None) -> None:
        self._limit, self._verify, self._trust_env = max_connections, verify, trust_env
        self._tracer = tracer or trace.get_tracer("baton.executor.http")
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, tuple[URL, dict[str, str | int]]] = {}
        self._proxies: dict[tuple[str, str | None, int | None], tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit, ssl=self._verify,
                                             keepalive_timeout=15)
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def _url(self, url: str) -> tuple[URL, dict[str, str | int]]:
        """The URL parsed once, with its span attributes (parsing it per call was a tenth of the
        executor's CPU). A URL's credentials and query are not recorded."""
        known = self._urls.get(url)
        if known is None:
            if len(self._urls) >= _MAX_CACHED_URLS:
                self._urls.clear()
            try:
                parsed = URL(url)
            except ValueError as e:
                raise TransportError(f"not an http(s) URL: {e}", bad_url=True) from e
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise TransportError(f"not an http(s) URL: {url}", bad_url=True)
            attributes: dict[str, str | int] = {
                "http.request.method": "POST", "server.address": parsed.host, "server.port": parsed.port or 0,
                "url.full": str(parsed.with_user(None).with_query(None))}
            known = self._urls[url] = (parsed, attributes)
        return known

    def _proxy(self, url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The proxy for the URL's origin, looked up once: aiohttp's own trust_env reads the environment
        (and ~/.netrc) in a thread on every request."""
        origin = (url.scheme, url.host, url.port)
        if origin not in self._proxies:
            self._proxies[origin] = (None, None)
            if self._trust_env:
                with contextlib.suppress(LookupError):
                    self._proxies[origin] = get_env_proxy_for_url(url)
        return self._proxies[origin]

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> AsyncIterator[Reply]:
        parsed, attributes = self._url(url)
        proxy, proxy_auth = self._proxy(parsed)
        with span(self._tracer, "POST", kind=trace.SpanKind.CLIENT, attributes=attributes) as made:
            if made.get_span_context().is_valid:
                headers = dict(headers)
                propagate.inject(headers)
            try:
                with _aiohttp_errors():
                    response = await self._open().request(
                        "POST", parsed, data=body, headers=headers, allow_redirects=False, proxy=proxy,
                        proxy_auth=proxy_auth, timeout=_phases(timeout_s))
            except TransportError as e:
                made.set_attribute("error.type", "timeout" if e.timeout else "connection")
                raise
            made.set_attribute("http.response.status_code", response.status)
            if response.status >= 400:
                made.set_attribute("error.type", str(response.status))
                made.set_status(trace.StatusCode.ERROR)
            try:
                yield _Reply(response.status, response.headers, response.read, response.content.iter_any,
                             _aiohttp_errors)
            finally:
                response.release()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    try:
        yield
    except httpx.TimeoutException as e:
        raise TransportError(f"{type(e).__name__}: {e}", timeout=True) from e
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
        raise TransportError(f"not an http(s) URL: {e}", bad_url=True) from e
    except httpx.RequestError as e:
        raise TransportError(f"{type(e).__name__}: {e}") from e


class HttpxClient:
    """Provider calls through an httpx client the caller owns (this never closes it)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    @contextlib.asynccontextmanager
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> AsyncIterator[Reply]:
        with _httpx_errors():
            request = self._client.build_request("POST", url, content=body, headers=headers,
                                               timeout=httpx.Timeout(timeout_s))
            response = await self._client.send(request, stream=True)
        try:
            yield _Reply(response.status_code, response.headers, response.aread, response.aiter_bytes, _httpx_errors)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Nothing: the client is the caller's."""
