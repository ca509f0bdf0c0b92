"""`baton up --only NAME` restarts one service of a running stack, as `up` started it."""

from __future__ import annotations

import json
import subprocess
import sys

from baton_tools import cli
from baton_tools.procs import alive, free_port, http_ok, stop_groups


def test_up_only_restarts_one_service_and_records_its_new_process(tmp_path, write_config, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "health").mkdir()
    (run_dir / "health" / "ready").write_text("ok")
    port = free_port()
    # A stand-in service: any process that answers /health/ready on its port will do.
    args = [str(port), "--bind", "127.0.0.1", "--directory", str(run_dir)]
    old = subprocess.Popen([sys.executable, "-m", "http.server", *args], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = {"bootstrap_servers": "127.0.0.1:1", "kafka_pidfile": None, "gateway_port": port,
             "config_file": str(write_config()), "dataset_dir": str(tmp_path / "data"),
             "services": [{"name": "gateway", "module": "http.server", "port": port, "args": args, "pid": old.pid,
                           "log": str(run_dir / "logs" / "gateway.log")}]}
    (run_dir / "stack.json").write_text(json.dumps(state))
    monkeypatch.setattr(cli, "RUN_DIR", run_dir)
    new_pid = None
    try:
        assert cli.main(["up", "--only", "nope"]) == 2
        assert "gateway" in capsys.readouterr().err, "an unknown name lists the stack's services"
        assert cli.main(["up", "--only", "gateway"]) == 0
        new_pid = json.loads((run_dir / "stack.json").read_text())["services"][0]["pid"]
        assert new_pid != old.pid
        old.wait(5)
        assert alive(new_pid) and http_ok(f"http://127.0.0.1:{port}/health/ready")
    finally:
        for pid in (old.pid, new_pid):
            if pid and alive(pid):
                stop_groups([pid], timeout=5)


def test_up_only_without_a_running_stack_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "RUN_DIR", tmp_path)
    assert cli.main(["up", "--only", "gateway"]) == 1
    assert "no stack is running" in capsys.readouterr().err
