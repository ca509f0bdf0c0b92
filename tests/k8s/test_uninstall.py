"""Last on the cluster: `helm test` passes, then `helm uninstall` leaves nothing of the release but the
claims the chart keeps on purpose (`helm.sh/resource-policy: keep`: the episode dataset and the
router's models, as the chart's README says)."""

from __future__ import annotations

from .cluster import RELEASE, helm, kubectl_json, wait_until

KINDS = ("pods,deployments,replicasets,statefulsets,services,endpointslices,configmaps,secrets,serviceaccounts,"
         "persistentvolumeclaims,poddisruptionbudgets,horizontalpodautoscalers,networkpolicies,jobs,cronjobs,"
         "roles,rolebindings,ingresses")
KEPT = {("PersistentVolumeClaim", f"{RELEASE}-episodes"), ("PersistentVolumeClaim", f"{RELEASE}-models")}


def release_objects() -> set[tuple[str, str]]:
    labelled = kubectl_json("get", KINDS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    records = kubectl_json("get", "secrets", "-l", f"owner=helm,name={RELEASE}")["items"]  # Helm's own
    return {(o["kind"], o["metadata"]["name"]) for o in labelled + records}


def test_helm_test_passes():
    # No --logs: the hook deletes the test pod once it succeeded (a failed one stays, with its logs).
    out = helm("test", RELEASE, "--timeout", "5m")
    print("\n".join(line.strip() for line in out.splitlines() if line.startswith(("TEST SUITE", "Phase"))))
    assert "Phase:          Succeeded" in out, out


def test_helm_uninstall_leaves_only_the_claims_the_chart_keeps():
    assert KEPT < release_objects()
    helm("uninstall", RELEASE, "--wait", "--timeout", "5m")
    wait_until(lambda: release_objects() <= KEPT, 180, "the release's objects to be gone")
    left = release_objects()
    print(f"after helm uninstall: {sorted(left)}")
    assert left == KEPT
