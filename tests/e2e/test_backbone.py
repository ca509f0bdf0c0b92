"""Every service as its own process on a real Kafka broker, driven with the official OpenAI client."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from pathlib import Path

import httpx
import openai
import pyarrow.dataset as ds
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from testbed import default_config_data, episode_of, first_question, running_stack, wait_for, wait_for_episodes

from baton_platform import topics
from baton_platform.apikeys import hash_key
from baton_tools.standins.server import run_standin
from e2e.otlp import OtlpReceiver

CALLER_KEY = "caller-key-7f3a9c"           # what clients send to the gateway
DRAFT_CHECK = r"(?s)\[local-model\] saw: .*Check the first draft.*"
PROVIDER_KEY = "sk-provider-secret-51d2e8"  # what the executor sends to the local provider


@pytest.fixture(scope="module")
def standin():
    """An OpenAI-compatible server (speaking the real wire format) that echoes what it was sent;
    stopped even when the tests using it fail."""
    with run_standin("openai", mode="subprocess", require_key=PROVIDER_KEY) as url:
        yield url


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, standin, tmp_path_factory):
    receiver = OtlpReceiver()
    data = default_config_data()
    data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                            "base_url": standin, "api_key_env": "LOCAL_LLM_KEY",
                            "card": "A local OpenAI-compatible server."})
    for w in data["workers"]:
        if w.get("sim"):
            w["fallback"] = "local-llm"  # as in the default pool: a question no matrix holds still runs
    data["conductor"]["plan"] = {
        "workers": ["gemini-flash", "llama-70b", "local-llm"],
        "subtasks": ["Solve it.", "Solve it independently.", "Check the first draft and answer."],
        "access": [[], [], [0]],
    }
    data["kafka"] = {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    data["gateway"] = {"auth": "keys"}
    data["tenants"] = [{"name": "team", "keys": [{"sha256": hash_key(CALLER_KEY), "scopes": ["chat", "feedback", "eval"]}]},
                       {"name": "others"}]
    run_dir = tmp_path_factory.mktemp("stack")
    # The operator's evaluation set for this suite: the draft check below is graded by a pattern.
    (run_dir / "checks.csv").write_text("id,grader,reference\n"
                                        f"draft-check,regex,{DRAFT_CHECK}\n")
    data["reward_logger"]["eval_sets"]["checks"] = {"path": "checks.csv"}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on",
           "OTEL_BSP_SCHEDULE_DELAY": "200", "BATON_API_KEYS": f"others:{hash_key('other-key')}",
           "LOCAL_LLM_KEY": PROVIDER_KEY}
    try:
        with running_stack(data, run_dir, kafka_bootstrap, env=env) as st:
            st.receiver = receiver
            yield st
    finally:
        receiver.close()


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=stack.base_url, api_key=CALLER_KEY, max_retries=0, timeout=60)


def test_an_answer_comes_back_through_every_service_in_one_trace(stack, client):
    row = first_question()
    raw = client.chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": row["prompt"]}],
        metadata={"baton_eval": "checks:draft-check"})
    completion = raw.parse()
    request_id = raw.headers["x-baton-request-id"]
    assert "steps=3" in raw.headers["x-baton-workflow"]
    answer = completion.choices[0].message.content
    # The last step (the local server) saw its instruction and step 1's output, which is the sim
    # worker's recorded answer for this question; it never saw step 2's.
    flash = f"The answer is ({row['gemini-1.5-flash-002|answer']})."
    assert answer.startswith("[local-model] saw:")
    assert "Check the first draft and answer." in answer and flash in answer
    assert "Solve it independently." not in answer
    info = completion.model_extra["baton"]
    assert [s["worker"] for s in info["steps"]] == ["gemini-flash", "llama-70b", "local-llm"]
    assert info["calls"] == 3 and info["cost_usd"] > 0
    assert completion.usage.total_tokens == sum(s["input_tokens"] + s["output_tokens"] for s in info["steps"])

    wanted = {"baton-gateway", "baton-router", "baton-synthesizer", "baton-executor-sim",
              "baton-executor-openai_compatible", "baton-reward-logger"}

    def trace_of_request():
        ids = {s["trace_id"] for s in stack.receiver.spans
               if s["attributes"].get("baton.request_id") and s["attributes"]["baton.request_id"].string_value == request_id}
        return [t for t in ids if wanted <= stack.receiver.services_by_trace()[t]]

    assert wait_for(trace_of_request, 20), (
        f"no trace spans all services; seen: {dict(stack.receiver.services_by_trace())}")
    (trace_id,) = trace_of_request()
    names = {(s["service"], s["name"]) for s in stack.receiver.spans if s["trace_id"] == trace_id}
    assert ("baton-executor-openai_compatible", "POST") in names or any(
        svc == "baton-executor-openai_compatible" and n.startswith("POST") for svc, n in names), names
    check_gen_ai_conventions(stack.receiver, trace_id)

    ep = wait_for(lambda: episode_of(stack.dataset_dir, request_id), 20)
    assert ep is not None, "the episode never reached the dataset"
    assert ep["answer"] == answer and ep["calls"] == 3 and ep["tenant"] == "team"
    assert (ep["grader"], ep["quality"], ep["reward"]) == ("regex", 1.0, 1.0), ep["reward_detail"]
    assert ep["reference"] == DRAFT_CHECK
    assert [s["worker"] for s in ep["steps"]] == ["gemini-flash", "llama-70b", "local-llm"]


def check_gen_ai_conventions(receiver, trace_id: str) -> None:
    """The request's trace in OpenTelemetry's GenAI terms: one `invoke_workflow baton` span over its
    plan, a `chat {model}` client span per step under it, and the reward logger's grade as a
    `gen_ai.evaluation.result` event."""
    def spans():
        return [s for s in receiver.spans if s["trace_id"] == trace_id]

    assert wait_for(lambda: any(s["events"] for s in spans()), 10), "no evaluation event in the trace"
    by_id = {s["span_id"]: s for s in spans()}
    (workflow,) = [s for s in spans() if s["name"] == "invoke_workflow baton"]
    assert workflow["service"] == "baton-synthesizer"
    assert workflow["attributes"]["gen_ai.operation.name"].string_value == "invoke_workflow"
    assert workflow["attributes"]["baton.outcome"].string_value == "answer"

    def under_workflow(span) -> bool:
        while span is not None:
            if span is workflow:
                return True
            span = by_id.get(span["parent"])
        return False

    chats = [s for s in spans() if s["name"].startswith("chat ")]
    assert sorted(s["attributes"]["gen_ai.request.model"].string_value for s in chats) == [
        "Meta-Llama-3_1-70B-Instruct", "gemini-1.5-flash-002", "local-model"], [s["name"] for s in chats]
    for chat in chats:
        attrs = chat["attributes"]
        assert chat["kind"] == 3 and under_workflow(chat), chat  # SPAN_KIND_CLIENT
        assert attrs["gen_ai.operation.name"].string_value == "chat"
        assert attrs["gen_ai.provider.name"].string_value in ("sim", "openai_compatible")
        assert attrs["gen_ai.usage.input_tokens"].int_value > 0 and attrs["gen_ai.usage.output_tokens"].int_value > 0
        assert attrs["gen_ai.response.model"].string_value
    (grade,) = [a for s in spans() if s["service"] == "baton-reward-logger"
                for name, a in s["events"] if name == "gen_ai.evaluation.result"]
    assert grade["gen_ai.evaluation.name"].string_value == "regex"
    assert grade["gen_ai.evaluation.score.value"].double_value == 1.0
    assert grade["gen_ai.evaluation.score.label"].string_value == "pass"


def test_streaming_returns_openai_chunks_with_usage(stack, client):
    stream = client.chat.completions.create(model="baton", stream=True, stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": first_question()["prompt"]}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("[local-model] saw:")
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    # Workflow progress rides along as SSE comments, which the client above never saw.
    body = {"model": "baton", "stream": True, "messages": [{"role": "user", "content": first_question()["prompt"]}]}
    with httpx.stream("POST", stack.base_url + "/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {CALLER_KEY}"}) as r:
        lines = [line for line in r.iter_lines() if line]
    progress = [line for line in lines if line.startswith(": baton step")]
    assert ": baton step 1/3 gemini-flash started" in progress
    assert ": baton step 3/3 local-llm completed" in progress
    assert lines[-1] == "data: [DONE]"


def test_models_and_bad_requests(stack, client):
    assert [m.id for m in client.models.list().data] == ["baton"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="baton", messages=[])
    assert "at least one message" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:  # 404, as OpenAI answers an unknown model
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"
    big = httpx.post(stack.base_url + "/chat/completions", content=b"x" * 1_100_000,
                     headers={"content-type": "application/json", "authorization": f"Bearer {CALLER_KEY}"})
    assert big.status_code == 413 and "larger than" in big.json()["error"]["message"]
    for path in ("/health/live", "/health/ready"):
        assert httpx.get(stack.base_url.removesuffix("/v1") + path).status_code == 200
    # Every tenant's spend is on the metrics port only, never where the API (and an Ingress) is.
    assert httpx.get(stack.base_url.removesuffix("/v1") + "/metrics").status_code == 404
    assert httpx.get(stack.gateway_metrics_url).status_code == 200


def test_an_idle_client_connection_outlives_the_clients_own_expiry(stack):
    """httpx (the openai client's transport) drops an idle connection after 5 s. A gateway that closed
    it at 5 s too could close it just as the client sent a request on it: the client got "server
    disconnected without sending a response". One raw keep-alive connection, idle for 6 s, still serves."""
    host, port = stack.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for idle_s in (6, 0):
            # http.client reads the whole response, however the server split it into segments
            conn.request("GET", "/health/live")
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read() == b'{"status":"live"}'
            if idle_s:
                first = conn.sock
                time.sleep(idle_s)
        assert conn.sock is first, "the client opened a new connection: the first one was closed"
    finally:
        conn.close()


async def test_malformed_records_go_to_the_dead_letter_topic_and_consumers_go_on(stack, client):
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap_servers)
    consumer = AIOKafkaConsumer(topics.DLQ, bootstrap_servers=stack.bootstrap_servers, auto_offset_reset="earliest",
                                group_id=None)
    await producer.start()
    await consumer.start()
    poisoned = [topics.REQUESTS, topics.WORKFLOW, topics.tasks_topic("sim"), topics.RESPONSES]
    try:
        for t in poisoned:
            await producer.send_and_wait(t, b"\xff\xfe not protobuf \x00", key=b"poison-" + t.encode())
        seen = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not set(poisoned) <= set(seen):
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for r in records:
                    if r.key and r.key.startswith(b"poison-"):
                        headers = dict(r.headers)
                        seen[r.key.decode().removeprefix("poison-")] = headers[topics.DLQ_REASON_HEADER].decode()
    finally:
        await producer.stop()
        await consumer.stop()
    assert set(poisoned) <= set(seen), f"dead letters seen for {sorted(seen)}"
    assert all("not a valid baton.v1." in reason for reason in seen.values()), seen
    # The responses topic is read by two groups; each dead-letters its copy. Everyone still works:
    completion = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "Still there?"}])
    assert completion.choices[0].message.content.startswith("[local-model] saw:")


