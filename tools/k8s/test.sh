#!/usr/bin/env bash
# `make k8s-test`: starts the local cluster (tools/k8s/up.sh), runs tests/k8s against it through the
# gateway's port-forward, and always takes the cluster down again.
#
#   tools/k8s/test.sh [pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

started=$SECONDS
# The cluster goes down however the tests end; what it leaves behind fails the run.
trap 'log "k8s-test took $((SECONDS - started))s"; "$HERE/down.sh" || exit 1' EXIT
# The Kafka image the cluster runs also serves the test harness's testcontainers path (through podman's
# Docker-compatible API); `make test` skips that test where the image is not built yet.
BATON_REQUIRE_PODMAN=1 "$ROOT/.venv/bin/python" -m pytest \
  "$ROOT/tests/tools/test_kafka_harness.py::test_kafka_for_tests_runs_the_broker_image_through_testcontainers" \
  -p no:cacheprovider -q
"$HERE/up.sh"
"$ROOT/.venv/bin/python" -m pytest "$ROOT/tests/k8s" -p no:cacheprovider -q -s "$@"
