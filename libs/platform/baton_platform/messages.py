"""Encoding and decoding contract messages; a record that cannot be processed is a PoisonMessage."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)


class PoisonMessage(Exception):
    """A record that decodes but can never be processed; it goes to the DLQ with this reason."""


def encode(message: Message) -> bytes:
    return message.SerializeToString()


def decode(kind: type[M], raw: bytes) -> M:
    """Parse `raw` as `kind`; raise PoisonMessage with a readable reason when it is not one."""
    if not isinstance(raw, (bytes, bytearray)):
        raise PoisonMessage(f"expected a binary {kind.DESCRIPTOR.full_name}, got {type(raw).__name__}")
    try:
        return kind.FromString(bytes(raw))
    except (DecodeError, ValueError, RecursionError) as e:  # any parse failure is the record's, not ours
        raise PoisonMessage(f"not a valid {kind.DESCRIPTOR.full_name}: {e}") from None
