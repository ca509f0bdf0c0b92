"""What the rendered objects promise an operator: one executor per provider with its own autoscaler,
health probes, locked-down pods, disruption budgets, and a configuration the services accept."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from chartlib import CHART, RELEASE, SERVICE_COMMANDS, baton_config, by_kind, pod_labels, pod_spec, render

from baton_platform import topics
from baton_platform.config import load_config

# The first test to need Helm builds it from source (about five minutes on two cores).
pytestmark = pytest.mark.timeout(1800)

THREE = str(CHART / "ci" / "three-providers-values.yaml")
CPU_ONLY = str(CHART / "ci" / "cpu-only-values.yaml")
DEFAULT = str(CHART / "ci" / "default-values.yaml")
KEDA_SASL = str(CHART / "ci" / "keda-sasl-values.yaml")
SECRETISH = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|HEADERS", re.I)


def workloads(objects) -> list[dict]:
    return [o for o in objects if pod_spec(o) is not None]


def executors(objects) -> dict[str, dict]:
    """Executor Deployments by provider."""
    return {d["metadata"]["labels"]["baton.dev/provider"]: d for d in by_kind(objects, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"].startswith("executor-")}


def container(obj: dict) -> dict:
    (c,) = pod_spec(obj)["containers"]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


# -- one executor per provider ---------------------------------------------------------------------


def test_three_providers_give_three_executors_each_with_its_own_hpa():
    objects = render((THREE,))
    execs = executors(objects)
    assert set(execs) == {"openai", "anthropic", "gemini"}
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in by_kind(objects, "HorizontalPodAutoscaler")}
    for provider, deployment in execs.items():
        name = deployment["metadata"]["name"]
        assert name in hpas, f"executor {provider} has no HPA"
        assert "replicas" not in deployment["spec"], "an autoscaled Deployment must leave replicas to the HPA"
        assert container(deployment)["args"][:2] == ["--provider", provider]
    assert hpas[execs["openai"]["metadata"]["name"]]["spec"]["maxReplicas"] == 12
    assert not by_kind(objects, "ScaledObject")


def test_with_keda_each_executor_scales_on_the_lag_of_its_own_group_and_topic():
    objects = render((THREE,), ("keda.enabled=true",))
    execs = executors(objects)
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in by_kind(objects, "ScaledObject")}
    assert not [h for h in by_kind(objects, "HorizontalPodAutoscaler")
                if h["spec"]["scaleTargetRef"]["name"] in {d["metadata"]["name"] for d in execs.values()}]
    partitions = baton_config(objects)["kafka"]["partitions"]
    for provider, deployment in execs.items():
        so = scaled[deployment["metadata"]["name"]]
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        meta = trigger["metadata"]
        assert meta["consumerGroup"] == topics.executor_group(provider)
        assert meta["topic"] == topics.tasks_topic(provider)
        assert meta["bootstrapServers"] == baton_config(objects)["kafka"]["bootstrap_servers"]
        assert int(meta["lagThreshold"]) > 0
        assert so["spec"]["maxReplicaCount"] <= partitions


def test_keda_with_sasl_authenticates_by_reference():
    objects = render((KEDA_SASL,))
    (auth,) = by_kind(objects, "TriggerAuthentication")
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert refs["password"]["name"] == "baton-kafka-user"
    assert refs["ca"]["name"] == "baton-kafka-ca"
    for so in by_kind(objects, "ScaledObject"):
        (trigger,) = so["spec"]["triggers"]
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert trigger["metadata"]["sasl"] == "scram_sha512"
        assert trigger["metadata"]["tls"] == "enable"
    # An executor may scale to zero: the 0 in its entry must survive the merge with the defaults.
    gemini = [s for s in by_kind(objects, "ScaledObject") if s["metadata"]["name"].endswith("gemini")]
    assert gemini[0]["spec"]["minReplicaCount"] == 0
    # The pods find the password and the brokers' CA where the configuration says.
    kafka = baton_config(objects)["kafka"]
    for d in by_kind(objects, "Deployment"):
        c = container(d)
        password = env_of(c)[kafka["sasl_password_env"]]["valueFrom"]["secretKeyRef"]
        assert password == {"name": "baton-kafka-user", "key": "password"}
        (ca,) = [m for m in c["volumeMounts"] if m["mountPath"] == kafka["ssl_cafile"]]
        volume = {v["name"]: v for v in pod_spec(d)["volumes"]}[ca["name"]]
        assert volume["secret"]["secretName"] == "baton-kafka-ca"
        assert {"key": "ca.crt", "path": ca["subPath"]} in volume["secret"]["items"]


def test_executors_follow_the_providers_of_the_workers(tmp_path):
    """One executor per provider the configuration's workers use; an `executors` entry only tunes one."""
    values = tmp_path / "sim.yaml"
    values.write_text(yaml.safe_dump({"config": {"workers": [
        {"name": "replay", "provider": "sim", "model": "m", "sim": {"dataset": "/data/m.csv"}}]}}))
    objects = render((str(values),))
    assert set(executors(objects)) == {"sim"}, "the default `openai` entry serves no worker: no executor for it"
    assert {s["metadata"]["name"] for s in by_kind(objects, "Service")} >= {f"{RELEASE}-baton-executor-sim"}
    assert f"{RELEASE}-baton-executor-sim" in {p["metadata"]["name"] for p in by_kind(objects, "PodDisruptionBudget")}


