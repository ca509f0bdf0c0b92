"""One Kafka identity per service in the chart (kafka.users): each pod connects as its own user with its
own Secret, Strimzi KafkaUsers carry exactly the ACL table of baton_platform.acls, and without Strimzi
the topics Job creates those ACLs. The chart's copy of the table is kept current here."""

from __future__ import annotations

from chartlib import CHART, CI_VALUES, by_kind, pod_spec, render

from baton_platform import acls

SASL = ("config.kafka.security_protocol=SASL_SSL", "config.kafka.sasl_mechanism=SCRAM-SHA-512",
        "config.kafka.sasl_username=admin", "config.kafka.sasl_password_env=KAFKA_PASSWORD",
        "kafka.sasl.existingSecret=kafka-admin", "kafka.users.enabled=true", "trainer.enabled=true")
THREE_PROVIDERS = next(str(f) for f in CI_VALUES if f.name == "three-providers-values.yaml")
_OPERATIONS = {"Read": "read", "Write": "write", "IdempotentWrite": "idempotent-write"}


def test_the_charts_copy_of_the_acl_table_is_current():
    assert (CHART / "files" / "kafka-acls.json").read_text() == acls.chart_table(), \
        "regenerate it: python -m baton_platform.acls --chart charts/baton/files/kafka-acls.json"


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _workloads(objects):
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None:
            yield obj, spec["containers"][0], spec


def test_each_service_connects_as_its_own_user_with_its_own_secret():
    objects = render((THREE_PROVIDERS,), SASL)
    users = {}
    for obj, container, _ in _workloads(objects):
        env = _env(container)
        if obj["kind"] == "Job":  # the topics Job: config.kafka's own (admin) user, and it creates the ACLs
            assert "BATON_KAFKA__SASL_USERNAME" not in env
            assert env["KAFKA_PASSWORD"]["secretKeyRef"]["name"] == "kafka-admin"
            assert "--acls" in container["command"]
            continue
        user = env["BATON_KAFKA__SASL_USERNAME"]
        assert env["KAFKA_PASSWORD"]["secretKeyRef"] == {"name": user, "key": "password"}
        users[obj["metadata"]["name"]] = user
    assert len(set(users.values())) == len(users), users
    providers = {w["provider"] for w in _config_workers(objects)}
    assert set(users.values()) == set(acls.table(sorted(providers)))


def _config_workers(objects):
    from chartlib import baton_config

    return baton_config(objects)["workers"]


def test_strimzi_users_carry_exactly_the_acl_table():
    objects = render((THREE_PROVIDERS,), SASL + ("kafka.users.strimzi=true", "topics.strimzi.enabled=true"))
    providers = sorted({w["provider"] for w in _config_workers(objects)})
    rendered = set()
    for user in by_kind(objects, "KafkaUser"):
        assert user["spec"]["authentication"]["type"] == "scram-sha-512"
        for acl in user["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            (operation,) = acl["operations"]
            rendered.add(acls.Grant(f"User:{user['metadata']['name']}", resource["type"],
                                    resource.get("name", "kafka-cluster"), _OPERATIONS[operation],
                                    resource.get("patternType", "literal")))
    assert rendered == set(acls.grants(providers))
    assert not by_kind(objects, "Job"), "Strimzi makes the topics and the users: no Job"


def test_mutual_tls_mounts_each_pods_own_certificate():
    objects = render((THREE_PROVIDERS,), ("config.kafka.security_protocol=SSL", "kafka.users.enabled=true",
                                          "kafka.users.authentication=tls"))
    for obj, container, spec in _workloads(objects):
        if obj["kind"] == "Job":
            continue
        env = _env(container)
        assert env["BATON_KAFKA__SSL_CERTFILE"] == "/etc/baton-kafka-user/user.crt"
        (volume,) = [v for v in spec["volumes"] if v["name"] == "kafka-user"]
        assert volume["secret"]["secretName"].startswith("baton-")
        assert any(m["name"] == "kafka-user" for m in container["volumeMounts"])
