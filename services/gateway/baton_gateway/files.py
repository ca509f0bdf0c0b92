"""OpenAI's files, kept per tenant in a local folder or any fsspec store (the same store as the
episodes): `<root>/<tenant>/<file_id>.content` and its metadata `<file_id>.json`, written last, so a
file is listed only once its content is whole. The tenant in the path scopes every read: another
tenant's id is simply not found."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import re
import secrets
import tempfile
import time
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from baton_gateway.api import ApiError

# Ids the store mints; anything else names no file, so no client text ever becomes a path.
FILE_ID = re.compile(r"file-[0-9a-f]{32}")
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
UPLOAD_PURPOSES = ("batch",)
# Written by the server only: a batch's output and error files.
PURPOSES = (*UPLOAD_PURPOSES, "batch_output")
FILE_OBJECT_KEYS = ("id", "object", "bytes", "created_at", "filename", "purpose", "status", "expires_at",
                    "status_details")


def check_upload_purpose(purpose: str | None) -> str:
    """The purpose of a client's upload, or a 400 naming `purpose`."""
    if purpose not in UPLOAD_PURPOSES:
        raise ApiError(400, f"invalid purpose {purpose!r}: uploads accept {', '.join(UPLOAD_PURPOSES)}",
                       param="purpose")
    return purpose


def check_jsonl(content: bytes) -> None:
    """A 400 naming the first line of `content` that is not a JSON object: a batch's input must be
    JSONL, one request a line, and a bad line is cheaper to name at upload than in every result."""
    try:
        text = content.decode()
    except UnicodeDecodeError:
        raise ApiError(400, "file: is not UTF-8 text; a batch file is JSONL", param="file") from None
    lines = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = None
        if not isinstance(item, dict):
            raise ApiError(400, f"file: line {number} is not a JSON object; a batch file is JSONL", param="file")
        lines += 1
    if not lines:
        raise ApiError(400, "file: holds no JSON lines; a batch file is JSONL", param="file")


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the file is larger than {max_bytes} bytes (gateway.max_file_bytes)", param="file",
                    code="request_too_large")


def file_object(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in FILE_OBJECT_KEYS}


class FileStore:
    """Files by tenant and id under `root`; uploads (purpose batch) of at most `max_bytes`."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self._fs, self._root = fsspec.core.url_to_fs(root)
        self._root = self._root.rstrip("/")
        self._local = isinstance(self._fs, LocalFileSystem)
        self.max_bytes = max_bytes

    async def put(self, tenant: str, filename: str, purpose: str, content: bytes) -> dict[str, Any]:
        if purpose not in PURPOSES:
            raise ApiError(400, f"invalid purpose {purpose!r}: one of {', '.join(PURPOSES)}", param="purpose")
        if purpose in UPLOAD_PURPOSES:
            self.check_size(len(content))
            check_jsonl(content)
        now_ns, file_id = time.time_ns(), f"file-{secrets.token_hex(16)}"
        record = {"id": file_id, "object": "file", "bytes": len(content),
                  "created_at": now_ns // 10**9, "filename": filename, "purpose": purpose, "status": "processed",
                  "expires_at": None, "status_details": None, "created_ns": now_ns}
        base = self._base(tenant, file_id)
        await asyncio.to_thread(self._write, base, content, json.dumps(record).encode())
        return file_object(record)

    def check_size(self, size: int) -> None:
        if size > self.max_bytes:
            raise too_large(self.max_bytes)

    async def get(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        record = await self._record(tenant, file_id)
        return None if record is None else file_object(record)

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        if await self._record(tenant, file_id) is None:
            return None
        return await asyncio.to_thread(self._read, self._base(tenant, file_id) + ".content")

    async def delete(self, tenant: str, file_id: str) -> bool:
        """Whether the file was there; its metadata goes first, so it is never listed half deleted."""
        if await self._record(tenant, file_id) is None:
            return False
        base = self._base(tenant, file_id)
        await asyncio.to_thread(self._remove, base + ".json", base + ".content")
        return True

    async def list(self, tenant: str, purpose: str | None = None) -> builtins.list[dict[str, Any]]:
        """The tenant's files, newest first; only those of `purpose` if given."""
        records = await asyncio.to_thread(self._records, tenant)
        chosen = [r for r in records if purpose is None or r.get("purpose") == purpose]
        chosen.sort(key=lambda r: (r.get("created_ns", 0), r["id"]), reverse=True)
        return [file_object(r) for r in chosen]

    def _dir(self, tenant: str) -> str:
        if not TENANT.fullmatch(tenant):
            raise ValueError(f"not a tenant name: {tenant!r}")
        return f"{self._root}/{tenant}"

    def _base(self, tenant: str, file_id: str) -> str:
        return f"{self._dir(tenant)}/{file_id}"

    async def _record(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        if not FILE_ID.fullmatch(file_id):
            return None
        raw = await asyncio.to_thread(self._read, self._base(tenant, file_id) + ".json")
        return None if raw is None else json.loads(raw)

    def _read(self, path: str) -> bytes | None:
        try:
            return self._fs.cat_file(path)
        except FileNotFoundError:
            return None

    def _records(self, tenant: str) -> builtins.list[dict[str, Any]]:
        try:
            names = self._fs.ls(self._dir(tenant), detail=False)
        except FileNotFoundError:
            return []
        paths = [p for p in names if p.endswith(".json") and FILE_ID.fullmatch(os.path.basename(p)[:-5])]
        found = self._fs.cat(paths, on_error="omit") if paths else {}
        return [json.loads(raw) for raw in found.values()]

    def _write(self, base: str, content: bytes, metadata: bytes) -> None:
        """The content first, the metadata last: a file is listed only once its content is whole."""
        if self._local:
            os.makedirs(os.path.dirname(base), exist_ok=True)
            write_atomic(base + ".content", content)
            write_atomic(base + ".json", metadata)
        else:
            self._fs.pipe_file(base + ".content", content)
            self._fs.pipe_file(base + ".json", metadata)

    def _remove(self, *paths: str) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(path)


def write_atomic(path: str, data: bytes) -> None:
    """`data` at `path` whole or not at all: a temporary file, synced, then renamed over it."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
