"""The generated code in libs/contracts must match proto/: `make proto` rebuilds it."""

import subprocess
import sys

from testbed import REPO


def test_generated_contracts_are_fresh(tmp_path):
    protos = sorted(str(p.relative_to(REPO)) for p in (REPO / "proto" / "baton" / "v1").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", "proto", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", *protos], cwd=REPO, check=True)
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*_pb2.py*")}
    committed = {p.relative_to(REPO / "libs" / "contracts"): p.read_bytes()
                 for p in (REPO / "libs" / "contracts" / "baton").rglob("*_pb2.py*")}
    assert fresh.keys() == committed.keys(), "a .proto was added or removed: run `make proto`"
    stale = [str(k) for k in fresh if fresh[k] != committed[k]]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"


def test_every_topic_message_is_defined_in_proto():
    from baton.v1 import dead_letter_pb2, feedback_pb2, policy_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2

    names = {m.DESCRIPTOR.full_name for m in (
        requests_pb2.ChatRequest, workflow_pb2.WorkflowEvent, workflow_pb2.WorkflowPlanned,
        workflow_pb2.StepCompleted, workflow_pb2.StepFailed, tasks_pb2.Task, responses_pb2.Response,
        feedback_pb2.Feedback, policy_pb2.PolicyUpdate, dead_letter_pb2.DeadLetter)}
    assert all(n.startswith("baton.v1.") for n in names) and len(names) == 10
