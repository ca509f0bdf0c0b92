"""The codes a workflow's errors carry (`common_pb2.Error.code`): the executor's when a step fails, the
synthesizer's when a request fails. Clients see them in the gateway's error bodies and the episodes
record them, so a value never changes; a new failure gets a new member."""

from __future__ import annotations

from enum import StrEnum


class WorkflowError(StrEnum):
    # A step's error, from the executor.
    PROVIDER_ERROR = "provider_error"  # the provider refused or failed the call (after the executor's retries)
    EXECUTOR_ERROR = "executor_error"  # the executor itself failed on the task
    # A request's error, from the synthesizer.
    STEP_FAILED = "step_failed"  # a step failed for good: no fallback left
    STEP_TIMEOUT = "step_timeout"  # a step was not answered in time
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the request's deadline passed (a step's too: not sent to the provider)
    UNKNOWN_WORKER = "unknown_worker"  # the plan names a worker the synthesizer's configuration does not list
    BUDGET_EXCEEDED = "budget_exceeded"  # the next steps would go past the request's budget


# The codes that mean time ran out (the gateway answers them with 504, others with 502).
TIMEOUTS = frozenset({WorkflowError.STEP_TIMEOUT, WorkflowError.DEADLINE_EXCEEDED})
