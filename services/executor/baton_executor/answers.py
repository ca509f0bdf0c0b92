"""The answering task's options in the adapters' terms, and the checks its reply must pass.

A structured-output request is enforced twice: the adapter asks the provider for JSON in the API's own
way (OpenAI response_format, Anthropic output_format, Gemini responseJsonSchema), and the reply is then
validated here, so a provider (or OpenAI-compatible server) that ignores the request cannot hand the
client text it cannot parse. An answer that fails is retried like a transient error; if every attempt
fails, the step fails with the reason.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from baton.v1 import common_pb2, tasks_pb2
from baton_executor.providers.base import NO_SPEC, AnswerSpec, ProviderError, ProviderReply, ToolSpec
from baton_platform import jsonschemas

# Provider finish reasons in OpenAI's words, which is what the client gets.
FINISH_REASONS = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
    "function_call": "tool_calls",
    # Anthropic
    "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
    "refusal": "content_filter", "pause_turn": "stop",
    # Gemini
    "STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
}


def spec_of(task: tasks_pb2.Task) -> AnswerSpec:
    if not task.HasField("answer"):
        return NO_SPEC
    a = task.answer
    return AnswerSpec(
        tools=tuple(ToolSpec(name=t.name, description=t.description, parameters=_object(t.parameters_json),
                             strict=t.strict) for t in a.tools),
        tool_choice=a.tool_choice, tool_choice_name=a.tool_choice_name,
        parallel_tool_calls=a.parallel_tool_calls if a.HasField("parallel_tool_calls") else None,
        response_format=a.response_format, schema_name=a.schema_name,
        schema=_object(a.schema_json) if a.schema_json else None, schema_strict=a.schema_strict,
        top_p=a.top_p if a.HasField("top_p") else None, stop=tuple(a.stop),
        seed=a.seed if a.HasField("seed") else None, logprobs=a.logprobs, top_logprobs=a.top_logprobs, user=a.user,
        presence_penalty=a.presence_penalty if a.HasField("presence_penalty") else None,
        frequency_penalty=a.frequency_penalty if a.HasField("frequency_penalty") else None,
        logit_bias=json.loads(a.logit_bias_json) if a.logit_bias_json else None)


def _object(text: str) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def check_reply(spec: AnswerSpec, reply: ProviderReply) -> None:
    """Refuse a reply that breaks what the client asked for: retryable, as another sample may not."""
    if spec.tool_choice in ("required", "function") and not reply.tool_calls:
        raise ProviderError("the answer called no tool, though tool_choice required one", retryable=True)
    offered = {t.name for t in spec.tools}
    for call in reply.tool_calls:
        if call.name not in offered:
            raise ProviderError(f"the answer called {call.name!r}, which is not among the request's tools",
                                retryable=True)
    if not spec.response_format or reply.tool_calls or spec.stop or finish_reason(reply) == "length":
        # Cut by the client's own max_tokens or stop sequences: it gets the JSON as far as it went.
        return
    try:
        value = json.loads(reply.text)
    except ValueError as e:
        raise ProviderError(f"the answer is not the JSON that response_format asks for ({e})", retryable=True) from None
    if spec.response_format == "json_object" and not isinstance(value, dict):
        raise ProviderError("the answer is JSON but not an object, as response_format json_object asks",
                            retryable=True)
    if spec.response_format == "json_schema" and spec.schema:
        try:
            jsonschemas.validate(value, spec.schema)
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "the top level"
            raise ProviderError(f"the answer does not match the response_format schema at {where}: {e.message}",
                                retryable=True) from None
        except jsonschemas.SchemaRefused as e:  # the gateway refuses such schemas: a task it did not check
            raise ProviderError(f"the response_format schema is refused: {e}", retryable=False) from None


def finish_reason(reply: ProviderReply) -> str:
    if reply.tool_calls:
        return "tool_calls"
    return FINISH_REASONS.get(reply.finish_reason or "stop", "stop")


def tool_calls_proto(reply: ProviderReply) -> list[common_pb2.ToolCall]:
    return [common_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in reply.tool_calls]


def logprobs_proto(reply: ProviderReply) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token=t.token, logprob=t.logprob,
                                    top=[common_pb2.TopLogprob(token=a, logprob=lp) for a, lp in t.top])
            for t in reply.logprobs]
