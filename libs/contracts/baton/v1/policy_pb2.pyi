from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyUpdate(_message.Message):
    __slots__ = ("name", "version", "uri", "kind", "estimate", "estimate_lower", "published_unix_ms", "rollback", "digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_LOWER_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    uri: str
    kind: str
    estimate: float
    estimate_lower: float
    published_unix_ms: int
    rollback: bool
    digest: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., uri: _Optional[str] = ..., kind: _Optional[str] = ..., estimate: _Optional[float] = ..., estimate_lower: _Optional[float] = ..., published_unix_ms: _Optional[int] = ..., rollback: _Optional[bool] = ..., digest: _Optional[str] = ...) -> None: ...
