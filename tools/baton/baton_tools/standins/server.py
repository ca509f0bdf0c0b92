"""Building stand-in apps and running them: in a background thread (cheap, for
tests) or in a subprocess (own interpreter, for benchmarks)."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from .anthropic_api import AnthropicDialect
from .core import Dialect, StandinApp, StandinConfig
from .gemini_api import GeminiDialect
from .openai_api import OpenAIDialect

DIALECTS: dict[str, type[Dialect]] = {
    "openai": OpenAIDialect,
    "anthropic": AnthropicDialect,
    "gemini": GeminiDialect,
}
# Path the matching adapter expects as base_url, relative to the server root.
BASE_PATHS = {"openai": "/v1", "anthropic": "", "gemini": ""}
READY_MARKER = "baton-standin listening on"
KEY_ENV = "BATON_STANDIN_REQUIRE_KEY"


def _dialect(kind: str) -> Dialect:
    try:
        return DIALECTS[kind]()
    except KeyError:
        raise ValueError(f"unknown stand-in kind {kind!r}; expected one of {', '.join(DIALECTS)}") from None


def create_app(kind: str, config: StandinConfig | None = None, **options: Any) -> Starlette:
    """The ASGI app for one API. ``options`` are :class:`StandinConfig` fields."""
    config = (config or StandinConfig()).updated(options) if options else (config or StandinConfig())
    dialect = _dialect(kind)
    standin = StandinApp(dialect, config)
    routes = dialect.routes(standin.endpoint) + standin.control_routes()
    if BASE_PATHS[kind]:
        # Lets callers reach the control routes as f"{base_url}/_standin/..." for every kind.
        routes += standin.control_routes(BASE_PATHS[kind])
    app = Starlette(routes=routes)
    app.state.standin = standin
    return app


def base_url_for(kind: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{BASE_PATHS[kind]}"


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be explicit: asyncio only turns on TCP_NODELAY for accepted sockets whose
    # proto is IPPROTO_TCP, and without it every keep-alive request waits ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app: Starlette, log_level: str = "warning") -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        # Benchmarks open many concurrent connections; keep them alive between requests.
        timeout_keep_alive=30,
    )
    return uvicorn.Server(config)


def serve_forever(kind: str, host: str, port: int, config: StandinConfig, log_level: str = "warning") -> None:
    """Blocking entry point used by the CLI; prints the ready line once listening."""
    sock = bind_socket(host, port)
    app = create_app(kind, config)
    url = base_url_for(kind, host, sock.getsockname()[1])
    print(f"{READY_MARKER} {url}", flush=True)
    _uvicorn_server(app, log_level).run(sockets=[sock])


def _options_to_args(options: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    args: list[str] = []
    env: dict[str, str] = {}
    for name, value in options.items():
        if value is None or value is False:
            continue
        if name == "require_key":
            env[KEY_ENV] = str(value)  # kept out of argv, which other users can read via ps
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif name == "models":
            args += [flag, ",".join(value)]
        else:
            args += [flag, str(value)]
    return args, env


@contextlib.contextmanager
def run_standin(
    kind: str,
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    mode: str = "thread",
    startup_timeout_s: float = 15.0,
    **options: Any,
) -> Iterator[str]:
    """Run a stand-in for the duration of a ``with`` block and yield its base URL.

    The URL is what the matching adapter takes as ``base_url`` (``.../v1`` for
    OpenAI). ``port=0`` picks a free port. ``mode="thread"`` serves from a
    background thread of this process; ``mode="subprocess"`` starts
    ``python -m baton_tools.standins`` so the server does not share this
    interpreter's GIL. ``options`` are :class:`StandinConfig` fields.
    """
    config = StandinConfig().updated(options)
    _dialect(kind)
    if mode == "thread":
        with _run_in_thread(kind, host, port, config, startup_timeout_s) as url:
            yield url
    elif mode == "subprocess":
        with _run_in_subprocess(kind, host, port, options, startup_timeout_s) as url:
            yield url
    else:
        raise ValueError(f"unknown mode {mode!r}; expected 'thread' or 'subprocess'")


@contextlib.contextmanager
def _run_in_thread(kind: str, host: str, port: int, config: StandinConfig, startup_timeout_s: float) -> Iterator[str]:
    sock = bind_socket(host, port)
    url = base_url_for(kind, host, sock.getsockname()[1])
    server = _uvicorn_server(create_app(kind, config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"standin-{kind}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"{kind} stand-in did not start")
        time.sleep(0.005)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def _run_in_subprocess(kind: str, host: str, port: int, options: dict[str, Any],
                       startup_timeout_s: float) -> Iterator[str]:  # fmt: skip
    args, extra_env = _options_to_args(options)
    if extra_env:
        args += ["--require-key-env", KEY_ENV]
    cmd = [sys.executable, "-m", "baton_tools.standins", kind, "--host", host, "--port", str(port), *args]
    env = {**os.environ, **extra_env}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = _await_ready_line(proc, startup_timeout_s)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _await_ready_line(proc: subprocess.Popen, timeout_s: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("stand-in subprocess did not report that it is listening")
            if not selector.select(timeout=remaining):
                continue
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"stand-in subprocess exited early (status {proc.wait()})")
            if line.startswith(READY_MARKER):
                return line[len(READY_MARKER) :].strip()


# --- reading and steering a running stand-in --------------------------------------


_control_client: httpx.Client | None = None
_control_lock = threading.Lock()


def _control(method: str, url: str, timeout_s: float, **kwargs: Any) -> httpx.Response:
    global _control_client
    with _control_lock:
        if _control_client is None:
            # Stand-ins are local plain HTTP: an HTTP(S)_PROXY from the environment must
            # not capture these calls, and loading CA certificates per call made them slow.
            _control_client = httpx.Client(trust_env=False, verify=False)
        client = _control_client
    return client.request(method, url, timeout=timeout_s, **kwargs)


def standin_stats(base_url: str, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """Counters of a running stand-in (``GET {base_url}/_standin/stats``)."""
    response = _control("GET", f"{base_url}/_standin/stats", timeout_s)
    response.raise_for_status()
    return response.json()


def standin_requests(base_url: str, *, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The most recent requests the stand-in accepted as well-formed, oldest first."""
    response = _control("GET", f"{base_url}/_standin/requests", timeout_s)
    response.raise_for_status()
    return response.json()["requests"]


def configure_standin(base_url: str, *, timeout_s: float = 5.0, **changes: Any) -> dict[str, Any]:
    """Change :class:`StandinConfig` fields of a running stand-in; returns the new config."""
    response = _control("POST", f"{base_url}/_standin/config", timeout_s, json=changes)
    if response.status_code == 400:
        raise ValueError(response.json().get("error", "invalid stand-in options"))
    response.raise_for_status()
    return response.json()


def reset_standin(base_url: str, *, timeout_s: float = 5.0) -> None:
    """Back to the startup config with zeroed counters, an empty window and a fresh fault budget."""
    response = _control("POST", f"{base_url}/_standin/reset", timeout_s)
    response.raise_for_status()
