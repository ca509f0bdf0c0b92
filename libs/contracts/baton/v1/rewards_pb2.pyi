from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Reward(_message.Message):
    __slots__ = ("request_id", "action", "policy_version", "query", "eval_name", "quality", "cost_usd", "completed_unix_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    EVAL_NAME_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    action: str
    policy_version: str
    query: str
    eval_name: str
    quality: float
    cost_usd: float
    completed_unix_ms: int
    def __init__(self, request_id: _Optional[str] = ..., action: _Optional[str] = ..., policy_version: _Optional[str] = ..., query: _Optional[str] = ..., eval_name: _Optional[str] = ..., quality: _Optional[float] = ..., cost_usd: _Optional[float] = ..., completed_unix_ms: _Optional[int] = ...) -> None: ...
