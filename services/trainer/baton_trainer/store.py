"""The policy store (a directory or any fsspec URL) and the `baton.policy` events that roll out
a version to every router — or back to an earlier one."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from baton.v1 import policy_pb2
from baton_platform import topics
from baton_platform.config import KafkaConfig
from baton_platform.kafka import client_options
from baton_policy import MANIFEST, artefact_digest


@dataclass(frozen=True)
class Stored:
    """A version in the store: where, and the digest a router checks its copy against."""

    uri: str
    digest: str


class PolicyStore:
    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")

    @property
    def _local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def uri(self, name: str, version: str) -> str:
        return f"{self.root}/{name}/{version}"

    def put(self, name: str, version: str, source: Path, manifest: dict) -> Stored:
        """Copy a saved policy directory into the store, with a manifest that records its digest."""
        if version.startswith("_"):
            raise ValueError(f"a version's name cannot start with '_' (the store's own folders): {version!r}")
        digest = artefact_digest(source)
        (source / MANIFEST).write_text(json.dumps({**manifest, "digest": digest}, indent=2))
        target = self.uri(name, version)
        if self._local:
            dest = Path(target.removeprefix("file://"))
            if dest.exists():
                raise FileExistsError(f"policy {name}/{version} already exists in the store")
            shutil.copytree(source, dest)
        else:
            import fsspec

            fs, path = fsspec.core.url_to_fs(target)
            fs.put(str(source), path, recursive=True)
        return Stored(target, digest)

    def versions(self, name: str) -> list[dict]:
        """Published versions, oldest first, with their manifests; none before the first."""
        if not self._local:
            import fsspec

            fs, path = fsspec.core.url_to_fs(f"{self.root}/{name}")
            # Only folders with a manifest are versions: not the decisions' folder (`_decisions`).
            folders = fs.ls(path, detail=False) if fs.isdir(path) else []
            found = [json.loads(fs.cat(f"{p}/manifest.json")) for p in folders if fs.exists(f"{p}/manifest.json")]
        else:
            base = Path(self.root.removeprefix("file://")) / name
            found = [json.loads(p.read_text()) for p in base.glob("*/manifest.json")] if base.exists() else []
        return sorted(found, key=lambda m: m["published_unix_ms"])


def update(name: str, version: str, stored: Stored, *, estimate: float = 0.0, lower: float = 0.0,
           rollback: bool = False, kind: str = "fast") -> policy_pb2.PolicyUpdate:
    """`kind`: "fast" (a learned CPU policy) or "lora" (an adapter of the LLM conductor)."""
    return policy_pb2.PolicyUpdate(name=name, version=version, uri=stored.uri, digest=stored.digest, kind=kind,
                                   estimate=estimate, estimate_lower=lower, published_unix_ms=int(time.time() * 1000),
                                   rollback=rollback)


async def announce(kafka: KafkaConfig, message: policy_pb2.PolicyUpdate) -> None:
    """Publish on baton.policy, keyed by policy name (the compacted topic keeps the latest)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**client_options(kafka), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topics.POLICY, message.SerializeToString(), key=message.name.encode())
    finally:
        await producer.stop()


def announce_sync(kafka: KafkaConfig, message: policy_pb2.PolicyUpdate) -> None:
    asyncio.run(announce(kafka, message))
