"""The 'openai' conductor against a local server that speaks the Chat Completions wire format."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testbed import default_config_data, pool

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import BatonConfig
from baton_router.conductor import ConductorOutputError, build_backend
from baton_router.conductor.openai_backend import ConductorServerError
from baton_workflow import plan_problems

PLAN = '{"model_id": [1, 0], "subtasks": ["Solve it step by step.", "Check and answer."], "access_list": [[], [0]]}'
API_KEY = "sk-conductor-test-0123456789"


def completion(text: str, logprobs: list[float], finish: str = "stop") -> dict:
    # Split the text into as many pieces as there are log-probs, as a server's tokens would.
    step = max(1, math.ceil(len(text) / len(logprobs)))
    tokens = [text[i:i + step] for i in range(0, len(text), step)]
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "conductor-7b",
        "choices": [{
            "index": 0, "finish_reason": finish,
            "message": {"role": "assistant", "content": text},
            "logprobs": {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                     for t, lp in zip(tokens, logprobs)]},
        }],
        "usage": {"prompt_tokens": 300, "completion_tokens": len(tokens), "total_tokens": 300 + len(tokens)},
    }


class ChatServer:
    """Answers POST /v1/chat/completions with queued (status, body) replies and records every request."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.replies: list[tuple[int, dict | str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                status, reply = outer.replies.pop(0)
                data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def server():
    s = ChatServer()
    s.thread.start()
    yield s
    s.server.shutdown()
    s.server.server_close()


@pytest.fixture
def conductor(server, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_KEY", API_KEY)
    data = default_config_data()
    data["conductor"] = {"backend": "openai", "max_steps": 4, "openai": {
        "base_url": server.base_url + "/", "model": "conductor-7b", "api_key_env": "CONDUCTOR_KEY",
        "temperature": 0.8, "timeout_s": 5, "policy_models": {"v2": "conductor-7b-lora-v2"}}}
    config = BatonConfig(**data)
    return build_backend(*pool(config)), [w.name for w in config.workers]


def ask(policy: str = "baton") -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="q1", policy=policy, messages=[
        common_pb2.ChatMessage(role="user", content="What is the capital of Australia?")])


async def test_a_plan_comes_back_with_the_servers_token_log_probs(server, conductor):
    backend, names = conductor
    server.replies.append((200, completion(PLAN, [-0.1, -0.02, -1.5, -0.3])))
    proposal = await backend.propose(ask())
    await backend.aclose()
    assert proposal.plan.workers == ["gemini-flash", "gemini-pro"]
    assert proposal.plan.subtasks == ["Solve it step by step.", "Check and answer."]
    assert plan_problems(proposal.plan, names, 4) == []
    assert proposal.token_logprobs == [-0.1, -0.02, -1.5, -0.3]
    assert proposal.policy_version == "conductor-7b"
    assert proposal.propensity == 0.0, "a server does not say with which probability it sampled"
    assert proposal.log_propensity is None, "unknown, not a number"

    (sent,) = server.requests
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == f"Bearer {API_KEY}"
    body = sent["body"]
    assert body["model"] == "conductor-7b" and body["logprobs"] is True and body["temperature"] == 0.8
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["properties"]["model_id"]["maxItems"] == 4
    # The pool's workers, then the conductor itself (recursion is on by default).
    assert schema["properties"]["model_id"]["items"]["maximum"] == len(names)
    assert schema["properties"]["model_id"]["minItems"] == 1, "a user's request needs a plan with steps"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Model 0: " in body["messages"][0]["content"]
    assert not any(n in json.dumps(body["messages"]) for n in names)


async def test_an_inner_call_sees_the_workflow_so_far_and_may_keep_the_answer(server, conductor):
    backend, names = conductor
    server.replies.append((200, completion('{"model_id": [], "subtasks": [], "access_list": []}', [-0.2, -0.1])))
    inner = ask()
    inner.parent.CopyFrom(requests_pb2.Parent(
        request_id="q1", task_id="q1:1:1", step=1, attempt=1, depth=1, last_answer="Sydney",
        steps=[requests_pb2.PriorStep(worker=names[2], instruction="Name the capital.", output="Sydney")]))
    proposal = await backend.propose(inner)
    await backend.aclose()
    assert proposal.plan.steps == 0 and proposal.token_logprobs == [-0.2, -0.1]
    body = server.requests[0]["body"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["model_id"]["minItems"] == 0, "an inner call may keep the answer"
    question = body["messages"][1]["content"]
    # The workflow so far is shown with models by index, like the pool; the depth limit is reached.
    assert "[Step 0] Model 2: Name the capital." in question and "Its last answer: Sydney" in question
    assert f"Model {len(names)} (the conductor) may not be used here" in question
    assert not any(n in json.dumps(body["messages"]) for n in names)


async def test_a_policy_name_selects_its_served_model(server, conductor):
    backend, _ = conductor
    server.replies += [(200, completion(PLAN, [-0.5])), (200, completion(PLAN, [-0.5]))]
    assert (await backend.propose(ask("v2"))).policy_version == "conductor-7b-lora-v2"
    assert (await backend.propose(ask("unknown"))).policy_version == "conductor-7b"
    await backend.aclose()
    assert [r["body"]["model"] for r in server.requests] == ["conductor-7b-lora-v2", "conductor-7b"]


async def test_a_server_error_becomes_a_clear_exception(server, conductor):
    backend, _ = conductor
    server.replies.append((400, {"error": {"message": "model 'conductor-7b' does not exist",
                                           "type": "invalid_request_error", "code": "model_not_found"}}))
    server.replies.append((503, "upstream overloaded"))
    server.replies.append((200, {"object": "error"}))
    with pytest.raises(ConductorServerError, match=r"HTTP 400: model 'conductor-7b' does not exist"):
        await backend.propose(ask())
    with pytest.raises(ConductorServerError, match=r"HTTP 503: upstream overloaded"):
        await backend.propose(ask())
    with pytest.raises(ConductorServerError, match="no chat completion"):
        await backend.propose(ask())
    await backend.aclose()


async def test_an_unreachable_server_and_a_cut_off_plan_are_reported(server, conductor):
    backend, _ = conductor
    server.replies.append((200, completion(PLAN[:40], [-0.2, -0.4], finish="length")))
    with pytest.raises(ConductorOutputError, match="not JSON") as err:
        await backend.propose(ask())
    assert err.value.token_logprobs == [-0.2, -0.4], "the sampled tokens' log-probs survive a parse failure"
    server.server.shutdown()
    server.server.server_close()
    with pytest.raises(ConductorServerError, match="unreachable"):
        await backend.propose(ask())
    await backend.aclose()


async def test_a_missing_api_key_is_named():
    data = default_config_data()
    data["conductor"] = {"backend": "openai", "openai": {"base_url": "http://127.0.0.1:9/v1", "model": "m",
                                                         "api_key_env": "BATON_TEST_NO_SUCH_KEY"}}
    with pytest.raises(ValueError, match="BATON_TEST_NO_SUCH_KEY"):
        build_backend(*pool(BatonConfig(**data)))
