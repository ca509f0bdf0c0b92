"""Decoding Kafka records into contract messages, and dead-lettering the ones that do not decode."""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from baton.v1 import dead_letter_pb2
from faststream.kafka import KafkaBroker, KafkaMessage
from google.protobuf.message import DecodeError, Message

from baton_platform import topics

log = logging.getLogger(__name__)
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


class DeadLetters:
    """Sends records a service cannot process to baton.dlq, so the consumer goes on and nothing is lost."""

    def __init__(self, broker: KafkaBroker, service: str, on_dead_letter=None) -> None:
        self._broker = broker
        self._service = service
        self._on_dead_letter = on_dead_letter

    async def send(self, msg: KafkaMessage, reason: str) -> None:
        raw = msg.raw_message
        letter = dead_letter_pb2.DeadLetter(
            source_topic=raw.topic,
            partition=raw.partition,
            offset=raw.offset,
            key=raw.key or b"",
            value=raw.value or b"",
            reason=reason[:2000],
            service=self._service,
            failed_unix_ms=int(time.time() * 1000),
        )
        log.warning("dead-lettering %s[%s]@%s: %s", raw.topic, raw.partition, raw.offset, reason)
        await self._broker.publish(
            encode(letter),
            topics.DLQ,
            key=raw.key,
            headers={topics.DLQ_REASON_HEADER: reason[:500]},
        )
        if self._on_dead_letter is not None:
            self._on_dead_letter(raw.topic)
