"""The reward logger on a real broker against answers and references built to hurt it.

A client's own `grader`/`reference` are ignored; the operator's code items run in the sandbox (no
file written, no environment read, no endless loop); math and regex items built to blow up fail or
finish in bounded time; and the ordinary episode published after all of them is still logged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from faststream import TestApp
from testbed import config_for, dataset_rows, ensure_topics, publish, sandbox_available, settle, skip_backlog, tracer

from baton.v1 import common_pb2, requests_pb2, responses_pb2
from baton_platform import topics
from baton_reward_logger.main import create_app

SECRET = "baton-attack-secret-39f1"


def response(rid: str, answer: str, metadata: dict) -> bytes:
    req = requests_pb2.ChatRequest(request_id=rid, policy="baton", created_unix_ms=1_764_000_000_000,
                                   messages=[common_pb2.ChatMessage(role="user", content="q")], metadata=metadata)
    ep = responses_pb2.Episode(request=req)
    ep.plan.steps.add(worker="w", instruction="do")
    return responses_pb2.Response(request_id=rid, answer=answer, episode=ep,
                                  completed_unix_ms=1_764_000_000_500).SerializeToString()


async def test_attacks_neither_escape_nor_stall_and_the_next_episode_is_logged(kafka_bootstrap, write_config,
                                                                               tmp_path, monkeypatch):
    monkeypatch.setenv("BATON_ATTACK_SECRET", SECRET)  # in the reward logger's own environment
    # /tmp is writable by anyone: only the sandbox stands between the code and these files.
    tag = uuid.uuid4().hex[:12]
    client_target, item_target = Path(f"/tmp/baton-client-wrote-{tag}"), Path(f"/tmp/baton-item-wrote-{tag}")
    me = os.getpid()
    items = [
        {"id": "write", "grader": "code", "reference": f"open({str(item_target)!r}, 'w').write('x')"},
        {"id": "environ", "grader": "code", "reference":
            "import os\nseen = b''\n"
            f"for p in ['/proc/1/environ', '/proc/%d/environ' % os.getppid(), '/proc/{me}/environ']:\n"
            "    try:\n        seen += open(p, 'rb').read()\n    except OSError:\n        pass\n"
            f"assert b'{SECRET}' in seen, 'no environment outside the sandbox could be read'\n"},
        {"id": "loop", "grader": "code", "reference": "while True:\n    pass\n", "options": {"timeout": 2}},
        {"id": "deep", "grader": "math", "reference": "1" + "/1" * 5000},
        {"id": "huge", "grader": "math", "reference": "1e999999999"},
        {"id": "backtrack", "grader": "regex", "reference": "(x+x+)+y", "options": {"mode": "search"}},
        {"id": "spaces", "grader": "choice", "reference": "C"},
        {"id": "plain", "grader": "choice", "reference": "C"},
    ]
    evals = tmp_path / "attacks.jsonl"
    evals.write_text("".join(json.dumps(i) + "\n" for i in items))
    await ensure_topics(kafka_bootstrap)
    await skip_backlog(kafka_bootstrap, topics.GROUP_REWARD_LOGGER, topics.RESPONSES)
    data_dir = str(tmp_path / "data")
    config = config_for(write_config, kafka_bootstrap, reward_logger={
        "dataset_dir": data_dir, "flush_every": 1, "flush_interval_s": 0.3, "grading_timeout_s": 8,
        "eval_sets": {"attacks": str(evals)}})
    run = uuid.uuid4().hex[:8]
    records = [
        (f"{run}-client", "x = 1", {"grader": "code", "reference": f"open({str(client_target)!r}, 'w').write('x')"}),
        (f"{run}-write", "x = 1", {"baton_eval": "attacks:write"}),
        (f"{run}-environ", "x = 1", {"baton_eval": "attacks:environ"}),
        (f"{run}-loop", "x = 1", {"baton_eval": "attacks:loop"}),
        (f"{run}-deep", "1", {"baton_eval": "attacks:deep"}),
        (f"{run}-huge", "\\boxed{1e999999999}", {"baton_eval": "attacks:huge"}),
        (f"{run}-backtrack", "x" * 5000, {"baton_eval": "attacks:backtrack"}),
        (f"{run}-spaces", "answer" + " " * 20000 + "x", {"baton_eval": "attacks:spaces"}),
        (f"{run}-unknown", "(C)", {"baton_eval": "attacks:no-such-item"}),
        (f"{run}-plain", "The answer is (C).", {"baton_eval": "attacks:plain"}),
    ]
    # One key: one partition, in this order, so the ordinary record comes after every attack.
    for rid, answer, meta in records:
        await publish(kafka_bootstrap, topics.RESPONSES, run, response(rid, answer, meta))
    ids = {rid for rid, *_ in records}
    try:
        await _run(config, data_dir, run, ids, client_target, item_target)
    finally:
        for target in (client_target, item_target):
            target.unlink(missing_ok=True)


async def _run(config, data_dir, run, ids, client_target, item_target) -> None:
    started = time.monotonic()
    async with TestApp(create_app(config, tracer_provider=tracer())):
        found = {}
        while time.monotonic() - started < 90 and len(found) < len(ids):
            found = {r["request_id"]: r for r in dataset_rows(f"{data_dir}/episodes") if r["request_id"] in ids}
            await settle(0.3)
    assert set(found) == ids, f"missing episodes: {ids - set(found)}"
    assert time.monotonic() - started < 60, "the attacks took longer than their time limits allow"
    ep = {rid.removeprefix(f"{run}-"): r for rid, r in found.items()}

    assert (ep["client"]["grader"], ep["client"]["quality"]) == (None, None) and "ignored" in ep["client"]["reward_detail"]
    assert not client_target.exists()
    assert ep["unknown"]["reward_detail"].startswith("ungraded: unknown eval item")
    for name in ("deep", "huge", "backtrack", "spaces"):
        r = ep[name]
        assert r["quality"] is not None or r["reward_detail"].startswith("grading failed"), r["reward_detail"]
    assert ep["backtrack"]["reward_detail"].startswith("grading failed")
    assert ep["plain"]["quality"] == 1.0, "the ordinary episode after the attacks is graded"
    if sandbox_available():
        assert ep["write"]["quality"] == 0.0 and "Read-only file system" in ep["write"]["reward_detail"]
        assert ep["environ"]["quality"] == 0.0, ep["environ"]["reward_detail"]
        assert ep["loop"]["quality"] == 0.0 and "timed out" in ep["loop"]["reward_detail"]
    else:
        for name in ("write", "environ", "loop"):
            assert ep[name]["quality"] is None and "sandbox" in ep[name]["reward_detail"], "fails closed"
    assert not item_target.exists(), "the operator's code item could not write outside its sandbox"
