"""values.yaml is documented and in step with values.schema.json, whose `config` part is the
configuration model's own schema; the dashboard charts metrics the services really export; NOTES.txt
and the README tell an operator how to reach the gateway."""

from __future__ import annotations

import json
import re
import shutil

import jsonschema
import pytest
import yaml
from chartlib import CHART, NAMESPACE, RELEASE, ROOT, run_helm, template_args

from baton_platform.config_schema import with_config_schema

# The first test to need Helm builds it from source (about five minutes on two cores).
pytestmark = pytest.mark.timeout(1800)

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Keys the schema allows that values.yaml leaves unset on purpose (documented in the README).
OPTIONAL_KEYS = {"minAvailable", "claims"}
# The configuration file's fields are documented by the model (descriptions in its schema).
CONFIG = "config"


def undocumented_keys(text: str) -> list[str]:
    """Keys of mappings (not inside list items, not inside `config`) without a `# --` comment right above them."""
    lines = text.splitlines()
    stack: list[tuple[int, bool, str]] = []  # indent, is a list item, key
    missing = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stripped.startswith("- "):
            stack.append((indent, True, ""))
            continue
        match = re.match(r"([A-Za-z_][\w.-]*):", stripped)
        if not match:
            continue
        key = match.group(1)
        if not any(is_item for _, is_item, _ in stack) and not (stack and stack[0][2] == CONFIG):
            j = i - 1
            comments = []
            while j >= 0 and lines[j].strip().startswith("#"):
                comments.append(lines[j].strip())
                j -= 1
            if not any(c.startswith("# --") for c in comments):
                missing.append(".".join([k for _, _, k in stack] + [key]))
        stack.append((indent, False, key))
    return missing


def test_every_value_is_documented():
    assert undocumented_keys(VALUES_TEXT) == []


def test_the_documentation_check_finds_a_bare_key():
    assert undocumented_keys("# -- ok\na: 1\nb:\n  # -- ok\n  c: 2\n  d: 3\n") == ["b", "b.d"]
    assert undocumented_keys("# -- ok\nconfig:\n  kafka:\n    partitions: 3\nc:\n  d: 1\n") == ["c", "c.d"]


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].split("/")[-1]]
    return node


def schema_drift(values, schema: dict, path: str = "") -> list[str]:
    """Keys in values.yaml the schema lacks, and schema properties values.yaml lacks. `config` sets only
    some of the model's fields (the rest keep the code's defaults); the schema checks it on its own."""
    schema = _resolve(schema)
    problems = []
    if isinstance(values, dict) and "properties" in schema:
        for key, sub in values.items():
            if not path and key == CONFIG:
                continue
            if key not in schema["properties"]:
                if schema.get("additionalProperties", True) is False:
                    problems.append(f"{path}{key}: in values.yaml, not in the schema")
                continue
            problems += schema_drift(sub, schema["properties"][key], f"{path}{key}.")
        for key in schema["properties"]:
            if key not in values and key not in OPTIONAL_KEYS and not (not path and key == CONFIG):
                problems.append(f"{path}{key}: in the schema, not in values.yaml")
    return problems


def test_schema_is_in_step_with_values():
    assert schema_drift(VALUES, SCHEMA) == []


def test_executor_entries_accept_every_default_key():
    entry = SCHEMA["properties"]["executors"]["additionalProperties"]
    assert entry == SCHEMA["properties"]["executorDefaults"], "an executor entry must be able to override every executorDefaults key"


def test_the_config_schema_is_the_models_own():
    assert with_config_schema(SCHEMA) == SCHEMA, (
        "values.schema.json is stale: run `python -m baton_platform.config_schema charts/baton/values.schema.json`")
    assert SCHEMA["properties"]["config"]["additionalProperties"] is False


def test_values_and_examples_validate_against_the_schema():
    validator = jsonschema.Draft202012Validator(SCHEMA)
    validator.check_schema(SCHEMA)
    assert [e.message for e in validator.iter_errors(VALUES)] == []


