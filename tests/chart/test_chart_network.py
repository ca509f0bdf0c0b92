"""What the chart lets through by default: NetworkPolicies are on and restrict egress, so every Baton
pod reaches DNS, Kafka and nothing else on the internet, except the executors, which reach provider
APIs on TCP 443; the gateway's /metrics (every tenant's spend) is on a port of its own, which the
Ingress never routes, the ServiceMonitor scrapes, and only metricsFrom peers and the console reach.

Policies add up: a pod may send what any policy selecting it allows, so each check takes the union
of the rules of every policy whose selector matches the pod's labels."""

from __future__ import annotations

import pytest
from chartlib import CHART, LOCAL_VALUES, baton_config, by_kind, pod_labels, pod_spec, render

DEFAULT = str(CHART / "ci" / "default-values.yaml")
THREE = str(CHART / "ci" / "three-providers-values.yaml")
# Values a production install starts from: the chart's own (no file), and the examples.
DEFAULTS = [(), (DEFAULT,), (THREE,)]
ANYWHERE = ("0.0.0.0/0", "::/0")


def selects(selector: dict, labels: dict) -> bool:
    """Whether a LabelSelector matches `labels` (matchLabels and the matchExpressions operators)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def workloads_by_component(objects) -> dict[str, dict]:
    """Each workload (Deployments, the trainer's CronJob, the topics Job) by its component label."""
    return {pod_labels(o)["app.kubernetes.io/component"]: o for o in objects if pod_spec(o) is not None}


def rules_for(objects, labels: dict, direction: str) -> list[dict] | None:
    """The `direction` ("egress" or "ingress") rules of every policy selecting a pod with `labels`; None
    when no policy restricts that direction for it (everything is allowed)."""
    kind = direction.capitalize()
    policies = [p["spec"] for p in by_kind(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)]
    restricting = [p for p in policies if kind in p.get("policyTypes", [])]
    if not restricting:
        return None
    return [rule for p in restricting for rule in p.get(direction, [])]


def to_anywhere(rule: dict) -> bool:
    """Whether an egress rule's peers are any address: no `to`, or an ipBlock of the whole internet."""
    peers = rule.get("to")
    return not peers or any(p.get("ipBlock", {}).get("cidr") in ANYWHERE and not p["ipBlock"].get("except")
                            for p in peers)


def allows_port(rule: dict, port: int | str, protocol: str = "TCP") -> bool:
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (port, None) and p.get("protocol", "TCP") == protocol for p in ports)


def https_to_anywhere(objects, labels: dict) -> bool:
    rules = rules_for(objects, labels, "egress")
    return rules is None or any(to_anywhere(r) and allows_port(r, 443) for r in rules)


@pytest.mark.parametrize("values", DEFAULTS, ids=["chart", "default-values", "three-providers"])
def test_by_default_only_the_executors_reach_the_internet_on_443(values):
    # A router whose model is on its volume (offline); one that downloads it: the next test.
    objects = render(values, ("console.enabled=true", "trainer.enabled=true", "router.modelStorage.offline=true"))
    pods = workloads_by_component(objects)
    executors = [c for c in pods if c.startswith("executor-")]
    others = [c for c in pods if not c.startswith("executor-")]
    assert executors and {"gateway", "router", "synthesizer", "reward-logger", "console", "trainer"} <= set(others)
    for component in others:
        assert not https_to_anywhere(objects, pod_labels(pods[component])), f"{component} may reach any address on 443"
    for component in executors:
        assert https_to_anywhere(objects, pod_labels(pods[component])), f"{component} cannot reach its provider"


@pytest.mark.parametrize("values", DEFAULTS, ids=["chart", "default-values", "three-providers"])
def test_by_default_every_pod_reaches_dns_and_kafka_and_no_other_port_anywhere(values):
    objects = render(values, ("console.enabled=true", "router.modelStorage.offline=true"))
    kafka_port = int(baton_config(objects)["kafka"]["bootstrap_servers"].rsplit(":", 1)[1])
    for component, workload in workloads_by_component(objects).items():
        rules = rules_for(objects, pod_labels(workload), "egress")
        assert rules is not None, f"{component}'s egress is not restricted"
        assert any(allows_port(r, 53, "UDP") for r in rules), component
        assert any(allows_port(r, kafka_port) for r in rules), component
        ports = {p["port"] for r in rules if to_anywhere(r) for p in r.get("ports") or [{"port": "any"}]}
        # DNS, Kafka, the OTLP collector (with otel.enabled), and HTTPS for executors only.
        allowed = {53, 9092, 9093, 4317, 4318} | ({443} if component.startswith("executor-") else set())
        assert ports <= allowed, f"{component} may reach {sorted(map(str, ports - allowed))} anywhere"


def test_a_router_that_downloads_its_model_reaches_the_hub_on_443_until_it_is_offline():
    for offline, reaches in (("false", True), ("true", False)):
        objects = render((), ("config.conductor.backend=vllm", f"router.modelStorage.offline={offline}"))
        pods = workloads_by_component(objects)
        assert https_to_anywhere(objects, pod_labels(pods["router"])) is reaches, offline
        assert not https_to_anywhere(objects, pod_labels(pods["gateway"]))


