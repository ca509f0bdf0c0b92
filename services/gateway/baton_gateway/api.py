"""The OpenAI-compatible HTTP surface: request validation and response bodies. No Kafka here."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from baton.v1 import common_pb2, feedback_pb2, responses_pb2
from baton_gateway.params import INT32_MAX, ChatCompletionRequest, first_error, param_at, param_of

# A request names an item of the operator's evaluation sets as "SET:ID"; the reward logger grades its
# answer, and that reward trains the routing policy, so only keys with the `eval` scope may send it.
EVAL_METADATA_KEY = "baton_eval"
EVAL_SCOPE = "eval"
EVAL_MAX_CHARS = 512  # as the reward logger's registry: a longer key names no item
# fullmatch, not `$`: `$` would also accept a trailing newline.
EVAL_ITEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}:.+")


class ApiError(Exception):
    """An OpenAI-style error: status, message, type, and the offending parameter if any."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


MAX_COMMENT_CHARS = 1000  # a rating's note for people; the trainer reads only the score


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    response_id: str = Field(min_length=1, max_length=200, description="The completion's id (chatcmpl-...) or request id.")
    score: float = Field(ge=-1, le=1, description="-1 (bad) to 1 (good).")
    comment: str = Field(default="", max_length=MAX_COMMENT_CHARS)


def parse_feedback(raw: bytes, tenant: str) -> feedback_pb2.Feedback:
    """A rating from its JSON body, stamped with the caller's tenant: the trainer counts it only for
    that tenant's own requests, so a key cannot steer training by rating other tenants' answers."""
    try:
        fb = FeedbackIn.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"invalid feedback: {param}: {first['msg']}", param=param) from None
    return feedback_pb2.Feedback(response_id=fb.response_id.removeprefix("chatcmpl-"), score=fb.score,
                                 comment=fb.comment, created_unix_ms=int(time.time() * 1000), source="user",
                                 tenant=tenant)


def parse_chat_request(raw: bytes, known_models: set[str]) -> ChatCompletionRequest:
    return chat_request_from(json_object(raw), known_models)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as the JSON object it must be, or a 400 saying what it is instead."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        # JSON may spell an unpaired surrogate (\udb98), which no UTF-8 message can carry on.
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise ApiError(400, "the request body is not valid JSON: a string holds an unpaired surrogate") from None
    return data


def chat_request_from(data: dict[str, Any], known_models: set[str]) -> ChatCompletionRequest:
    """A chat-completions request, validated: a 400 naming the first parameter at fault, a 404 for a
    model the caller may not use."""
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as e:
        first = first_error(e.errors())
        if first["loc"]:
            param = param_at(first)
            if first["type"] == "extra_forbidden":
                raise ApiError(400, f"invalid request: {param}: this parameter is not supported", param=param) from None
            message = first["msg"].removeprefix("Value error, ")
            raise ApiError(400, f"invalid request: {param}: {message}", param=param) from None
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError(400, f"invalid request: {message}", param=param_of(message)) from None
    if req.model not in known_models:
        # OpenAI's answer to a model that is unknown or not the caller's to use: 404 model_not_found.
        raise ApiError(404, f"The model {req.model!r} does not exist or you do not have access to it; available: "
                       f"{', '.join(sorted(known_models)) or 'none'}.", code="model_not_found")
    check_eval_item(req.metadata or {})
    check_metadata(req.metadata or {})
    return req


# OpenAI's own limits on metadata: every record of the workflow, and every episode, carries it.
METADATA_MAX_PAIRS, METADATA_MAX_KEY_CHARS, METADATA_MAX_VALUE_CHARS = 16, 64, 512


