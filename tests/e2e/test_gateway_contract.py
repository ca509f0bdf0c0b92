"""The gateway's contract, against a real stack (every service a process, real Kafka): OpenAI's error
classes through the official client, tenants' limits and spend, and a fuzz run of generated
requests against the OpenAPI schema the gateway serves, after which the stack still answers and no
key shows anywhere."""

from __future__ import annotations

import collections
import json
import re
import time

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from testbed import default_config_data, episode_of, episodes, running_stack, wait_for

from baton_gateway.spend import FLUSH_S
from baton_platform.apikeys import hash_key, mint_key
from baton_tools.procs import alive
from baton_tools.standins.server import run_standin
from e2e.otlp import OtlpReceiver

FUZZ_KEY, LIMITED_KEY, BROKE_KEY, FEEDBACK_KEY = mint_key(), mint_key(), mint_key(), mint_key()
PROVIDER_KEY = "sk-provider-" + mint_key()[3:]
KEYS = {"fuzz": FUZZ_KEY, "limited": LIMITED_KEY, "broke": BROKE_KEY, "feedback": FEEDBACK_KEY,
        "provider": PROVIDER_KEY}
# Generated requests per operation; most are invalid on purpose, and answered at once.
EXAMPLES = {"createChatCompletion": 800, "createResponse": 300, "createFeedback": 300, "listModels": 60,
            "getResponse": 30, "deleteResponse": 30, "createFile": 40, "listFiles": 40, "retrieveFile": 40,
            "downloadFile": 40, "deleteFile": 40, "createBatch": 80, "listBatches": 20, "getBatch": 20,
            "cancelBatch": 20}
RESULTS: list[dict] = []  # every fuzz request: operation, status, body


@pytest.fixture(scope="module")
def standin():
    # The provider behind the one worker requires its key, so the key really travels through the executor.
    with run_standin("openai", mode="subprocess", require_key=PROVIDER_KEY, context_window=10**9) as url:
        yield url


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, standin, tmp_path_factory):
    receiver = OtlpReceiver()
    data = default_config_data()
    data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                            "base_url": standin, "api_key_env": "LOCAL_LLM_KEY",
                            "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}, "card": "A local server."})
    # Two steps, so a request's own cost budget can stop its workflow between them.
    data["conductor"]["plan"] = {"workers": ["local-llm", "local-llm"], "subtasks": ["Answer.", "Check it."],
                                 "access": [[], [0]]}
    data["kafka"] = {"partitions": 2, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["gateway"] = {"auth": "keys", "request_timeout_s": 60}
    data["tenants"] = [
        # The fuzz's hundreds of ratings a minute are not the abuse feedback_per_minute is there for.
        {"name": "fuzz", "feedback_per_minute": 100_000,
         "keys": [{"sha256": hash_key(FUZZ_KEY), "scopes": ["chat", "feedback"]}]},
        {"name": "limited", "models": ["baton"], "requests_per_minute": 1, "keys": [{"sha256": hash_key(LIMITED_KEY)}]},
        {"name": "broke", "budget_usd": 1e-9, "keys": [{"sha256": hash_key(BROKE_KEY)}]},
        {"name": "reviewers"},  # its key comes from the environment, as the chart's Secret gives it
    ]
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on",
           "OTEL_BSP_SCHEDULE_DELAY": "200", "LOCAL_LLM_KEY": PROVIDER_KEY,
           "BATON_API_KEYS": f"reviewers:{hash_key(FEEDBACK_KEY)}:feedback"}
    try:
        with running_stack(data, tmp_path_factory.mktemp("contract"), kafka_bootstrap, env=env) as st:
            st.receiver = receiver
            yield st
    finally:
        receiver.close()


def client(stack, key=FUZZ_KEY):
    return openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)


def ask(c, model="baton", content="What is 2+2?", **kw):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **kw)


