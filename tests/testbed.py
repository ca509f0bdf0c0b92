"""Paths and config data the tests share (imported by name: conftest modules cannot be)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "config" / "baton.yaml"
ROUTING_DATA = REPO / "data" / "routing"
MMLU_PRO = ROUTING_DATA / "mmlu_pro_dev.csv"



def default_config_data(local_model_port: int | None = None) -> dict:
    """The default configuration for a test. Without `local_model_port` it has only the sim workers
    (no model server to start, and no fallback: a question the matrix lacks fails its step); with it,
    the local model worker is kept, served at that port, and the sim workers fall back to it."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    # Tests plan with the fixed plan unless they ask for a model conductor themselves.
    data["conductor"]["backend"] = "static"
    local = [w["name"] for w in data["workers"] if w.get("local_server")]
    if local_model_port is None:
        data["workers"] = [w for w in data["workers"] if not w.get("local_server")]
    for w in data["workers"]:
        if w.get("sim"):
            w["sim"]["dataset"] = str(MMLU_PRO)
            if local_model_port is None and w.get("fallback") in local:
                del w["fallback"]
        if w.get("local_server"):
            w["base_url"] = f"http://127.0.0.1:{local_model_port}/v1"
    # Tests write the config elsewhere: the evaluation sets' relative paths would not follow it.
    for eval_set in data.get("reward_logger", {}).get("eval_sets", {}).values():
        eval_set["path"] = str((DEFAULT_CONFIG.parent / eval_set["path"]).resolve())
    return data


def episode_of(dataset_dir: Path, request_id: str) -> dict | None:
    """The episode row of one request in a stack's dataset, or None while it is not written yet."""
    import pyarrow.dataset as ds

    try:
        rows = ds.dataset(Path(dataset_dir) / "episodes", format="parquet", partitioning="hive").to_table().to_pylist()
    except (FileNotFoundError, ValueError):
        return None
    return next((r for r in rows if r["request_id"] == request_id), None)


def sandbox_available() -> bool:
    """Whether this machine can build the code grader's sandbox (root and util-linux)."""
    from baton_graders.code import SandboxUnavailable, _sandbox_tools

    try:
        _sandbox_tools()
    except SandboxUnavailable:
        return False
    return True


@contextlib.contextmanager
def running_stack(data: dict, run_dir: Path, bootstrap_servers: str):
    """Every service of `data`'s configuration as its own process on the given broker, the gateway on a
    free port; stopped however the block ends."""
    from baton_tools.stack import Stack
    from baton_tools.procs import free_port

    cfg = Path(run_dir) / "baton.yaml"
    cfg.write_text(yaml.safe_dump(data))
    stack = Stack(run_dir, config_file=cfg, gateway_port=free_port(), bootstrap_servers=bootstrap_servers)
    stack.start(echo=lambda *_: None)
    try:
        yield stack
    finally:
        stack.stop()