def check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > METADATA_MAX_PAIRS:
        raise ApiError(400, f"invalid request: metadata holds at most {METADATA_MAX_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY_CHARS or len(value) > METADATA_MAX_VALUE_CHARS:
            raise ApiError(400, f"invalid request: metadata keys hold at most {METADATA_MAX_KEY_CHARS} characters and "
                           f"values at most {METADATA_MAX_VALUE_CHARS}", param="metadata")


def check_eval_item(metadata: dict[str, str]) -> None:
    """A 400 for a malformed `baton_eval`: a typo would otherwise be logged silently as ungraded."""
    if EVAL_METADATA_KEY not in metadata:
        return
    value = metadata[EVAL_METADATA_KEY]
    # The value is not echoed: it may be long, and it is the client's text.
    if len(value) > EVAL_MAX_CHARS or not EVAL_ITEM.fullmatch(value):
        raise ApiError(400, f"invalid request: metadata.{EVAL_METADATA_KEY} must be 'SET:ID' (SET matching "
                       f"[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}, ID not empty, one line, at most {EVAL_MAX_CHARS} "
                       "characters in all)", param=f"metadata.{EVAL_METADATA_KEY}")


# Metadata a request may carry that steers grading or routing: the fast policy routes by `eval_name`,
# so a key without the `eval` scope could otherwise choose its own features.
EVAL_SCOPED_KEYS = frozenset({EVAL_METADATA_KEY, "eval_name"})


def wants_eval(metadata: dict[str, str] | None) -> bool:
    return metadata is not None and not EVAL_SCOPED_KEYS.isdisjoint(metadata)


BUDGET_KEYS = {"baton_max_cost_usd": "max_cost_usd", "baton_max_calls": "max_calls"}


def budget_from(metadata: dict[str, str]) -> common_pb2.Budget:
    """A per-request budget from OpenAI `metadata` (strings): baton_max_cost_usd, baton_max_calls."""
    budget = common_pb2.Budget()
    for key, field in BUDGET_KEYS.items():
        if key not in metadata:
            continue
        try:
            value = float(metadata[key]) if field == "max_cost_usd" else int(metadata[key])
        except ValueError:
            raise ApiError(400, f"metadata.{key} must be a number, got {metadata[key]!r}", param=f"metadata.{key}") from None
        if not 0 < value < (math.inf if field == "max_cost_usd" else INT32_MAX):
            raise ApiError(400, f"metadata.{key} must be positive and finite", param=f"metadata.{key}")
        setattr(budget, field, value)
    return budget


def plan_summary(plan) -> dict[str, Any]:
    return {
        "backend": plan.backend,
        "policy_version": plan.policy_version,
        "fallback": plan.fallback,
        "steps": [{"worker": s.worker, "instruction": s.instruction,
                   "access": "all" if s.access.all else list(s.access.steps)} for s in plan.steps],
    }


def workflow_summary(episode: responses_pb2.Episode) -> dict[str, Any]:
    """The workflow facts a client may want: plan, per-step worker, tokens, cost, latency, and for a
    conductor step the plan its inner call wrote (no steps: it kept the answer)."""
    return {
        "plan": plan_summary(episode.plan),
        "steps": [{"step": s.step, "worker": s.worker, "model": s.model, "attempt": s.attempt,
                   "input_tokens": s.usage.input_tokens, "output_tokens": s.usage.output_tokens,
                   "cost_usd": s.usage.cost_usd, "latency_ms": round(s.latency_ms, 1),
                   **({"inner_plan": plan_summary(s.inner_plan)} if s.HasField("inner_plan") else {}),
                   **({"error": s.error.message} if s.error.code else {})} for s in episode.steps],
        **({"judge": {"worker": episode.judge.worker, "candidates": list(episode.judge.request_ids),
                      "scores": list(episode.judge.scores), "chosen": episode.judge.chosen,
                      **({"error": episode.judge.error} if episode.judge.error else {})}}
           if episode.HasField("judge") else {}),
        "cost_usd": episode.total.cost_usd,
        "calls": episode.total.calls,
        "latency_ms": round(episode.latency_ms, 1),
    }


def completion_body(request_id: str, model: str, response: responses_pb2.Response) -> dict[str, Any]:
    total = response.episode.total
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": answer_message(response), "finish_reason": finish_reason(response),
                     "logprobs": logprobs_body(response)}],
        "usage": usage_body(total),
        "baton": {"request_id": request_id, **workflow_summary(response.episode)},
    }


def tool_calls_body(response: responses_pb2.Response) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in response.tool_calls]


def answer_message(response: responses_pb2.Response) -> dict[str, Any]:
    if not response.tool_calls:
        return {"role": "assistant", "content": response.answer}
    # OpenAI's shape for a turn that calls tools: content null unless the model also said something.
    return {"role": "assistant", "content": response.answer or None, "tool_calls": tool_calls_body(response)}


def finish_reason(response: responses_pb2.Response) -> str:
    if response.tool_calls:
        return "tool_calls"
    return response.finish_reason if response.finish_reason in ("length", "content_filter") else "stop"


def logprobs_body(response: responses_pb2.Response) -> dict[str, Any] | None:
    if not response.logprobs:
        return None
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top]} for t in response.logprobs], "refusal": None}


def usage_body(total) -> dict[str, int]:
    return {"prompt_tokens": total.input_tokens, "completion_tokens": total.output_tokens,
            "total_tokens": total.input_tokens + total.output_tokens}


def _chunk_base(request_id: str, model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}


def opening_chunk(request_id: str, model: str) -> dict[str, Any]:
    """Sent at once, so a streaming client sees the response start while the workflow runs."""
    return {**_chunk_base(request_id, model),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def summary_header(response: responses_pb2.Response) -> str:
    ep = response.episode
    workers = ",".join(s.worker for s in ep.plan.steps)
    return f"steps={len(ep.plan.steps)}; workers={workers}; cost_usd={ep.total.cost_usd:.6f}"
