"""Paths and config data the tests share (imported by name: conftest modules cannot be)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "config" / "baton.yaml"
ROUTING_DATA = REPO / "data" / "routing"
MMLU_PRO = ROUTING_DATA / "mmlu_pro_dev.csv"



def default_config_data() -> dict:
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    # Tests plan with the fixed plan unless they ask for a model conductor themselves.
    data["conductor"]["backend"] = "static"
    for w in data["workers"]:
        if w.get("sim"):
            w["sim"]["dataset"] = str(MMLU_PRO)
    # Tests write the config elsewhere: the evaluation sets' relative paths would not follow it.
    for eval_set in data.get("reward_logger", {}).get("eval_sets", {}).values():
        eval_set["path"] = str((DEFAULT_CONFIG.parent / eval_set["path"]).resolve())
    return data
