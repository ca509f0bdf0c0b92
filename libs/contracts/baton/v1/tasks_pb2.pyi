from baton.v1 import common_pb2 as _common_pb2
from baton.v1 import workflow_pb2 as _workflow_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(_message.Message):
    __slots__ = ("task_id", "request_id", "step", "attempt", "worker", "messages", "max_tokens", "temperature", "deadline_unix_ms", "query", "candidates", "stream", "reply_partition", "answer", "workflow")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REPLY_PARTITION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    request_id: str
    step: int
    attempt: int
    worker: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    max_tokens: int
    temperature: float
    deadline_unix_ms: int
    query: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    stream: bool
    reply_partition: int
    answer: _common_pb2.AnswerOptions
    workflow: _workflow_pb2.WorkflowPlanned
    def __init__(self, task_id: _Optional[str] = ..., request_id: _Optional[str] = ..., step: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., deadline_unix_ms: _Optional[int] = ..., query: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ..., stream: _Optional[bool] = ..., reply_partition: _Optional[int] = ..., answer: _Optional[_Union[_common_pb2.AnswerOptions, _Mapping]] = ..., workflow: _Optional[_Union[_workflow_pb2.WorkflowPlanned, _Mapping]] = ...) -> None: ...
