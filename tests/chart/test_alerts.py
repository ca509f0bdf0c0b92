"""The chart's alerts: the rules file passes promtool's checks and its unit tests
(alerts_test.yaml: each alert fires on the series that should raise it, none on a healthy hour), and
the PrometheusRule the chart renders carries exactly that file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from chartlib import CHART, by_kind, render

HERE = Path(__file__).parent
RULES = CHART / "alerts" / "baton-rules.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make promtool` installs it (Debian's prometheus package)"
    return found


def test_the_rules_pass_promtool_check_and_their_unit_tests():
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool(), "test", "rules", "alerts_test.yaml"], cwd=HERE, capture_output=True, text=True)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert alerts == fired


def test_the_chart_renders_the_rules_file_as_a_prometheus_rule():
    (rule,) = by_kind(render(sets=("prometheusRule.enabled=true", "prometheusRule.labels.release=kps")),
                      "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert not by_kind(render(), "PrometheusRule")