def test_callers_need_a_key_and_no_key_ever_shows(stack, client):
    wrong = openai.OpenAI(base_url=stack.base_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.chat.completions.create(model="baton", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "invalid_api_key"
    missing = httpx.post(stack.base_url + "/chat/completions", json={"model": "baton", "messages": []})
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["error"]["message"]
    assert httpx.get(stack.base_url + "/models").status_code == 401
    client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "once more"}])
    time.sleep(1)  # let the services' span exporters flush
    logs = "".join(p.read_text(errors="replace") for p in (stack.run_dir / "logs").glob("*.log"))
    spans = json.dumps([{k: str(v) for k, v in s.items()} for s in stack.receiver.spans])
    for secret in (CALLER_KEY, PROVIDER_KEY):
        assert secret not in logs and secret not in spans


def test_every_service_logs_json_lines_joined_to_the_trace_of_the_request_it_handles(stack, client):
    """One JSON object per line in every service's log; the lines written while a request is handled
    carry its trace id; the prompt's text is in no line."""
    marker = "zebra-marmalade-4417"
    raw = client.chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": f"{marker}: how many legs has a spider?"}])
    request_id = raw.headers["x-baton-request-id"]
    assert raw.parse().choices[0].message.content

    def trace_id():
        return next((s["trace_id"] for s in stack.receiver.spans if s["attributes"].get("baton.request_id")
                     and s["attributes"]["baton.request_id"].string_value == request_id), None)

    wanted = wait_for(trace_id, 20)
    assert wanted, "no span names the request"
    services = ("gateway", "router", "synthesizer", "executor-sim-0", "executor-openai_compatible-0", "reward-logger")

    def lines(name):
        return [json.loads(line) for line in (stack.run_dir / "logs" / f"{name}.log").read_text().splitlines() if line]

    def joined():
        return {name: [line for line in lines(name) if line.get("trace_id") == wanted] for name in services}

    assert wait_for(lambda: all(joined().values()), 20), {n: len(v) for n, v in joined().items()}
    for name, mine in joined().items():
        assert all(line["service"].startswith("baton-") and line["level"] and line["time"] for line in mine), name
        assert any(request_id in line["event"] for line in mine), (name, mine)
    logs = "".join(p.read_text() for p in (stack.run_dir / "logs").glob("*.log") if p.name != "kafka.log")
    assert marker not in logs