def test_schema_rejects_a_misspelt_key():
    validator = jsonschema.Draft202012Validator(SCHEMA)
    bad = {**VALUES, "gateway": {**VALUES["gateway"], "replicas": 3}}
    assert any("replicas" in e.message for e in validator.iter_errors(bad))
    # The configuration too: the model forbids unknown fields, and so does its schema.
    bad = {**VALUES, "config": {**VALUES["config"], "gateway": {**VALUES["config"]["gateway"], "request_timeout": 5}}}
    assert any("request_timeout" in e.message for e in validator.iter_errors(bad))


def test_the_staleness_check_sees_a_field_the_schema_lacks():
    stale = json.loads(json.dumps(SCHEMA))
    del stale["$defs"]["config.GatewayConfig"]["properties"]["max_messages"]
    assert with_config_schema(stale) != stale


# -- dashboard ----------------------------------------------------------------------------------------

REQUIRED_METRICS = {
    "baton_gateway_requests", "baton_gateway_request_seconds", "baton_plans", "baton_planning_seconds",
    "baton_steps_dispatched", "baton_responses", "baton_workflows_running", "baton_executor_steps",
    "baton_executor_tokens", "baton_executor_cost_usd", "baton_executor_step_seconds", "baton_dlq_messages",
    "baton_dataset_rows", "baton_consumer_lag",
}


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART / "dashboards" / "baton.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = set()
    for expr in exprs:
        for name in re.findall(r"\b(baton_[a-z_]+)\b", expr):
            names.add(re.sub(r"_(total|bucket|sum|count)$", "", name))
    return names


def declared_metrics() -> set[str]:
    """Metric names the services declare (prometheus_client constructors' first argument)."""
    names = set()
    for source in [*ROOT.glob("services/*/**/*.py"), *ROOT.glob("libs/*/**/*.py")]:
        names |= set(re.findall(r"(?:Counter|Gauge|Histogram|Summary)\(\s*\"(baton_[a-z_]+)\"", source.read_text()))
    return names


def test_dashboard_shows_every_metric_named_in_the_contract():
    assert REQUIRED_METRICS <= dashboard_metrics()


def test_dashboard_queries_only_metrics_the_services_export():
    assert dashboard_metrics() - declared_metrics() == set()


def test_dashboard_config_map_carries_the_sidecar_label():
    out = run_helm(*template_args(sets=("dashboard.enabled=true",))).stdout
    (cm,) = [d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["baton.json"])["uid"] == "baton-overview"


# -- notes and readme -----------------------------------------------------------------------------------


def render_notes(tmp_path, sets: tuple[str, ...]) -> str:
    """NOTES.txt as `helm install` prints it. `helm install --dry-run` wants a cluster, so a copy of
    the chart renders the notes into a ConfigMap instead."""
    chart = tmp_path / "baton"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        "data:\n  notes: {{ tpl (.Files.Get \"notes.txt\") . | quote }}\n")
    args = template_args(sets=sets)
    args[2] = str(chart)
    docs = [d for d in yaml.safe_load_all(run_helm(*args).stdout) if d]
    (notes,) = [d["data"]["notes"] for d in docs if d["metadata"]["name"] == "notes"]
    return notes


@pytest.mark.parametrize(("sets", "expected"), [
    ((), f"kubectl port-forward -n {NAMESPACE} svc/{RELEASE}-baton-gateway 8080:8080"),
    (("gateway.ingress.enabled=true",), "http://baton.example.com/v1"),
    (("gateway.service.type=LoadBalancer",), "loadBalancer.ingress"),
])
def test_notes_tell_how_to_reach_the_gateway(tmp_path, sets, expected):
    notes = render_notes(tmp_path, sets)
    assert expected in notes
    assert "OpenAI" in notes and 'model="baton"' in notes
    assert "baton-gateway-api-keys" in notes


def test_readme_has_the_install_guide():
    readme = (CHART / "README.md").read_text()
    section = readme.split("## Install on Kubernetes", 1)[1]
    for topic in ("Prerequisites", "kubectl create secret", "helm install", "OpenAI(", "KEDA", "partitions"):
        assert topic in section, f"the install guide does not cover {topic!r}"
