from baton.v1 import common_pb2 as _common_pb2
from baton.v1 import requests_pb2 as _requests_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Access(_message.Message):
    __slots__ = ("all", "steps")
    ALL_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    all: bool
    steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, all: _Optional[bool] = ..., steps: _Optional[_Iterable[int]] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("worker", "instruction", "access")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    instruction: str
    access: Access
    def __init__(self, worker: _Optional[str] = ..., instruction: _Optional[str] = ..., access: _Optional[_Union[Access, _Mapping]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("steps", "backend", "policy_version", "fallback", "invalid_reason", "token_logprobs", "propensity", "action", "log_propensity")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    INVALID_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROPENSITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LOG_PROPENSITY_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    backend: str
    policy_version: str
    fallback: bool
    invalid_reason: str
    token_logprobs: _containers.RepeatedScalarFieldContainer[float]
    propensity: float
    action: str
    log_propensity: float
    def __init__(self, steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ..., backend: _Optional[str] = ..., policy_version: _Optional[str] = ..., fallback: _Optional[bool] = ..., invalid_reason: _Optional[str] = ..., token_logprobs: _Optional[_Iterable[float]] = ..., propensity: _Optional[float] = ..., action: _Optional[str] = ..., log_propensity: _Optional[float] = ...) -> None: ...

class WorkflowPlanned(_message.Message):
    __slots__ = ("request", "plan", "planned_unix_ms", "handed_over")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PLANNED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OVER_FIELD_NUMBER: _ClassVar[int]
    request: _requests_pb2.ChatRequest
    plan: Plan
    planned_unix_ms: int
    handed_over: StepFailed
    def __init__(self, request: _Optional[_Union[_requests_pb2.ChatRequest, _Mapping]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., planned_unix_ms: _Optional[int] = ..., handed_over: _Optional[_Union[StepFailed, _Mapping]] = ...) -> None: ...

class StepCompleted(_message.Message):
    __slots__ = ("task_id", "step", "attempt", "worker", "output", "usage", "latency_ms", "model", "inner_plan", "tool_calls", "finish_reason", "logprobs")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INNER_PLAN_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    step: int
    attempt: int
    worker: str
    output: str
    usage: _common_pb2.Usage
    latency_ms: float
    model: str
    inner_plan: Plan
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    finish_reason: str
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, task_id: _Optional[str] = ..., step: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[str] = ..., output: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., latency_ms: _Optional[float] = ..., model: _Optional[str] = ..., inner_plan: _Optional[_Union[Plan, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class StepFailed(_message.Message):
    __slots__ = ("task_id", "step", "attempt", "worker", "error", "retryable", "latency_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    step: int
    attempt: int
    worker: str
    error: _common_pb2.Error
    retryable: bool
    latency_ms: float
    def __init__(self, task_id: _Optional[str] = ..., step: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[str] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., retryable: _Optional[bool] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class WorkflowEvent(_message.Message):
    __slots__ = ("request_id", "planned", "step_completed", "step_failed", "candidate_finished")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    STEP_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STEP_FAILED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    planned: WorkflowPlanned
    step_completed: StepCompleted
    step_failed: StepFailed
    candidate_finished: CandidateFinished
    def __init__(self, request_id: _Optional[str] = ..., planned: _Optional[_Union[WorkflowPlanned, _Mapping]] = ..., step_completed: _Optional[_Union[StepCompleted, _Mapping]] = ..., step_failed: _Optional[_Union[StepFailed, _Mapping]] = ..., candidate_finished: _Optional[_Union[CandidateFinished, _Mapping]] = ...) -> None: ...

class CandidateFinished(_message.Message):
    __slots__ = ("request_id", "candidate", "answer", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    candidate: int
    answer: str
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., candidate: _Optional[int] = ..., answer: _Optional[str] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...