async def test_feedback_and_published_policies_reach_the_suite(stack, client):
    from baton.v1 import feedback_pb2, policy_pb2

    consumer = AIOKafkaConsumer(topics.FEEDBACK, bootstrap_servers=stack.bootstrap_servers,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        r = httpx.post(stack.base_url + "/feedback", json={"response_id": "chatcmpl-r42", "score": 0.5},
                       headers={"authorization": f"Bearer {CALLER_KEY}"})
        assert r.status_code == 202
        bad = httpx.post(stack.base_url + "/feedback", json={"response_id": "r42", "score": 9},
                         headers={"authorization": f"Bearer {CALLER_KEY}"})
        assert bad.status_code == 400 and "score" in bad.json()["error"]["message"]
        async def ours():  # the topic may hold other tests' feedback: the session shares the broker
            while (record := await consumer.getone()).key != b"r42":
                pass
            return record

        record = await asyncio.wait_for(ours(), 20)
        fb = feedback_pb2.Feedback.FromString(record.value)
        assert (record.key, fb.response_id, fb.score, fb.tenant) == (b"r42", "r42", 0.5, "team")
    finally:
        await consumer.stop()
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap_servers)
    await producer.start()
    try:
        update = policy_pb2.PolicyUpdate(name="baton", version="baton-v2", kind="fast", uri="file:///policies/v2")
        await producer.send_and_wait(topics.POLICY, update.SerializeToString(), key=b"baton")
    finally:
        await producer.stop()
    assert wait_for(lambda: "baton-v2" in [m.id for m in client.models.list().data], 20)

    def feedback_rows():
        root = stack.dataset_dir / "feedback"
        if not any(root.rglob("*.parquet")):
            return []
        return [r for r in ds.dataset(root, format="parquet", partitioning="hive").to_table().to_pylist()
                if r["response_id"] == "r42"]

    (row,) = wait_for(feedback_rows, 20)
    assert (row["score"], row["tenant"]) == (0.5, "team"), "the rating names the tenant of the key that sent it"