def test_an_executor_can_turn_its_autoscaler_off():
    execs = executors(render((CPU_ONLY,)))
    hpa_targets = {h["spec"]["scaleTargetRef"]["name"] for h in by_kind(render((CPU_ONLY,)), "HorizontalPodAutoscaler")}
    assert execs["openai"]["metadata"]["name"] in hpa_targets
    assert execs["openai_compatible"]["metadata"]["name"] not in hpa_targets
    assert execs["openai_compatible"]["spec"]["replicas"] == 2
    assert execs["openai_compatible"]["metadata"]["name"] == f"{RELEASE}-baton-executor-openai-compatible"


# -- pods -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [DEFAULT, THREE, CPU_ONLY, KEDA_SASL])
def test_services_run_their_console_script_with_health_probes_on_their_port(values):
    objects = render((values,))
    config = baton_config(objects)
    ports = {"gateway": config["gateway"]["port"], "router": config["router"]["port"],
             "synthesizer": config["synthesizer"]["port"], "reward-logger": config["reward_logger"]["port"],
             "executor": config["executor"]["port"], "console": config["console"]["port"]}
    for d in by_kind(objects, "Deployment"):
        c = container(d)
        assert c["command"] == [SERVICE_COMMANDS[c["name"]]]
        port, *more = c["ports"]
        assert port["name"] == "http"
        assert port["containerPort"] == ports[c["name"]], f"{d['metadata']['name']} listens where the config does not"
        # The gateway alone serves /metrics apart from its API; the others serve it on `http`.
        expected = [{"name": "metrics", "containerPort": config["gateway"]["metrics_port"], "protocol": "TCP"}]
        assert more == (expected if c["name"] == "gateway" else [])
        assert c["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}


def test_every_pod_is_non_root_read_only_without_capabilities(ci_file):
    objects = render((ci_file,), ("trainer.enabled=true",))
    for w in workloads(objects):
        spec = pod_spec(w)
        name = f"{w['kind']}/{w['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, name
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp, f"{name}: /tmp must be writable (read-only root filesystem)"
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert "emptyDir" in volumes[tmp[0]["name"]], name


def test_every_container_has_requests_and_a_memory_limit(ci_file):
    for w in workloads(render((ci_file,), ("trainer.enabled=true",))):
        for c in pod_spec(w)["containers"]:
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]), w["metadata"]["name"]
            assert "memory" in res["limits"], w["metadata"]["name"]


