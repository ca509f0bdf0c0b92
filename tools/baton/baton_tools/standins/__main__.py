"""``python -m baton_tools.standins {openai|anthropic|gemini} --port P [options]``"""

from __future__ import annotations

import argparse
import os
import sys

from .core import StandinConfig
from .server import DIALECTS, serve_forever


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m baton_tools.standins",
        description="Serve a local stand-in for an LLM provider API, speaking its real wire format.",
    )
    p.add_argument("kind", choices=sorted(DIALECTS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay before every answer")
    p.add_argument("--chunk-delay-ms", type=float, default=0.0, help="delay between streamed chunks")
    p.add_argument("--rpm", type=int, default=None, help="requests allowed per window; beyond that, 429")
    p.add_argument("--window-s", type=float, default=60.0, help="length of the sliding rate-limit window")
    p.add_argument("--require-key", default=None,
                   help="accept only this API key (visible in ps; see --require-key-env)")  # fmt: skip
    p.add_argument("--require-key-env", default=None, metavar="VAR", help="read the required key from this env var")
    p.add_argument("--fail-first", type=int, default=0, help="fail the first K admitted requests")
    p.add_argument("--fail-status", type=int, default=None,
                   help="status for those failures (default: openai 500, anthropic 529, gemini 503)")  # fmt: skip
    p.add_argument("--fail-mid-stream", action="store_true",
                   help="streaming requests picked to fail get a 200 that breaks off with an error event")  # fmt: skip
    p.add_argument("--context-window", type=int, default=None, help="input tokens allowed before 'too long'")
    p.add_argument("--models", default=None, help="comma-separated model names that exist (default: any)")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    key = args.require_key
    if args.require_key_env:
        key = os.environ.get(args.require_key_env)
        if not key:
            print(f"environment variable {args.require_key_env} is empty or unset", file=sys.stderr)
            return 2
    try:
        config = StandinConfig(
            latency_ms=args.latency_ms,
            chunk_delay_ms=args.chunk_delay_ms,
            rpm=args.rpm,
            window_s=args.window_s,
            require_key=key,
            fail_first=args.fail_first,
            fail_status=args.fail_status,
            fail_mid_stream=args.fail_mid_stream,
            context_window=args.context_window,
            models=tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else None,
        )
        config.validate()
    except ValueError as exc:
        print(f"invalid option: {exc}", file=sys.stderr)
        return 2
    try:
        serve_forever(args.kind, args.host, args.port, config, args.log_level)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
