"""`make demo` with a stack `make up` started asks that stack and leaves it running, so the console
shows the demo's traffic; with none, it starts its own."""

import json
from types import SimpleNamespace

from baton_tools import cli


def test_the_demo_asks_the_running_stack_and_starts_nothing(tmp_path, monkeypatch, write_config):
    run = tmp_path / "run"
    run.mkdir()
    (run / "stack.json").write_text(json.dumps({
        "bootstrap_servers": "127.0.0.1:1", "config_file": str(write_config()), "dataset_dir": str(tmp_path / "data"),
        "gateway_port": 18080, "console_port": 19105, "services": []}))
    asked = []
    monkeypatch.setattr(cli, "RUN_DIR", run)
    monkeypatch.setattr("baton_tools.demo.run_demo", lambda url, config, count: asked.append((url, count)))
    monkeypatch.setattr(cli.Stack, "start", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started a stack")))
    assert cli.cmd_demo(SimpleNamespace(questions=3)) == 0
    assert asked == [("http://127.0.0.1:18080/v1", 3)]
    assert (run / "stack.json").exists(), "the running stack is left as it was"