def test_every_deployment_has_a_pod_disruption_budget(ci_file):
    objects = render((ci_file,))
    pdbs = [p["spec"]["selector"]["matchLabels"] for p in by_kind(objects, "PodDisruptionBudget")]
    for d in by_kind(objects, "Deployment"):
        labels = pod_labels(d)
        matching = [sel for sel in pdbs if sel.items() <= labels.items()]
        assert len(matching) == 1, f"{d['metadata']['name']} is covered by {len(matching)} PDBs"


def test_a_stopping_gateway_keeps_listening_until_the_service_stops_routing_to_it(tmp_path):
    """Only the gateway takes connections through its Service; the others read Kafka and stop at once."""
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                   for d in by_kind(render((DEFAULT,)), "Deployment")}
    hook = container(deployments.pop("gateway"))["lifecycle"]["preStop"]
    assert hook == {"exec": {"command": ["sleep", "5"]}}
    assert not [name for name, d in deployments.items() if "lifecycle" in container(d)]
    values = tmp_path / "no-sleep.yaml"
    values.write_text(yaml.safe_dump({"gateway": {"preStopSleepSeconds": 0}}))
    (gateway,) = [d for d in by_kind(render((DEFAULT, str(values))), "Deployment") if d["metadata"]["name"].endswith("gateway")]
    assert "lifecycle" not in container(gateway)


def test_gpu_router_by_default_and_no_gpu_anywhere_on_cpu_only():
    default = render((DEFAULT,))
    (router,) = [d for d in by_kind(default, "Deployment") if container(d)["name"] == "router"]
    assert container(router)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "vllm" in container(router)["image"] or "gpu" in container(router)["image"]
    mounts = {m["mountPath"] for m in container(router)["volumeMounts"]}
    assert {"/models", "/dev/shm"} <= mounts
    assert "startupProbe" in container(router)
    cpu = render((CPU_ONLY,))
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(list(cpu))
    assert baton_config(cpu)["conductor"]["backend"] in ("transformers", "policy", "static", "openai")


def test_a_dataset_in_object_storage_needs_no_volume():
    objects = render((THREE,), ("config.reward_logger.dataset_dir=s3://baton/episodes",))
    assert baton_config(objects)["reward_logger"]["dataset_dir"] == "s3://baton/episodes"
    assert f"{RELEASE}-baton-episodes" not in {c["metadata"]["name"] for c in by_kind(objects, "PersistentVolumeClaim")}
    assert f"{RELEASE}-baton-episodes" in {c["metadata"]["name"] for c in by_kind(render((THREE,)), "PersistentVolumeClaim")}
    (cron,) = by_kind(objects, "CronJob")
    for w in (reward_logger(objects), cron):
        assert "episodes" not in {v["name"] for v in pod_spec(w)["volumes"]}


