"""The GRPO Job launcher with the official kubernetes client against a local server that speaks the
Kubernetes API's wire format for Jobs (list with a label selector, create with generateName)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kubernetes import client

from baton_trainer.cluster import LAST_RUN_LABEL, GrpoJobSpec, KubernetesJobs, launch_if_due


class FakeApiServer:
    def __init__(self):
        self.jobs: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server names its hooks so
                url = urlparse(self.path)
                api.requests.append(("GET", self.path))
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                items = [j for j in api.jobs if not selector or selector in j["metadata"]["labels"]]
                self._send(200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items})

            def do_POST(self):  # noqa: N802 - http.server names its hooks so
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.requests.append(("POST", self.path))
                if body.get("kind") != "Job" or not body["spec"]["template"]["spec"]["containers"]:
                    self._send(422, {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422})
                    return
                body["metadata"]["name"] = body["metadata"].pop("generateName") + f"{len(api.jobs):05d}"
                body["metadata"]["namespace"] = self.path.split("/")[5]
                api.jobs.append(body)
                self._send(201, body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api():
    server = FakeApiServer()
    yield server
    server.server.shutdown()


def write_episodes(root, n, name):
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"request_id": [f"r{i}" for i in range(n)]}), root / f"{name}.parquet")


def test_a_job_is_launched_only_when_enough_new_episodes_came_in(api, tmp_path):
    cfg = client.Configuration(host=api.url)
    jobs = KubernetesJobs(client.ApiClient(cfg))
    spec = GrpoJobSpec("baton-grpo", "ml", "baton-trainer:1", ["grpo", "--steps", "200"], gpus=2,
                       config_map="baton-config", episodes_claim="baton-episodes")
    episodes = tmp_path / "episodes"
    assert launch_if_due(jobs, spec, episodes, min_new=100) == {"launched": False, "episodes": 0, "since_last": 0,
                                                               "needed": 100}
    write_episodes(episodes, 150, "a")
    first = launch_if_due(jobs, spec, episodes, min_new=100)
    assert first["launched"] and first["job"] == "baton-grpo-00000" and first["episodes"] == 150
    (job,) = api.jobs
    assert job["metadata"]["labels"][LAST_RUN_LABEL] == "150"
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["grpo", "--steps", "200"] and container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["securityContext"]["runAsNonRoot"] and pod["restartPolicy"] == "Never"
    assert {"name": "BATON_CONFIG", "value": "/etc/baton/baton.yaml"} in container["env"]
    assert pod["volumes"][1]["persistentVolumeClaim"] == {"claimName": "baton-episodes", "readOnly": True}
    write_episodes(episodes, 60, "b")
    assert not launch_if_due(jobs, spec, episodes, min_new=100)["launched"], "60 new since the last Job"
    write_episodes(episodes, 50, "c")
    assert launch_if_due(jobs, spec, episodes, min_new=100)["job"] == "baton-grpo-00001"
    assert ("GET", "/apis/batch/v1/namespaces/ml/jobs?labelSelector=baton.io/episodes") in api.requests
