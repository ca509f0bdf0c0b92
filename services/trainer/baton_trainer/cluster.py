"""Where Baton acts on the cluster: launching a GPU GRPO Job when enough new episodes have come in.

The decision (`due`) knows nothing of Kubernetes; `KubernetesJobs` is the one adapter that talks
to the API server, through the official `kubernetes` client (in-cluster service account, or a
kubeconfig for development). The CronJob runs `baton-trainer launch-grpo` on a schedule.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from baton_platform.dataset import open_dataset

LAST_RUN_LABEL = "baton.io/episodes"


@dataclass(frozen=True)
class GrpoJobSpec:
    name: str
    namespace: str
    image: str
    args: list[str]
    gpus: int = 1
    service_account: str | None = None
    config_map: str | None = None  # mounted at /etc/baton, BATON_CONFIG points into it
    episodes_claim: str | None = None  # the episode dataset's PVC, mounted read-only at /data/episodes


class JobLauncher(Protocol):
    def episodes_at_last_launch(self, namespace: str) -> int: ...

    def launch(self, spec: GrpoJobSpec, episodes: int) -> str: ...


def count_episodes(root: str | Path) -> int:
    """Rows in the episode dataset at a local path or an fsspec URL (s3://bucket/prefix/episodes)."""
    dataset = open_dataset(root)
    return dataset.count_rows() if dataset is not None else 0


def due(total: int, at_last_launch: int, min_new: int) -> bool:
    return total - at_last_launch >= min_new


class KubernetesJobs:
    """Creates Jobs with the official client; each Job is labelled with the episode count it saw."""

    def __init__(self, api_client=None) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._client = client
        self._batch = client.BatchV1Api(api_client)

    def episodes_at_last_launch(self, namespace: str) -> int:
        jobs = self._batch.list_namespaced_job(namespace, label_selector=LAST_RUN_LABEL)
        counts = [int((j.metadata.labels or {})[LAST_RUN_LABEL]) for j in jobs.items if j.metadata]
        return max(counts, default=0)

    def launch(self, spec: GrpoJobSpec, episodes: int) -> str:
        c = self._client
        mounts, volumes = [], []
        env = []
        if spec.config_map:
            mounts.append(c.V1VolumeMount(name="config", mount_path="/etc/baton", read_only=True))
            volumes.append(c.V1Volume(name="config", config_map=c.V1ConfigMapVolumeSource(name=spec.config_map)))
            env.append(c.V1EnvVar(name="BATON_CONFIG", value="/etc/baton/baton.yaml"))
        if spec.episodes_claim:
            mounts.append(c.V1VolumeMount(name="episodes", mount_path="/data/episodes", read_only=True))
            volumes.append(c.V1Volume(name="episodes", persistent_volume_claim=c.V1PersistentVolumeClaimVolumeSource(
                claim_name=spec.episodes_claim, read_only=True)))
        container = c.V1Container(
            name="grpo", image=spec.image, command=["baton-trainer"], args=spec.args, env=env, volume_mounts=mounts,
            resources=c.V1ResourceRequirements(limits={"nvidia.com/gpu": str(spec.gpus)}),
            security_context=c.V1SecurityContext(run_as_non_root=True, allow_privilege_escalation=False,
                                                 capabilities=c.V1Capabilities(drop=["ALL"])))
        job = c.V1Job(
            api_version="batch/v1", kind="Job",
            metadata=c.V1ObjectMeta(generate_name=f"{spec.name}-", labels={LAST_RUN_LABEL: str(episodes),
                                                                             "app.kubernetes.io/component": "grpo"}),
            spec=c.V1JobSpec(backoff_limit=1, ttl_seconds_after_finished=86400, template=c.V1PodTemplateSpec(
                metadata=c.V1ObjectMeta(labels={"app.kubernetes.io/component": "grpo"}),
                spec=c.V1PodSpec(restart_policy="Never", containers=[container], volumes=volumes,
                                 service_account_name=spec.service_account))))
        created = self._batch.create_namespaced_job(spec.namespace, job)
        assert created.metadata is not None and created.metadata.name  # the API server names what it creates
        return created.metadata.name


def launch_if_due(launcher: JobLauncher, spec: GrpoJobSpec, episodes_dir: str | Path, min_new: int) -> dict:
    total = count_episodes(episodes_dir)
    last = launcher.episodes_at_last_launch(spec.namespace)
    if not due(total, last, min_new):
        return {"launched": False, "episodes": total, "since_last": total - last, "needed": min_new}
    return {"launched": True, "job": launcher.launch(spec, total), "episodes": total, "since_last": total - last}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="baton-trainer launch-grpo",
                                description="Start a GPU GRPO Job when enough new episodes have come in")
    p.add_argument("--episodes", required=True,
                   help="the episode dataset: a directory or a URL (s3://bucket/prefix/episodes)")
    p.add_argument("--min-new", type=int, default=5000)
    p.add_argument("--namespace", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--name", default="baton-grpo")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--service-account", default=None)
    p.add_argument("--config-map", default=None)
    p.add_argument("--episodes-claim", default=None)
    p.add_argument("job_args", nargs=argparse.REMAINDER, help="arguments of the GRPO run, after --")
    a = p.parse_args(argv)
    spec = GrpoJobSpec(a.name, a.namespace, a.image, [x for x in a.job_args if x != "--"] or ["grpo", "--help"],
                       a.gpus, a.service_account, a.config_map, a.episodes_claim)
    print(json.dumps(launch_if_due(KubernetesJobs(), spec, a.episodes, a.min_new)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