def test_with_egress_unrestricted_no_pod_has_an_egress_policy():
    objects = render((), ("networkPolicy.restrictEgress=false",))
    for component, workload in workloads_by_component(objects).items():
        assert rules_for(objects, pod_labels(workload), "egress") is None, component


def test_extra_egress_is_how_the_router_reaches_a_remote_conductor():
    remote = "networkPolicy.extraEgress[0].to[0].ipBlock.cidr=203.0.113.7/32"
    objects = render((), (remote, "networkPolicy.extraEgress[0].ports[0].port=8443", "router.modelStorage.offline=true"))
    router = pod_labels(workloads_by_component(objects)["router"])
    rules = rules_for(objects, router, "egress")
    assert any(r.get("to") == [{"ipBlock": {"cidr": "203.0.113.7/32"}}] and allows_port(r, 8443) for r in rules)
    assert not https_to_anywhere(objects, router)


def gateway_service(objects) -> dict:
    (svc,) = [s for s in by_kind(objects, "Service") if s["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    return svc


@pytest.mark.parametrize("values", DEFAULTS, ids=["chart", "default-values", "three-providers"])
def test_the_ingress_routes_the_api_port_and_never_the_metrics_port(values):
    objects = render(values, ("gateway.ingress.enabled=true",))
    svc = gateway_service(objects)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(ports) == {"http", "metrics"}
    (gateway,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == svc["metadata"]["name"]]
    container_ports = {p["name"]: p["containerPort"] for p in pod_spec(gateway)["containers"][0]["ports"]}
    config = baton_config(objects)["gateway"]
    assert container_ports == {"http": config["port"], "metrics": config["metrics_port"]}
    assert ports["http"]["targetPort"] == "http" and ports["metrics"]["targetPort"] == "metrics"
    (ingress,) = by_kind(objects, "Ingress")
    backends = [path["backend"]["service"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]]
    assert backends, "the Ingress routes something"
    for backend in backends:
        assert backend["name"] == svc["metadata"]["name"]
        assert backend["port"] in ({"name": "http"}, {"number": ports["http"]["port"]}), backend
        assert backend["port"] not in ({"name": "metrics"}, {"number": ports["metrics"]["port"]})


def test_the_service_monitor_scrapes_the_gateways_metrics_port_and_not_its_api():
    objects = render((), ("serviceMonitor.enabled=true",))
    (monitor,) = by_kind(objects, "ServiceMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert endpoints["metrics"]["path"] == "/metrics"
    assert "metrics" in {p["name"] for p in gateway_service(objects)["spec"]["ports"]}
    # The `http` endpoint (every other service's /metrics) leaves the gateway's API port out.
    dropped = [r for r in endpoints["http"]["relabelings"] if r.get("action") == "drop"]
    assert dropped == [{"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
                        "regex": "gateway", "action": "drop"}]
    others = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in by_kind(objects, "Service")} - {"gateway"}
    assert others and all({p["name"] for p in s["spec"]["ports"]} == {"http"} for s in by_kind(objects, "Service")
                          if s["metadata"]["labels"]["app.kubernetes.io/component"] in others)


def test_the_gateways_metrics_port_admits_only_the_metrics_peers_and_the_console():
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    sets = ("networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",)
    objects = render((), (*sets, "console.enabled=true"))
    gateway = pod_labels(workloads_by_component(objects)["gateway"])
    console = pod_labels(workloads_by_component(objects)["console"])
    rules = rules_for(objects, gateway, "ingress")
    (metrics,) = [r for r in rules if allows_port(r, "metrics")]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}], "the metrics rule opens nothing else"
    assert prometheus in metrics["from"]
    assert [p for p in metrics["from"] if p != prometheus] == [
        {"podSelector": {"matchLabels": {k: console[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                                                                  "app.kubernetes.io/component")}}}]
    (api,) = [r for r in rules if allows_port(r, "http")]
    assert "from" not in api, "the API is open to clients (allowExternal)"
    # Without the console or metricsFrom peers, nobody reaches the gateway's metrics port.
    alone = render(())
    gateway = pod_labels(workloads_by_component(alone)["gateway"])
    assert not [r for r in rules_for(alone, gateway, "ingress") if allows_port(r, "metrics")]


def test_the_local_clusters_values_allow_what_its_tests_do():
    """tests/k8s call the stand-in provider in the cluster on port 8000 and read the router's /metrics
    through the API server's proxy, from the host's bridge address (tools/k8s/env.sh)."""
    objects = render((str(LOCAL_VALUES),))
    pods = workloads_by_component(objects)
    standin = pod_labels(pods["executor-openai-compatible"])
    rules = rules_for(objects, standin, "egress")
    assert any(allows_port(r, 8000) and any(selects(p.get("podSelector", {}), {"app": "baton-standin"})
                                           for p in r.get("to", [])) for r in rules)
    router = rules_for(objects, pod_labels(pods["router"]), "ingress")
    assert any(allows_port(r, "http") and {"ipBlock": {"cidr": "10.244.0.1/32"}} in r.get("from", []) for r in router)
