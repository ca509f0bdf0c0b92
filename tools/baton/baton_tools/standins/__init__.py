"""Local stand-ins for LLM provider APIs (OpenAI Chat Completions, Anthropic
Messages, Gemini generateContent) that speak the real wire formats.

Replies are deterministic and reveal what the server received::

    "[<model>] saw: system: ... | user: ... | assistant: ..."

(roles as the API received them: Gemini shows ``model`` for assistant turns),
with token counts from a whitespace split. Fault injection (latency, a sliding
request-per-window limit answering 429, failing the first K requests) is set
at start or at runtime through ``/_standin/config``; counters are at
``GET /_standin/stats``.
"""

from .core import StandinConfig, count_tokens, echo_text, render_transcript
from .server import (
    base_url_for,
    configure_standin,
    create_app,
    reset_standin,
    run_standin,
    standin_requests,
    standin_stats,
)

KINDS = ("openai", "anthropic", "gemini")

__all__ = [
    "KINDS",
    "StandinConfig",
    "base_url_for",
    "configure_standin",
    "count_tokens",
    "create_app",
    "echo_text",
    "render_transcript",
    "reset_standin",
    "run_standin",
    "standin_requests",
    "standin_stats",
]