def test_the_openai_conductor_gets_its_key_from_a_secret(tmp_path):
    values = tmp_path / "conductor.yaml"
    values.write_text(yaml.safe_dump({
        "config": {"conductor": {"backend": "openai", "vllm": None, "openai": {
            "base_url": "http://vllm.llm.svc:8000/v1", "model": "qwen", "api_key_env": "CONDUCTOR_API_KEY"}}},
        "router": {"gpu": {"enabled": False}, "conductorApiKey": {"existingSecret": "conductor", "existingSecretKey": "key"}}}))
    objects = render((THREE, str(values)))
    (router,) = [d for d in by_kind(objects, "Deployment") if container(d)["name"] == "router"]
    ref = env_of(container(router))["CONDUCTOR_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "conductor", "key": "key"}


def test_trainer_is_a_cronjob_that_reads_the_episode_dataset():
    objects = render((THREE,))
    (cron,) = by_kind(objects, "CronJob")
    spec = pod_spec(cron)
    assert spec["restartPolicy"] == "Never"
    c = spec["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    dataset = baton_config(objects)["reward_logger"]["dataset_dir"]
    assert any(m["mountPath"] == dataset and m.get("readOnly") for m in c["volumeMounts"])
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_console_is_off_by_default_and_when_on_reads_the_dataset_read_only_with_the_gateways_keys():
    assert not [d for d in by_kind(render((DEFAULT,)), "Deployment") if container(d)["name"] == "console"]
    objects = render((THREE,), sets=("console.enabled=true",))
    (console,) = [d for d in by_kind(objects, "Deployment") if container(d)["name"] == "console"]
    c = container(console)
    assert c["command"] == ["baton-console"] and c["ports"][0]["containerPort"] == baton_config(objects)["console"]["port"]
    dataset = baton_config(objects)["reward_logger"]["dataset_dir"]
    assert [m for m in c["volumeMounts"] if m["name"] == "episodes"] == [
        {"name": "episodes", "mountPath": dataset, "readOnly": True}]
    (gateway,) = [d for d in by_kind(objects, "Deployment") if container(d)["name"] == "gateway"]
    assert env_of(c)["BATON_API_KEYS"] == env_of(container(gateway))["BATON_API_KEYS"], "admin keys are the gateway's"
    assert any(s["metadata"]["name"] == console["metadata"]["name"] for s in by_kind(objects, "Service"))


def test_the_console_reads_the_refusals_from_the_gateway_service_or_the_prometheus_named():
    objects = render((THREE,), sets=("console.enabled=true", "networkPolicy.enabled=true",
                                     "networkPolicy.allowExternal=false", "networkPolicy.restrictEgress=true"))
    (console,) = [d for d in by_kind(objects, "Deployment") if container(d)["name"] == "console"]
    (gateway,) = [s for s in by_kind(objects, "Service") if s["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    url = env_of(container(console))["BATON_CONSOLE__GATEWAY_METRICS_URL"]["value"]
    (metrics_port,) = [p["port"] for p in gateway["spec"]["ports"] if p["name"] == "metrics"]
    assert url == f"http://{gateway['metadata']['name']}.{gateway['metadata']['namespace']}.svc:{metrics_port}/metrics"
    console_pods = pod_labels(console)
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    (metrics_rule,) = [r for r in policies["gateway"]["ingress"] if r["ports"][0]["port"] == "metrics"]
    admitted = [peer["podSelector"]["matchLabels"] for peer in metrics_rule["from"] if "podSelector" in peer]
    assert any(labels.items() <= console_pods.items() for labels in admitted), "the gateway admits the console"
    assert policies["console"]["podSelector"]["matchLabels"].items() <= console_pods.items()
    assert policies["console"]["egress"][0]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    assert policies["console"]["egress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    with_prometheus = render((THREE,), sets=("console.enabled=true", "console.prometheusUrl=http://prometheus:9090"))
    (console,) = [d for d in by_kind(with_prometheus, "Deployment") if container(d)["name"] == "console"]
    env = env_of(container(console))
    assert env["BATON_CONSOLE__PROMETHEUS_URL"]["value"] == "http://prometheus:9090"
    assert "BATON_CONSOLE__GATEWAY_METRICS_URL" not in env


def test_topics_job_is_a_pre_install_hook_running_baton_topics():
    objects = render((DEFAULT,))
    (job,) = by_kind(objects, "Job")
    hooks = job["metadata"]["annotations"]["helm.sh/hook"]
    assert "pre-install" in hooks and "pre-upgrade" in hooks
    c = container(job)
    assert c["command"][0] == "baton-topics"
    # Its config map is a hook too, created first, so it exists before the release's own.
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topics")]
    assert int(cm["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert yaml.safe_load(cm["data"]["baton.yaml"]) == baton_config(objects)


def test_strimzi_topics_match_the_code_topic_plan():
    objects = render((KEDA_SASL,))
    config = baton_config(objects)
    providers = sorted({w["provider"] for w in config["workers"]})
    gateway = config.get("gateway", {})
    counts, configs = topics.topic_plan(config["kafka"]["partitions"], providers,
                                        stored_days=gateway.get("stored_responses_days", 30),
                                        idempotency_hours=gateway.get("idempotency_hours", 24),
                                        replication_factor=config["kafka"]["replication_factor"])
    assert all(c["min.insync.replicas"] == "2" for c in configs.values()), "three replicas: two in sync"
    assert all("retention.ms" in c or c["cleanup.policy"] == "compact" for c in configs.values())
    rendered = {t["spec"]["topicName"]: t["spec"] for t in by_kind(objects, "KafkaTopic")}
    assert {name: spec["partitions"] for name, spec in rendered.items()} == counts
    assert {name: spec["config"] for name, spec in rendered.items() if "config" in spec} == configs
    for t in by_kind(objects, "KafkaTopic"):
        assert t["metadata"]["labels"]["strimzi.io/cluster"] == "baton-kafka"
        assert t["spec"]["replicas"] == 3


# -- configuration and secrets ------------------------------------------------------------------------


def test_config_map_parses_and_lists_the_workers():
    objects = render((THREE,))
    config = baton_config(objects)
    assert [w["name"] for w in config["workers"]] == ["gpt-5", "gpt-5-mini", "claude-sonnet", "gemini-pro", "gemini-flash"]
    claude = config["workers"][2]
    assert claude == {"name": "claude-sonnet", "provider": "anthropic", "model": "claude-sonnet-4-5",
                      "api_key_env": "ANTHROPIC_API_KEY", "limits": {"rpm": 400, "tpm": 400000, "concurrency": 12},
                      "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
                      "card": "Careful reasoning and long-form writing; strong reviewer of drafts.",
                      "fallback": "gpt-5"}
    for section in ("gateway", "router", "synthesizer", "executor", "reward_logger"):
        assert config[section]["host"] == "0.0.0.0", f"{section} would not be reachable in a pod"


def test_no_secret_values_are_rendered(ci_file):
    objects = render((ci_file,), ("otel.enabled=true",))
    assert not by_kind(objects, "Secret"), "the chart takes secrets by reference only"
    for w in workloads(objects):
        for c in pod_spec(w)["containers"]:
            for e in c.get("env", []):
                if SECRETISH.search(e["name"]):
                    assert "secretKeyRef" in e.get("valueFrom", {}), f"{e['name']} in {w['metadata']['name']} is inline"
    for cm in by_kind(objects, "ConfigMap"):
        for text in cm["data"].values():
            for key in re.findall(r"^\s*([a-z_]*(?:key|token|password|secret)[a-z_]*):", text, re.M):
                assert key.endswith("_env"), f"{cm['metadata']['name']} holds {key}: only variable names belong there"


def test_api_keys_come_from_secret_key_refs():
    execs = executors(render((THREE,)))
    expected = {"openai": ("OPENAI_API_KEY", "openai"), "anthropic": ("ANTHROPIC_API_KEY", "anthropic"),
                "gemini": ("GEMINI_API_KEY", "gemini")}
    for provider, (env_name, key) in expected.items():
        env = env_of(container(execs[provider]))
        ref = env[env_name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "baton-provider-keys", "key": key}
        others = set(expected) - {provider}
        assert not any(expected[o][0] in env for o in others), f"executor {provider} must not see other keys"
    assert gateway_env(render((THREE,)))["BATON_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "baton-gateway-api-keys"


def test_the_gateway_requires_tenant_keys_by_default(tmp_path):
    """The chart fills the gateway's key variable from its Secret unless the configuration says `auth:
    none`, and the gateway starts on the rendered tenants with the key entries that Secret holds
    (hashes only: the chart never sees a key)."""
    from baton_gateway.auth import Gatekeeper
    from baton_platform.apikeys import hash_key, key_entry, mint_key
    from baton_platform.config import BatonConfig

    values = tmp_path / "tenants.yaml"
    values.write_text(yaml.safe_dump({"config": {"tenants": [
        {"name": "acme", "models": ["baton"], "requests_per_minute": 60, "tokens_per_minute": 10000, "budget_usd": 12.5},
        {"name": "ops"}]}}))
    objects = render((THREE, str(values)))
    config = baton_config(objects)
    assert "auth" not in config["gateway"], "the code's default, keys, applies"
    key = mint_key()
    loaded = BatonConfig(**config)
    gate = Gatekeeper(loaded.gateway, loaded.tenants, env={"BATON_API_KEYS": key_entry("acme", hash_key(key), ["chat"])})
    assert gate.authenticate(f"Bearer {key}", "chat").tenant == "acme"
    assert gateway_env(objects)["BATON_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "baton-gateway-api-keys"
    # Turning auth off is explicit, and says the gateway listens beyond loopback on purpose.
    open_objects = render((THREE,), ("config.gateway.auth=none", "config.gateway.allow_unauthenticated_network=true",
                                     "gateway.auth.existingSecret="))
    assert "BATON_API_KEYS" not in gateway_env(open_objects)
    assert BatonConfig(**baton_config(open_objects)).gateway.auth == "none"


def gateway_env(objects) -> dict[str, dict]:
    (gateway,) = [d for d in by_kind(objects, "Deployment") if container(d)["name"] == "gateway"]
    return env_of(container(gateway))


def test_otel_points_every_service_at_the_collector():
    objects = render((THREE,))
    for d in by_kind(objects, "Deployment"):
        env = env_of(container(d))
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://opentelemetry-collector.observability.svc:4317"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "grpc"
        assert "deployment.environment=production" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]


def _pod_environment(c: dict) -> dict[str, str]:
    """The variables a container would see: literal values, and a stand-in for each secret."""
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = "stand-in-secret"
    return env


def test_every_service_accepts_the_rendered_configuration(ci_file, tmp_path, monkeypatch):
    """Loads the config map exactly as each pod would (file plus its BATON_* variables) with the
    services' own loader, which rejects unknown keys: chart and code must agree on every field."""
    import asyncio

    from baton_executor.providers.registry import build_workers
    from baton_executor.transport import ProviderClient

    objects = render((ci_file,))
    path = tmp_path / "baton.yaml"
    path.write_text(yaml.safe_dump(baton_config(objects)))
    for d in [*by_kind(objects, "Deployment"), *by_kind(objects, "Job")]:
        c = container(d)
        with monkeypatch.context() as m:
            for name in [n for n in os.environ if n.startswith(("BATON_", "KAFKA_"))]:
                m.delenv(name)
            for name, value in _pod_environment(c).items():
                m.setenv(name, value)
            m.setenv("BATON_CONFIG", str(path))
            config = load_config()
            provider = c["args"][c["args"].index("--provider") + 1] if c["name"] == "executor" else None
            # The sim provider reads its matrix from a volume this machine does not have.
            if provider is not None and provider != "sim":
                client = ProviderClient()
                try:
                    # Raises when the pod lacks a variable one of its workers names for its key.
                    assert build_workers(config.workers, provider, client)
                finally:
                    asyncio.run(client.aclose())


def merged(base, over):
    """Helm's merge of a values file over the defaults: maps merge key by key, null deletes, the rest replaces."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(base.get(key), value)
    return out


def test_the_config_map_is_the_config_value_verbatim(tmp_path):
    """Any field of the code's configuration reaches the services as written, with no copy of it in the chart."""
    from baton_platform.config import BatonConfig

    values = tmp_path / "tuned.yaml"
    tuned = {"config": {
        "conductor": {"max_depth": 0, "inner_plan": {"workers": ["gpt-5"], "subtasks": ["Fix it."], "access": ["all"]}},
        "router": {"explore_share": 0.1, "explore_group_size": 3},
        "synthesizer": {"group_answer": "judge", "max_cost_usd": 0.5},
        "judge": {"worker": "claude-sonnet", "wait_s": 30},
        "kafka": {"linger_ms": 5},
        "reward_logger": {"cost_weight": 2.0}}}
    values.write_text(yaml.safe_dump(tuned))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    three = yaml.safe_load(open(THREE))["config"]
    config = baton_config(render((THREE, str(values))))
    assert config == merged(merged(defaults, three), tuned["config"])
    loaded = BatonConfig(**config)
    assert (loaded.router.explore_share, loaded.judge.worker, loaded.conductor.max_depth) == (0.1, "claude-sonnet", 0)


@pytest.mark.parametrize(("sets", "message"), [
    (("config.conductor.backend=static",), "conductor.plan is required"),
    (("config.synthesizer.group_answer=judge",), "needs a `judge:` section"),
    (("config.judge.worker=nobody",), "is not a configured worker"),
])
def test_rules_of_the_configuration_itself_are_the_services_to_enforce(sets, message):
    """The chart keeps no copy of the configuration's own rules; the services refuse to start on them,
    with the model's message."""
    from pydantic import ValidationError

    from baton_platform.config import BatonConfig

    with pytest.raises(ValidationError, match=re.escape(message)):
        BatonConfig(**baton_config(render((THREE,), sets)))


def reward_logger(objects) -> dict:
    (d,) = [d for d in by_kind(objects, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "reward-logger"]
    return d


def test_evaluation_sets_reach_the_configuration_on_a_volume_of_the_reward_logger(tmp_path, monkeypatch):
    assert "eval_sets" not in baton_config(render((THREE,)))["reward_logger"], "none unless configured"
    values = tmp_path / "evals.yaml"
    values.write_text(yaml.safe_dump({
        "config": {"reward_logger": {"eval_sets": {
            "quiz": {"path": "/etc/baton/eval-sets/quiz.csv"},
            "mmlu_pro": {"path": "/data/routing/mmlu_pro_dev.csv", "grader": "choice"}}}},
        "rewardLogger": {
            "evalSets": {"configMap": "my-eval-sets"},
            "extraVolumes": [{"name": "routing", "persistentVolumeClaim": {"claimName": "routing-data"}}],
            "extraVolumeMounts": [{"name": "routing", "mountPath": "/data/routing", "readOnly": True}]}}))
    objects = render((THREE, str(values)))
    config = baton_config(objects)
    pod = pod_spec(reward_logger(objects))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["eval-sets"]["configMap"]["name"] == "my-eval-sets"
    assert volumes["routing"]["persistentVolumeClaim"]["claimName"] == "routing-data"
    mounts = {m["name"]: m for m in container(reward_logger(objects))["volumeMounts"]}
    assert mounts["eval-sets"] == {"name": "eval-sets", "mountPath": "/etc/baton/eval-sets", "readOnly": True}
    assert mounts["routing"]["mountPath"] == "/data/routing"
    # The reward logger's own loader accepts what the chart wrote.
    path = tmp_path / "baton.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("BATON_CONFIG", str(path))
    loaded = load_config().reward_logger.eval_sets
    assert str(loaded["quiz"].path) == "/etc/baton/eval-sets/quiz.csv" and loaded["mmlu_pro"].grader == "choice"


def test_the_cpu_only_example_grades_with_the_matrix_its_sim_worker_replays():
    objects = render((CPU_ONLY,))
    assert baton_config(objects)["reward_logger"]["eval_sets"]["mmlu_pro"]["path"] == "/data/routing/mmlu_pro_dev.csv"
    assert "/data/routing" in [m["mountPath"] for m in container(reward_logger(objects))["volumeMounts"]]


def test_a_single_pod_keeps_its_budget_through_a_drain_and_the_router_rolls_with_a_surge():
    """A Deployment of one pod gets minAvailable 1 (maxUnavailable 1 would let a drain take its only
    pod); one of several, or autoscaled, keeps maxUnavailable 1. The router's rollout starts the new
    pod before the old one stops, so planning never pauses for a config edit."""
    objects = render((), ("gateway.replicaCount=2", "gateway.autoscaling.enabled=false", "synthesizer.replicaCount=1"))
    budgets = {p["metadata"]["name"].removeprefix(f"{RELEASE}-baton-"): p["spec"]
               for p in by_kind(objects, "PodDisruptionBudget")}
    assert budgets["synthesizer"].get("minAvailable") == 1 and "maxUnavailable" not in budgets["synthesizer"]
    assert budgets["gateway"].get("maxUnavailable") == 1
    (router,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-router")]
    assert router["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