def test_a_client_cannot_choose_its_grader_or_run_code_through_it(stack, client, tmp_path):
    target = tmp_path / "written-by-the-reward-logger"
    attack = {"grader": "code", "reference": f"open({str(target)!r}, 'w').write('x')"}
    raw = client.chat.completions.with_raw_response.create(
        model="baton", messages=[{"role": "user", "content": first_question()["prompt"]}], metadata=attack)
    request_id = raw.headers["x-baton-request-id"]
    ordinary = client.chat.completions.create(
        model="baton", messages=[{"role": "user", "content": first_question()["prompt"]}],
        metadata={"baton_eval": "checks:draft-check"})

    ids = {request_id, ordinary.model_extra["baton"]["request_id"]}
    found = {r["request_id"]: r for r in wait_for_episodes(stack.dataset_dir, ids, 30)}
    assert found.keys() == ids, "both episodes were logged"
    attacked = found[request_id]
    assert (attacked["grader"], attacked["reference"], attacked["quality"], attacked["reward"]) == (None, None, None, None)
    assert "ignored" in attacked["reward_detail"]
    assert not target.exists(), "the client's reference never ran"
    assert found[ordinary.model_extra["baton"]["request_id"]]["quality"] == 1.0


def test_every_metric_the_dashboard_and_alerts_name_is_exported(stack, client):
    """A dashboard panel or an alert on a metric no service exports shows nothing and never fires:
    every name the chart's dashboard and rules use is in some service's /metrics after traffic."""
    client.chat.completions.create(model="baton", messages=[{"role": "user", "content": first_question()["prompt"]}])
    exported: set[str] = set()
    for svc in stack.services:
        if svc.argv is not None:
            continue  # a model server, not a Baton service
        text = httpx.get(svc.metrics_url, timeout=10).text
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                exported.add(name)
                if kind == "histogram":
                    exported.update(f"{name}_{part}" for part in ("bucket", "count", "sum"))
            elif line and not line.startswith("#"):
                exported.add(line.split("{")[0].split(" ")[0])
    chart = Path(__file__).parents[2] / "charts" / "baton"
    named = {"dashboard": (chart / "dashboards" / "baton.json").read_text(),
             "alerts": (chart / "alerts" / "baton-rules.yaml").read_text()}
    for where, text in named.items():
        used = set(re.findall(r"\b(?:baton|gen_ai)_[a-z0-9_]+\b", text))
        assert used, where
        assert used <= exported, f"{where} names metrics no service exports: {sorted(used - exported)}"