def test_openai_client_raises_the_matching_exception_for_each_error(stack):
    answer = ask(client(stack))
    assert answer.choices[0].message.content.startswith("[local-model] saw:")
    with pytest.raises(openai.AuthenticationError) as err:
        ask(client(stack, "bt-wrong"))
    assert err.value.code == "invalid_api_key" and "bt-wrong" not in err.value.message
    with pytest.raises(openai.AuthenticationError, match="Missing scopes: chat"):
        ask(client(stack, FEEDBACK_KEY))
    # Naming an evaluation item needs the eval scope (its reward trains the policy), and a well-formed item.
    with pytest.raises(openai.AuthenticationError, match="Missing scopes: eval"):
        ask(client(stack), metadata={"baton_eval": "quiz:q1"})
    with pytest.raises(openai.BadRequestError) as err:
        ask(client(stack), metadata={"baton_eval": "quiz"})
    assert err.value.param == "metadata.baton_eval"
    with pytest.raises(openai.NotFoundError) as err:
        ask(client(stack), model="gpt-5")
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client(stack).chat.completions.create(model="baton", messages=[])
    with pytest.raises(openai.InternalServerError) as err:  # 502: the workflow ran over the request's own budget
        ask(client(stack), metadata={"baton_max_cost_usd": "0.000000001"})
    assert err.value.status_code == 502 and err.value.code == "budget_exceeded"
    big = httpx.post(stack.base_url + "/chat/completions", content=b"x" * 1_100_000,
                     headers={"authorization": f"Bearer {FUZZ_KEY}"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    # 360 KB of question: within max_body_bytes, but each task of its workflow would carry it again,
    # past the 1 MiB record limit. Refused at once, instead of freezing a router partition.
    with pytest.raises(openai.APIStatusError) as err:
        ask(client(stack), content="x " * 180_000)
    assert err.value.status_code == 413 and err.value.code == "request_too_large" and "each step" in err.value.message
    assert ask(client(stack)).choices[0].message.content, "the stack answers on"
    lost = httpx.get(stack.base_url + "/nothing-here", headers={"authorization": f"Bearer {FUZZ_KEY}"})
    assert lost.status_code == 404 and lost.json()["error"]["message"] == "Invalid URL (GET /v1/nothing-here)"


def test_a_key_over_its_rate_gets_rate_limit_exceeded_with_retry_after(stack):
    limited = client(stack, LIMITED_KEY)
    ask(limited)
    with pytest.raises(openai.RateLimitError) as err:
        ask(limited)
    assert err.value.code == "rate_limit_exceeded" and int(err.value.response.headers["retry-after"]) >= 1
    # The official client waits out Retry-After by itself when allowed to retry; here it is not.
    assert [m.id for m in limited.models.list().data] == ["baton"]


def test_a_tenant_past_its_budget_gets_insufficient_quota(stack):
    broke = client(stack, BROKE_KEY)
    # A hundredth of its budget caps each of its requests: the two-step workflow stops after its first
    # step, which spent more than the whole budget...
    with pytest.raises(openai.InternalServerError) as first:
        ask(broke)
    assert first.value.status_code == 502 and first.value.code == "budget_exceeded"
    # ...so the next call is refused before it runs.
    with pytest.raises(openai.RateLimitError) as err:
        ask(broke)
    assert err.value.code == "insufficient_quota" and err.value.type == "insufficient_quota"


def test_a_spent_budget_stays_spent_when_the_gateway_crashes(stack):
    broke = client(stack, BROKE_KEY)
    for _ in range(3):  # spend it, if an earlier test has not
        try:
            ask(broke)
        except openai.RateLimitError:
            break
        except openai.InternalServerError:
            pass
    time.sleep(FLUSH_S + 1)  # the ledger's total is on baton.spend
    stack.kill("gateway")
    stack.restart("gateway")
    with pytest.raises(openai.RateLimitError) as err:
        ask(broke)
    assert err.value.code == "insufficient_quota" and "has spent its budget" in err.value.message


def test_feedback_needs_the_feedback_scope(stack):
    body = {"response_id": "chatcmpl-x1", "score": 1}
    assert httpx.post(stack.base_url + "/feedback", json=body,
                      headers={"authorization": f"Bearer {LIMITED_KEY}"}).status_code == 401
    assert httpx.post(stack.base_url + "/feedback", json=body,
                      headers={"authorization": f"Bearer {FEEDBACK_KEY}"}).status_code == 202


def test_fuzz_the_gateway_against_its_openapi_schema(stack):
    """Generated requests, valid and invalid, for every operation of the served schema; each response
    is checked against the schema (status documented, body shape, content type) and for a 5xx."""
    api = schemathesis.openapi.from_url(stack.base_url.removesuffix("/v1") + "/openapi.json")

    @api.auth()
    class FuzzKey:  # the tenant's key on every request, so the checks also probe without it and with a wrong one
        def get(self, case, context):
            return FUZZ_KEY

        def set(self, case, data, context):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    for result in api.get_all_operations():
        operation = result.ok()
        examples = EXAMPLES.get(operation.definition.raw.get("operationId"), 10)
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if operation.body else [])
        for mode in modes:

            @settings(max_examples=examples // len(modes), deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            @given(case=operation.as_strategy(generation_mode=mode, auth_storage=api.auth))
            def fuzz(case):  # run within this iteration: the loop's operation and mode are the current ones
                response = case.call(timeout=90)
                RESULTS.append({"operation": operation.label, "mode": mode.value,  # noqa: B023 - see above
                                "status": response.status_code, "body": response.text})
                excluded = [positive_data_acceptance] if across_fields(response) else []
                case.validate_response(response, excluded_checks=excluded)

            fuzz()


# Rules between parameters that JSON Schema cannot state: a schema-valid request may break them, and
# then gets a 400 naming the parameter. Anything else schema-valid must be accepted.
ACROSS_FIELDS = re.compile(
    r"invalid request: ((messages\.\d+|input): tool_call_id .* answers no earlier assistant tool call|"
    r"tool_choice (needs tools|names .* which is not in tools)|parallel_tool_calls needs tools|"
    r"tools: two tools have the same name|top_logprobs needs logprobs: true|"
    r"logit_bias maps token ids to biases from -100 to 100|"
    r"(tools\.\d+(\.function)?\.parameters|response_format\.json_schema\.schema|text\.format\.schema) "
    r"is not a valid JSON Schema)|"
    # The Responses API: a conversation to continue must be stored (state no schema can know).
    r"Previous response with id .* not found\.|"
    # An uploaded batch file is JSONL, which a `format: binary` part cannot state.
    r"file: (line \d+ is not a JSON object|is not UTF-8 text|holds no JSON lines); a batch file is JSONL")


def across_fields(response) -> bool:
    if response.status_code != 400:
        return False
    try:
        return bool(ACROSS_FIELDS.match(response.json()["error"]["message"]))
    except (ValueError, KeyError, TypeError):
        return False


def test_after_the_fuzz_the_stack_answers_and_no_key_shows_anywhere(stack):
    statuses = collections.Counter(r["status"] for r in RESULTS)
    by_operation = collections.Counter(r["operation"] for r in RESULTS)
    print(f"fuzz: {len(RESULTS)} requests; statuses {dict(sorted(statuses.items()))}; {dict(by_operation)}")
    assert len(RESULTS) >= 1000, (statuses, by_operation)
    assert not [s for s in statuses if s >= 500], statuses
    for label in ("POST /v1/chat/completions", "POST /v1/responses", "GET /v1/responses/{response_id}",
                  "DELETE /v1/responses/{response_id}", "POST /v1/feedback", "GET /v1/models", "POST /v1/files",
                  "GET /v1/files", "GET /v1/files/{file_id}", "GET /v1/files/{file_id}/content",
                  "DELETE /v1/files/{file_id}"):
        assert by_operation[label] > 0, f"the fuzz never called {label}: {dict(by_operation)}"
    answered = collections.Counter(r["operation"] for r in RESULTS if r["status"] == 200)
    assert answered["POST /v1/responses"] > 10, "too few generated responses requests got through to a workflow"
    assert statuses[200] > 50, "too few generated requests got through to a workflow"
    for svc in stack.services:
        assert svc.pid and alive(svc.pid), f"{svc.name} is gone; see {svc.log}"

    raw = client(stack).chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": "Still answering?"}])
    request_id = raw.headers["x-baton-request-id"]
    ep = wait_for(lambda: episode_of(stack.dataset_dir, request_id))
    assert ep is not None and ep["answer"] == raw.parse().choices[0].message.content
    assert ep["tenant"] == "fuzz"
    metrics = httpx.get(stack.gateway_metrics_url).text
    assert 'baton_gateway_tenant_requests_total{outcome="answered",tenant="fuzz"}' in metrics
    assert 'baton_gateway_tenant_cost_usd_total{tenant="broke"}' in metrics

    time.sleep(1)  # the services' span exporters flush every 200 ms
    logs = "".join(p.read_text(errors="replace") for p in (stack.run_dir / "logs").glob("*.log"))
    spans = json.dumps([{k: str(v) for k, v in s.items()} for s in stack.receiver.spans])
    rows = json.dumps(episodes(stack.dataset_dir), default=str)
    bodies = "".join(r["body"] for r in RESULTS)
    assert len(stack.receiver.spans) > 100 and len(rows) > 1000
    for name, key in KEYS.items():
        for where, text in (("logs", logs), ("spans", spans), ("episodes", rows), ("responses", bodies)):
            assert key not in text, f"the {name} key shows in the {where}"

