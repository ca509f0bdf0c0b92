"""The chart lints, renders and validates against Kubernetes' schemas for every example values file,
and refuses values that would deploy something broken."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from chartlib import CHART, CI_VALUES, KUBE_VERSION, render, render_error, run_helm
from kubernetes_validate.utils import SchemaNotFoundError

# The first test to need Helm builds it from source (about five minutes on two cores).
pytestmark = pytest.mark.timeout(1800)

# Custom resources the chart can render; kubernetes-validate has no schema for them.
KNOWN_CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"),
}

# Overrides that switch on every optional resource, so each template is validated at least once.
EVERYTHING_ON = (
    "keda.enabled=true",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboard.enabled=true",
    "networkPolicy.enabled=true",
    "networkPolicy.restrictEgress=true",
    "otel.enabled=true",
    "gateway.ingress.enabled=true",
    "gateway.autoscaling.enabled=true",
    # Within the fewest partitions of any values file (the local cluster's 4).
    "gateway.autoscaling.maxReplicas=4",
    "trainer.enabled=true",
    "trainer.gpu.enabled=true",
    "trainer.mountModelStorage=true",
)


def test_the_ci_folder_holds_the_required_examples():
    names = {p.name for p in CI_VALUES}
    assert {"default-values.yaml", "three-providers-values.yaml", "cpu-only-values.yaml"} <= names


def test_helm_lint_strict(ci_file):
    proc = run_helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "-f", ci_file, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_helm_template_renders(ci_file):
    objects = render((ci_file,))
    kinds = {o["kind"] for o in objects}
    assert {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} <= kinds


def _validate(objects) -> list[str]:
    problems = []
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{name}: {path}: {e.message}")
        except SchemaNotFoundError:
            if (obj["apiVersion"], obj["kind"]) not in KNOWN_CUSTOM_KINDS:
                problems.append(f"{name}: no schema for {obj['apiVersion']} {obj['kind']}")
    return problems


def test_every_manifest_is_valid_kubernetes(ci_file):
    assert _validate(render((ci_file,))) == []


def test_every_optional_resource_is_valid_kubernetes(ci_file):
    objects = render((ci_file,), EVERYTHING_ON)
    kinds = {o["kind"] for o in objects}
    assert {"ScaledObject", "ServiceMonitor", "NetworkPolicy", "Ingress", "CronJob", "HorizontalPodAutoscaler"} <= kinds
    assert _validate(objects) == []


def test_strimzi_topics_and_sasl_render_valid(ci_file):
    objects = render((ci_file,), ("topics.strimzi.enabled=true", "config.kafka.security_protocol=SASL_SSL",
                                  "config.kafka.sasl_username=baton", "config.kafka.sasl_password_env=KAFKA_PASSWORD",
                                  "config.kafka.ssl_cafile=/etc/kafka-ca/ca.crt", "kafka.sasl.existingSecret=kafka-user",
                                  "kafka.tls.caSecret=kafka-ca", "keda.enabled=true"))
    kinds = {o["kind"] for o in objects}
    assert {"KafkaTopic", "TriggerAuthentication"} <= kinds
    assert "Job" not in kinds, "the topics Job must give way to Strimzi"
    assert _validate(objects) == []


def test_validator_catches_a_broken_manifest():
    # The validation above is only worth something if it rejects what the API server would.
    (deployment,) = [o for o in render() if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("gateway")]
    broken = {**deployment, "spec": {**deployment["spec"], "replicas": "two", "surprise": True}}
    assert _validate([broken])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("gateway.surprise=1",), "additional properties 'surprise' not allowed"),
        (("config.gateway.surprise=1",), "additional properties 'surprise' not allowed"),
        (("config.conductor.backend=oracle",), "/config/conductor/backend"),
        (("config.kafka.security_protocol=SASL_SSL",), "config.kafka.sasl_username, config.kafka.sasl_password_env"),
        (("config.kafka.security_protocol=SSL", "kafka.tls.caSecret=kafka-ca"), "needs config.kafka.ssl_cafile"),
        (("executorDefaults.autoscaling.maxReplicas=9",), "raise config.kafka.partitions"),
        (("keda.enabled=true", "executorDefaults.keda.maxReplicaCount=20"), "replicas beyond the partition count"),
        (("gateway.replicaCount=9",), "gateway may run 9 replicas"),
        (("config.gateway.host=127.0.0.1",), "config.gateway.host 127.0.0.1 is not reachable"),
        (("router.gpu.enabled=false",), "vllm needs router.gpu.enabled=true"),
        (("router.conductorApiKey.existingSecret=conductor-key",), "needs config.conductor.openai.api_key_env"),
        (("gateway.auth.existingSecret=",), "gateway.auth.existingSecret"),
        (("config.tenants=null",), "at least one entry in config.tenants"),
        (("config.reward_logger.dataset_dir=episodes",), "must be an absolute path"),
        (("config.reward_logger.eval_sets.quiz.path=quiz.csv",), "/etc/baton/quiz.csv is on no volume"),
        (("config.reward_logger.eval_sets.quiz.path=/data/quiz.csv",), "/data/quiz.csv is on no volume"),
        (("rewardLogger.evalSets.configMap=evals", "config.reward_logger.eval_sets.quiz.path=/etc/baton/quiz.csv"),
         "is on no volume"),
        (("config.reward_logger.eval_sets.quiz.grader=oracle", "config.reward_logger.eval_sets.quiz.path=/x"),
         "/config/reward_logger/eval_sets/quiz/grader"),
    ],
)
def test_refuses_values_that_would_deploy_something_broken(sets, message):
    assert message in render_error((), sets)


OPENAI_WORKER = {"name": "w", "provider": "openai", "model": "m", "api_key_env": "OPENAI_API_KEY"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"executors": {"mistral": {}}}, "invalid propertyName 'mistral'"),
        ({"executors": {"openai": {"apiKeys": []}}}, "reads its key from OPENAI_API_KEY"),
        ({"config": {"workers": [{**OPENAI_WORKER, "api_key_env": None}]}}, "needs an API key"),
        ({"config": {"workers": [{**OPENAI_WORKER, "api_key_env": "OTHER_KEY"}]}}, "reads its key from OTHER_KEY"),
        ({"config": {"workers": [{**OPENAI_WORKER, "provider": "anthropic", "api_key_env": "ANTHROPIC_API_KEY"}]}},
         "executors.anthropic.apiKeys sets no such variable"),
    ],
)
def test_refuses_workers_and_executors_that_do_not_fit(tmp_path, values, message):
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(values))
    assert message in render_error((str(override),))
