"""The trainer's gate decisions (a version published, a candidate the gate refused, a rollback), one
small JSON file each under `{store}/{name}/_decisions/`: the trainer writes them, the console draws
them. The folder has no manifest.json, so the store never lists it as a version, and a version's name
cannot start with `_`."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

FOLDER = "_decisions"
KINDS = ("published", "refused", "rollback")


def decision(kind: str, version: str, previous: str, *, gate: dict | None = None, reason: str = "",
             unix_ms: int | None = None) -> dict:
    """One decision: `version` is the one published, refused or returned to; `previous` the one
    serving before it; `gate` the gate's numbers (GateResult.as_dict()) when it ran."""
    if kind not in KINDS:
        raise ValueError(f"a decision is one of {KINDS}, not {kind!r}")
    return {"kind": kind, "version": version, "previous": previous, "gate": gate, "reason": reason,
            "unix_ms": int(time.time() * 1000) if unix_ms is None else unix_ms}


def _local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _folder(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}/{FOLDER}"


def _file_name(d: dict) -> str:
    """Sorts by time: zero-padded unix ms, then the kind and the version (made safe for a file name)."""
    version = re.sub(r"[^A-Za-z0-9._-]", "_", str(d["version"]))[:64]
    return f"{int(d['unix_ms']):015d}-{d['kind']}-{version}.json"


def record(store_root: str, name: str, d: dict) -> str:
    """Write one decision; returns where. On a local disk a temporary file renamed into place (a
    reader never sees half a record); on an fsspec URL one put of the whole file."""
    folder, body = _folder(store_root, name), json.dumps(d, indent=2).encode()
    target = f"{folder}/{_file_name(d)}"
    if _local(store_root):
        local = Path(folder.removeprefix("file://"))
        local.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, local / _file_name(d))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    else:
        import fsspec

        fs, path = fsspec.core.url_to_fs(target)
        fs.pipe_file(path, body)
    return target


def read(store_root: str, name: str, limit: int = 50) -> list[dict]:
    """The newest `limit` decisions, oldest first; none when the folder does not exist. A file that
    is not a JSON object (not written by `record`) is skipped."""
    folder = _folder(store_root, name)
    if _local(store_root):
        local = Path(folder.removeprefix("file://"))
        names = sorted(p.name for p in local.glob("*.json")) if local.is_dir() else []
        texts = [(local / n).read_bytes() for n in names[-limit:]] if limit > 0 else []
    else:
        import fsspec

        fs, path = fsspec.core.url_to_fs(folder)
        found = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".json")) if fs.isdir(path) else []
        texts = [fs.cat_file(p) for p in found[-limit:]] if limit > 0 else []
    return [d for d in map(_parse, texts) if d is not None]


def _parse(text: bytes) -> dict | None:
    try:
        d = json.loads(text)
    except ValueError:
        return None
    return d if isinstance(d, dict) and isinstance(d.get("unix_ms"), int) else None
