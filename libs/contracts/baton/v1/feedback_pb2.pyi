from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Feedback(_message.Message):
    __slots__ = ("response_id", "score", "comment", "created_unix_ms", "source", "tenant")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    score: float
    comment: str
    created_unix_ms: int
    source: str
    tenant: str
    def __init__(self, response_id: _Optional[str] = ..., score: _Optional[float] = ..., comment: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., source: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...
