from baton.v1 import common_pb2 as _common_pb2
from baton.v1 import requests_pb2 as _requests_pb2
from baton.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepRecord(_message.Message):
    __slots__ = ("step", "worker", "model", "attempt", "instruction", "output", "usage", "latency_ms", "error", "inner_plan")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INNER_PLAN_FIELD_NUMBER: _ClassVar[int]
    step: int
    worker: str
    model: str
    attempt: int
    instruction: str
    output: str
    usage: _common_pb2.Usage
    latency_ms: float
    error: _common_pb2.Error
    inner_plan: _workflow_pb2.Plan
    def __init__(self, step: _Optional[int] = ..., worker: _Optional[str] = ..., model: _Optional[str] = ..., attempt: _Optional[int] = ..., instruction: _Optional[str] = ..., output: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., latency_ms: _Optional[float] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., inner_plan: _Optional[_Union[_workflow_pb2.Plan, _Mapping]] = ...) -> None: ...

class Episode(_message.Message):
    __slots__ = ("request", "plan", "steps", "total", "latency_ms", "judge")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    request: _requests_pb2.ChatRequest
    plan: _workflow_pb2.Plan
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    total: _common_pb2.Usage
    latency_ms: float
    judge: Judgement
    def __init__(self, request: _Optional[_Union[_requests_pb2.ChatRequest, _Mapping]] = ..., plan: _Optional[_Union[_workflow_pb2.Plan, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., total: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., latency_ms: _Optional[float] = ..., judge: _Optional[_Union[Judgement, _Mapping]] = ...) -> None: ...

class Judgement(_message.Message):
    __slots__ = ("worker", "request_ids", "scores", "chosen", "own_answer", "usage", "error", "own_error")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    OWN_ANSWER_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OWN_ERROR_FIELD_NUMBER: _ClassVar[int]
    worker: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.RepeatedScalarFieldContainer[float]
    chosen: int
    own_answer: str
    usage: _common_pb2.Usage
    error: str
    own_error: _common_pb2.Error
    def __init__(self, worker: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ..., scores: _Optional[_Iterable[float]] = ..., chosen: _Optional[int] = ..., own_answer: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., error: _Optional[str] = ..., own_error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "steps", "worker", "state")
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    steps: int
    worker: str
    state: str
    def __init__(self, step: _Optional[int] = ..., steps: _Optional[int] = ..., worker: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("text", "task_id", "offset")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    text: str
    task_id: str
    offset: int
    def __init__(self, text: _Optional[str] = ..., task_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("request_id", "answer", "error", "progress", "delta", "episode", "completed_unix_ms", "tool_calls", "finish_reason", "logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    answer: str
    error: _common_pb2.Error
    progress: Progress
    delta: Delta
    episode: Episode
    completed_unix_ms: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    finish_reason: str
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, request_id: _Optional[str] = ..., answer: _Optional[str] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., episode: _Optional[_Union[Episode, _Mapping]] = ..., completed_unix_ms: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...
