"""Workflow error codes are on the wire (error bodies, episodes): their values are pinned here, and the
gateway's status for each follows from the one enum."""

from __future__ import annotations

import pytest

from baton.v1 import common_pb2, responses_pb2
from baton_gateway.api import ApiError
from baton_gateway.routes import check_final
from baton_workflow.errors import TIMEOUTS, WorkflowError


def test_the_wire_values_do_not_change():
    assert {e.name: e.value for e in WorkflowError} == {
        "PROVIDER_ERROR": "provider_error", "EXECUTOR_ERROR": "executor_error", "STEP_FAILED": "step_failed",
        "STEP_TIMEOUT": "step_timeout", "DEADLINE_EXCEEDED": "deadline_exceeded",
        "UNKNOWN_WORKER": "unknown_worker", "BUDGET_EXCEEDED": "budget_exceeded"}
    error = common_pb2.Error(code=WorkflowError.STEP_TIMEOUT, message="m")
    assert type(error.code) is str and error.SerializeToString() == common_pb2.Error(
        code="step_timeout", message="m").SerializeToString()


@pytest.mark.parametrize("code", list(WorkflowError))
def test_the_gateway_answers_504_when_time_ran_out_and_502_otherwise(code):
    response = responses_pb2.Response(error=common_pb2.Error(code=code.value, message="m"))
    with pytest.raises(ApiError) as failed:
        check_final("r1", response)
    assert failed.value.status == (504 if code in TIMEOUTS else 502) and failed.value.code == code.value
    assert (code.value in TIMEOUTS) == (code in {"step_timeout", "deadline_exceeded"})


def test_a_deadline_has_come_at_its_own_millisecond_and_zero_means_none():
    from baton_workflow.steps import past_deadline

    assert not past_deadline(0, now_ms=10**15), "0: the request has no deadline"
    assert not past_deadline(1_000, now_ms=999.9)
    assert past_deadline(1_000, now_ms=1_000), "the gateway answers 504 at the deadline itself"
    assert past_deadline(1, now_ms=None), "without a clock given, the wall clock"
