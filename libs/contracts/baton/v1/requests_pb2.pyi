from baton.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatRequest(_message.Message):
    __slots__ = ("request_id", "policy", "messages", "max_tokens", "temperature", "metadata", "deadline_unix_ms", "created_unix_ms", "reply_partition", "budget", "stream", "group_id", "candidate", "group_size", "parent", "tenant", "answer")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REPLY_PARTITION_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    policy: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    max_tokens: int
    temperature: float
    metadata: _containers.ScalarMap[str, str]
    deadline_unix_ms: int
    created_unix_ms: int
    reply_partition: int
    budget: _common_pb2.Budget
    stream: bool
    group_id: str
    candidate: int
    group_size: int
    parent: Parent
    tenant: str
    answer: _common_pb2.AnswerOptions
    def __init__(self, request_id: _Optional[str] = ..., policy: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., metadata: _Optional[_Mapping[str, str]] = ..., deadline_unix_ms: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., reply_partition: _Optional[int] = ..., budget: _Optional[_Union[_common_pb2.Budget, _Mapping]] = ..., stream: _Optional[bool] = ..., group_id: _Optional[str] = ..., candidate: _Optional[int] = ..., group_size: _Optional[int] = ..., parent: _Optional[_Union[Parent, _Mapping]] = ..., tenant: _Optional[str] = ..., answer: _Optional[_Union[_common_pb2.AnswerOptions, _Mapping]] = ...) -> None: ...

class Parent(_message.Message):
    __slots__ = ("request_id", "task_id", "step", "attempt", "depth", "steps", "last_answer")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_ANSWER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    task_id: str
    step: int
    attempt: int
    depth: int
    steps: _containers.RepeatedCompositeFieldContainer[PriorStep]
    last_answer: str
    def __init__(self, request_id: _Optional[str] = ..., task_id: _Optional[str] = ..., step: _Optional[int] = ..., attempt: _Optional[int] = ..., depth: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[PriorStep, _Mapping]]] = ..., last_answer: _Optional[str] = ...) -> None: ...

class PriorStep(_message.Message):
    __slots__ = ("worker", "instruction", "output")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    worker: str
    instruction: str
    output: str
    def __init__(self, worker: _Optional[str] = ..., instruction: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...
