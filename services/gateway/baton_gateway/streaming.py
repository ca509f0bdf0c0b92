"""Streaming the answer as its step produces it, without ever sending a different answer.

The executor running a streaming request's answering task publishes its text as Delta responses;
the final response carries the answer the workflow settled on. Those can disagree: a provider call
retried after part of its text went out, a fallback worker that took over the step. So the client
gets only text that extends what it already has:

- Deltas of the first task seen are forwarded; any other task's are dropped (a fallback's text
  reaches the client through the final answer instead).
- Within that task, offsets restart at 0 with each provider call. A call's text is forwarded only
  where it goes beyond what was sent, and only while it agrees with it; a call that disagrees (or
  skips ahead) is ignored until a call starts again.
- At the final response, an answer that starts with the sent text is completed with the rest. One
  that does not ends the stream with an error event (`stream_diverged`): the client already holds
  text that is not the answer, and silently sending another would leave it with a wrong mixture.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import StreamingResponse

from baton.v1 import responses_pb2
from baton_gateway.api import finish_reason, logprobs_body, tool_calls_body, usage_body


class StreamedAnswer:
    def __init__(self) -> None:
        self.sent = ""
        self.task_id: str | None = None
        self._pos: int | None = None  # where the current call's next delta must start; None: out of step

    def accept(self, delta: responses_pb2.Delta) -> str:
        """The new text to send for this delta ("" when there is none to send)."""
        if self.task_id is None:
            self.task_id = delta.task_id
        if delta.task_id != self.task_id:
            return ""
        if delta.offset == 0:
            self._pos = 0  # a provider call (re)starts
        if self._pos is None or delta.offset != self._pos:
            self._pos = None
            return ""
        end = delta.offset + len(delta.text)
        known = self.sent[delta.offset:end]
        if not delta.text.startswith(known):
            self._pos = None  # this call says something else than what the client has
            return ""
        self._pos = end
        new = delta.text[len(known):]
        self.sent += new
        return new

    def finish(self, answer: str) -> str | None:
        """What is left to send of the final answer, or None when it does not extend what was sent."""
        return answer[len(self.sent):] if answer.startswith(self.sent) else None


def _chunk(request_id: str, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices, **extra}


def content_chunk(request_id: str, model: str, text: str) -> dict[str, Any]:
    return _chunk(request_id, model, [{"index": 0, "delta": {"content": text}, "finish_reason": None}])


def closing_chunks(request_id: str, model: str, response: responses_pb2.Response, include_usage: bool) -> list[dict]:
    """After the last of the text: the finish reason, then the usage of the whole workflow if asked for."""
    chunks = []
    if response.tool_calls:
        # Each call whole in one delta: a valid OpenAI stream, which clients accumulate by index.
        calls = [{"index": i, **call} for i, call in enumerate(tool_calls_body(response))]
        chunks.append(_chunk(request_id, model, [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]))
    chunks.append(_chunk(request_id, model, [{"index": 0, "delta": {}, "finish_reason": finish_reason(response),
                                              "logprobs": logprobs_body(response)}]))
    if include_usage:
        chunks.append(_chunk(request_id, model, [], usage=usage_body(response.episode.total)))
    return chunks


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body generator however the response ends. When the client goes away while the
    generator waits at a `yield`, Starlette abandons it there; closing it now runs its cleanup (the
    gateway forgets the request) at once instead of whenever it is garbage collected."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)  # an async generator's
            if aclose is not None:
                await aclose()
