"""The launcher's knowledge of local model servers, without starting one (the e2e test starts vLLM)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from testbed import default_config_data

from baton_platform.config import load_config
from baton_tools import model_servers
from baton_tools.procs import group_alive, stop_groups
from baton_tools.stack import plan_model_servers

INSTALL = model_servers.VllmInstall(python=Path("vllm-env/bin/python"), default_model=Path("models/smollm2"))


def local_worker(write_config, port=8101, **server):
    data = default_config_data(local_model_port=port)
    (w,) = [w for w in data["workers"] if w.get("local_server")]
    w["local_server"].update(server)
    config = load_config(write_config(data=data))
    return config, config.worker(w["name"])


def test_the_vllm_command_serves_the_worker_at_its_base_url(write_config):
    config, worker = local_worker(write_config, port=5123, max_output_tokens=64)
    argv, env = model_servers.vllm_command(worker, INSTALL)
    assert argv[:3] == [str(INSTALL.python), "-m", "vllm.entrypoints.openai.api_server"]
    flags = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)}
    assert flags["--model"] == str(INSTALL.default_model)
    assert flags["--served-model-name"] == worker.model, "the executor calls the model by the worker's model name"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "5123")
    assert flags["--dtype"] == "float32" and "--enforce-eager" in argv
    assert json.loads(flags["--override-generation-config"]) == {"temperature": 0.0, "max_new_tokens": 64}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert model_servers.served_workers(config) == [worker]


def test_a_configured_model_folder_is_served_instead_of_the_packaged_one(write_config, tmp_path):
    _, worker = local_worker(write_config, model_path=str(tmp_path / "my-model"))
    argv, _ = model_servers.vllm_command(worker, INSTALL)
    assert argv[argv.index("--model") + 1] == str(tmp_path / "my-model")


def test_a_local_server_listens_only_on_loopback(write_config):
    _, worker = local_worker(write_config)
    worker.base_url = "http://10.0.0.5:8000/v1"
    with pytest.raises(ValueError, match="127.0.0.1:PORT"):
        model_servers.listen_address(worker)


def test_a_busy_port_is_reported_before_anything_starts(write_config):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        config, worker = local_worker(write_config, port=s.getsockname()[1])
        with pytest.raises(RuntimeError, match="already in use"):
            plan_model_servers(config, echo=lambda *_: None)


def test_stopping_a_service_stops_the_children_that_outlive_it():
    # Like vLLM's API process, the leader exits first and leaves its engine processes running.
    leader = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; exit 0"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    leader.wait()
    try:
        assert group_alive(leader.pid)
        stop_groups([leader.pid], timeout=5)
        assert not group_alive(leader.pid)
    finally:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the child outlived stop_groups")


def test_the_demo_asks_free_questions_only_where_a_fallback_can_answer_them(write_config):
    from baton_tools.demo import demo_questions

    with_local, _ = local_worker(write_config)
    asked = demo_questions(with_local, 8)
    assert len(asked) == 8 and [q["topic"] for q in asked].count("free question") == 2
    assert all(q["answer"] for q in asked if q["topic"] != "free question"), "matrix questions carry references"
    sims_only = load_config(write_config(data=default_config_data()))
    assert all(q["topic"] != "free question" for q in demo_questions(sims_only, 8))


def test_the_demo_knows_what_the_static_plan_would_have_answered_each_graded_question(write_config):
    import csv
    import sys

    from baton_tools.demo import demo_questions

    config = load_config(write_config(data=default_config_data()))
    assert config.conductor.plan.workers[-1] == "gemini-pro"
    csv.field_size_limit(sys.maxsize)
    with open(config.worker("gemini-pro").sim.dataset, newline="", encoding="utf-8") as f:
        pro = {r["prompt"]: r["gemini-1.5-pro-002"] == "1" for r in csv.DictReader(f)}
    asked = demo_questions(config, 8)
    assert [q["static_right"] for q in asked] == [pro[q["prompt"]] for q in asked]
    assert 0 < sum(q["static_right"] for q in asked) < 8  # the demo's questions are not all one way
