"""The gateway's OpenAPI document, generated from the pydantic models that validate its requests, so
the published contract and the validation cannot drift apart. Clients, and the fuzz suite, read it
at GET /openapi.json."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from baton_gateway.api import ChatCompletionRequest, FeedbackIn
from baton_gateway.files import PURPOSES, UPLOAD_PURPOSES
from baton_gateway.responses_api import ResponsesRequest
from baton_platform.config import DEFAULT_POLICY_NAME

_REF = "#/components/schemas/{model}"


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": _error("Malformed request: invalid JSON, a bad or unsupported parameter (error.param names it), empty "
                  "messages, a malformed metadata.baton_eval, or a rule between parameters that this schema cannot "
                  "state: a tool message must answer an earlier assistant tool call, tool_choice and "
                  "parallel_tool_calls need tools and a named tool_choice one of them, tool names are unique, "
                  "top_logprobs needs logprobs, logit_bias keys are token ids with biases from -100 to 100, and "
                  "the schemas in tools and response_format are valid JSON Schemas."),
    "401": _error("No API key, an incorrect one (code invalid_api_key), or a key without the scope."),
    "404": _error("The model does not exist or the caller may not use it (code model_not_found)."),
    "413": _error("The request body is larger than gateway.max_body_bytes, or its conversation too large for the records "
                  "of its workflow."),
    "429": _error("A rate limit of the key (code rate_limit_exceeded, with Retry-After), the tenant's budget "
                  "(code insufficient_quota), or the replica at capacity (code overloaded, with Retry-After)."),
    "503": _error("The gateway cannot queue requests yet; retry shortly."),
}
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
                   "description": "A repeat with the same key gets the first request's answer and runs nothing."}
IDEMPOTENCY_ERRORS = {
    "409": _error("The Idempotency-Key was used by a request with another body (code idempotency_key_reused)."),
}
WORKFLOW_ERRORS = {
    "502": _error("The workflow failed (the code says how, e.g. step_failed, budget_exceeded)."),
    "504": _error("No answer within gateway.request_timeout_s, or a step timed out."),
}


FILE_SCHEMAS: dict[str, Any] = {
    "FileUpload": {
        "type": "object", "required": ["file", "purpose"], "additionalProperties": False,
        "properties": {"file": {"type": "string", "format": "binary",
                                "description": "JSONL: every non-empty line a JSON object (a batch's requests)."},
                       "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)}}},
    "FileObject": {
        "type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
        "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "bytes": {"type": "integer"},
                       "created_at": {"type": "integer"}, "filename": {"type": "string"},
                       "purpose": {"enum": list(PURPOSES)}, "status": {"const": "processed"},
                       "expires_at": {"type": ["integer", "null"]}, "status_details": {"type": ["string", "null"]}}},
    "FileList": {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "has_more": {"type": "boolean"},
                       "data": {"type": "array", "items": {"$ref": _REF.format(model="FileObject")}}}},
    "FileDeleted": {
        "type": "object", "required": ["id", "object", "deleted"],
        "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "deleted": {"const": True}}},
}
_FILE_ERRORS = {
    "401": _error("No API key, an incorrect one (code invalid_api_key), or a key without the `chat` scope."),
    "404": _error("No file of the caller's tenant has this id."),
    "503": _error("The file store (gateway.files_dir) could not be reached; retry shortly."),
}
_FILE_ID = [{"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}]
FILE_PATHS: dict[str, Any] = {
    "/v1/files": {
        "post": {
            "operationId": "createFile",
            "description": "Upload a file of the caller's tenant: purpose batch, JSONL, at most gateway.max_file_bytes.",
            "requestBody": {"required": True, "content": {"multipart/form-data": {
                "schema": {"$ref": _REF.format(model="FileUpload")}}}},
            "responses": {
                "200": _json("The stored file.", {"$ref": _REF.format(model="FileObject")}),
                "400": _error("Not a multipart form with one `file` and a `purpose` (error.param names the field), "
                              "a purpose other than batch, or a file that is not JSONL (the message names the "
                              "first bad line)."),
                "401": _FILE_ERRORS["401"],
                "413": _error("The file is larger than gateway.max_file_bytes (code request_too_large)."),
                "503": _FILE_ERRORS["503"]}},
        "get": {
            "operationId": "listFiles",
            "parameters": [{"name": "purpose", "in": "query", "required": False,
                            "schema": {"type": "string", "enum": list(PURPOSES)}}],
            "responses": {"200": _json("The tenant's files, newest first.", {"$ref": _REF.format(model="FileList")}),
                          "400": _error("An unknown purpose."), "401": _FILE_ERRORS["401"],
                          "503": _FILE_ERRORS["503"]}}},
    "/v1/files/{file_id}": {
        "parameters": _FILE_ID,
        "get": {"operationId": "retrieveFile",
                "responses": {"200": _json("The file.", {"$ref": _REF.format(model="FileObject")}),
                              **_FILE_ERRORS}},
        "delete": {"operationId": "deleteFile",
                   "responses": {"200": _json("Deleted.", {"$ref": _REF.format(model="FileDeleted")}),
                                 **_FILE_ERRORS}}},
    "/v1/files/{file_id}/content": {
        "parameters": _FILE_ID,
        "get": {"operationId": "downloadFile",
                "responses": {"200": {"description": "The file's content, as uploaded or written.",
                                      "content": {"application/jsonl": {"schema": {"type": "string"}}}},
                              **_FILE_ERRORS}}},
}


def _user_message_required(schema: dict[str, Any]) -> None:
    """`messages` must hold a user message with text; JSON Schema says so with `contains`."""
    text = {"type": "string", "pattern": r"\S"}
    schema["properties"]["messages"].update({"minItems": 1, "contains": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"const": "user"}, "content": {"anyOf": [text, {
            "type": "array", "contains": {"type": "object", "required": ["type", "text"],
                                          "properties": {"type": {"const": "text"}, "text": text}}}]}}}})


def _user_input_required(schema: dict[str, Any]) -> None:
    """`input` is a string with text, or items among which a user message with text (a message item
    may leave out its `type`)."""
    text = {"type": "string", "pattern": r"\S"}
    schema["properties"]["input"] = {"anyOf": [text, {"type": "array", "contains": {
        "type": "object", "required": ["role", "content"],
        "properties": {"type": {"const": "message"}, "role": {"const": "user"}, "content": {"anyOf": [text, {
            "type": "array", "contains": {"type": "object", "required": ["type", "text"],
                                          "properties": {"type": {"const": "input_text"}, "text": text}}}]}}},
        "items": schema["properties"]["input"]["anyOf"][1]["items"]}]}


def _batch_schemas(schemas: dict[str, Any]) -> None:
    schemas["BatchCreate"] = {
        "type": "object", "required": ["input_file_id", "endpoint", "completion_window"], "additionalProperties": False,
        "properties": {"input_file_id": {"type": "string", "minLength": 1},
                       "endpoint": {"enum": ["/v1/chat/completions", "/v1/responses"]}, "completion_window": {"const": "24h"},
                       "metadata": {"type": ["object", "null"], "maxProperties": 16,
                                    "additionalProperties": {"type": "string", "maxLength": 512}}}}
    schemas["Batch"] = {
        "type": "object", "required": ["id", "object", "endpoint", "input_file_id", "status", "request_counts"],
        "properties": {"id": {"type": "string"}, "object": {"const": "batch"}, "endpoint": {"type": "string"},
                       "input_file_id": {"type": "string"},
                       "status": {"enum": ["validating", "in_progress", "finalizing", "completed", "failed",
                                           "cancelling", "cancelled", "expired"]},
                       "output_file_id": {"type": ["string", "null"]}, "error_file_id": {"type": ["string", "null"]},
                       "request_counts": {"type": "object", "required": ["total", "completed", "failed"]}}}
    schemas["BatchList"] = {
        "type": "object", "required": ["object", "data", "has_more"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": _REF.format(model="Batch")}},
                       "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                       "has_more": {"type": "boolean"}}}


def _batch_paths() -> dict[str, Any]:
    """`/v1/batches` and its operations (baton_gateway.batches_routes)."""
    batch = {"$ref": _REF.format(model="Batch")}
    unknown = _error("No batch of the caller's tenant has this id.")
    batch_id = [{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "/v1/batches": {
            "post": {"operationId": "createBatch",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": _REF.format(model="BatchCreate")}}}},
                     "responses": {"200": _json("The batch, validating.", batch),
                                   "400": _error("A bad parameter, or an input file line that breaks a rule (the "
                                                 "message names the line)."),
                                   "401": ERRORS["401"],
                                   "404": _error("No file of the caller's tenant with this id and purpose batch."),
                                   "413": ERRORS["413"],
                                   "429": _error("The tenant has max_open_batches batches running (code batch_limit)."),
                                   "503": ERRORS["503"]}},
            "get": {"operationId": "listBatches",
                    "parameters": [{"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
                                   {"name": "limit", "in": "query", "required": False,
                                    "schema": {"type": "integer", "minimum": 1, "maximum": 100}}],
                    "responses": {"200": _json("The tenant's batches, newest first.",
                                               {"$ref": _REF.format(model="BatchList")}),
                                  "400": _error("limit is not an integer from 1 to 100."), "401": ERRORS["401"]}}},
        "/v1/batches/{batch_id}": {"parameters": batch_id, "get": {
            "operationId": "getBatch",
            "responses": {"200": _json("The batch.", batch), "401": ERRORS["401"], "404": unknown}}},
        "/v1/batches/{batch_id}/cancel": {"parameters": batch_id, "post": {
            "operationId": "cancelBatch",
            "responses": {"200": _json("The batch, cancelling (or as it ended, if it had).", batch),
                          "401": ERRORS["401"], "404": unknown, "503": ERRORS["503"]}}},
    }


def openapi_document(models: set[str] | frozenset[str] = frozenset({DEFAULT_POLICY_NAME})) -> dict[str, Any]:
    _, top = models_json_schema([(ChatCompletionRequest, "validation"), (FeedbackIn, "validation"),
                                 (ResponsesRequest, "validation")], ref_template=_REF)
    schemas: dict[str, Any] = top["$defs"]
    _user_message_required(schemas["ChatCompletionRequest"])
    _user_input_required(schemas["ResponsesRequest"])
    # The policies this gateway serves now (the default and every published version); whether a key
    # may use one is its tenant's policy (404 model_not_found otherwise).
    for request in ("ChatCompletionRequest", "ResponsesRequest"):
        schemas[request]["properties"]["model"] = {
            "type": "string", "enum": sorted(models), "description": "The policy: 'baton' or a published version."}
    schemas["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
    schemas["ChatCompletion"] = {
        "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "message", "finish_reason"]}},
            "usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]},
            "baton": {"type": "object", "description": "The workflow: plan, per-step worker, tokens, cost, latency."}}}
    schemas["Response"] = {
        "type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
        "properties": {
            "id": {"type": "string"}, "object": {"const": "response"}, "created_at": {"type": "integer"},
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]}, "model": {"type": "string"},
            "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
            "usage": {"type": ["object", "null"]},
            "baton": {"type": "object", "description": "The workflow: plan, per-step worker, tokens, cost, latency."}}}
    schemas["ResponseDeleted"] = {
        "type": "object", "required": ["id", "object", "deleted"],
        "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}}
    schemas["ModelList"] = {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
            "type": "object", "required": ["id", "object"],
            "properties": {"id": {"type": "string"}, "object": {"const": "model"}}}}}}
    schemas["FeedbackAccepted"] = {
        "type": "object", "required": ["object", "response_id", "accepted"],
        "properties": {"object": {"const": "feedback"}, "response_id": {"type": "string"},
                       "accepted": {"const": True}}}
    schemas.update(FILE_SCHEMAS)
    _batch_schemas(schemas)

    def ref(name: str) -> dict:
        return {"$ref": _REF.format(model=name)}

    public: dict[str, list] = {"security": []}
    health = {"get": {**public, "responses": {
        "200": _json("Healthy.", {"type": "object"}), "503": _json("Not ready.", {"type": "object"})}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Baton gateway", "version": "1",
                 "description": "OpenAI-compatible chat completions, responses and files; errors have OpenAI's shape "
                                "and status codes."},
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "A tenant's API key."}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": {"post": {
                "operationId": "createChatCompletion",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("ChatCompletionRequest")}}},
                "responses": {
                    "200": {"description": "The answer; with `stream: true`, OpenAI chat.completion.chunk events.",
                            "content": {"application/json": {"schema": ref("ChatCompletion")},
                                        "text/event-stream": {"schema": {  # each event, as SSE parsers read it
                                            "type": "object", "required": ["data"],
                                            "properties": {"data": {"type": "string"}}}}}},
                    **ERRORS, **IDEMPOTENCY_ERRORS, **WORKFLOW_ERRORS}}},
            "/v1/responses": {"post": {
                "operationId": "createResponse",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("ResponsesRequest")}}},
                "responses": {
                    "200": {"description": "The response; with `stream: true`, OpenAI's typed response events.",
                            "content": {"application/json": {"schema": ref("Response")},
                                        "text/event-stream": {"schema": {
                                            "type": "object", "required": ["data"],
                                            "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}},
                    **ERRORS, **IDEMPOTENCY_ERRORS, **WORKFLOW_ERRORS}}},
            "/v1/responses/{response_id}": {
                "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "get": {"operationId": "getResponse",
                        "responses": {"200": _json("A response created with store: true.", ref("Response")),
                                      "401": ERRORS["401"], "404": _error("No stored response of the caller's tenant "
                                                                          "has this id.")}},
                "delete": {"operationId": "deleteResponse",
                           "responses": {"200": _json("Deleted.", ref("ResponseDeleted")), "401": ERRORS["401"],
                                         "404": _error("No stored response of the caller's tenant has this id."),
                                         "503": ERRORS["503"]}}},
            "/v1/models": {"get": {
                "operationId": "listModels",
                "responses": {"200": _json("The policies the caller may use.", ref("ModelList")),
                              "401": ERRORS["401"]}}},
            "/v1/feedback": {"post": {
                "operationId": "createFeedback",
                "description": "A score for an answer; needs a key with the `feedback` scope.",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("FeedbackIn")}}},
                "responses": {"202": _json("Accepted.", ref("FeedbackAccepted")),
                              **{c: ERRORS[c] for c in ("400", "401", "413", "429", "503")}}}},
            **FILE_PATHS,
            **_batch_paths(),
            "/health/live": health,
            "/health/ready": health,
        },
    }
