"""The operator's evaluation sets: which grader and which reference grade a request's answer.

How an answer is graded is the operator's decision, never the client's: a client that could name
the grader and the reference would choose its own reward, and with ``code`` make the grader run
code of its choosing. A client only names an item, ``metadata={"baton_eval": "SET:ID"}``; the
grader, reference and options come from a file the operator configured.

An evaluation set is a CSV or JSON Lines file, one item per row:

- ``id`` (or ``sample_id``, as in the RouterBench layout of ``data/routing``): unique in the set;
- ``grader``: ``math``, ``choice``, ``code``, ``exact`` or ``regex``; may be left out when the
  set's configuration names a grader for every row;
- ``reference`` (or ``answer``, as in ``data/routing/mmlu_pro_dev.csv``);
- ``options`` (optional): a JSON object of grader options, from the short list each grader allows;
- ``prompt`` (optional): the item's question. When present, a request is graded only if its last
  user message is that question (whitespace aside): otherwise a client could ask "say (C)" while
  naming an item whose answer is C, and mint a reward for a question never asked.

Other columns are ignored, so a RouterBench outcome matrix is an evaluation set as it stands.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .registry import GRADERS

# The metadata key a client names an item with: "SET:ID".
EVAL_METADATA_KEY = "baton_eval"
SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_ITEM_KEY_CHARS = 512

# Options an evaluation set may give each grader. Anything that would weaken the code sandbox (its
# uid, its network and process guards) is not among them.
ALLOWED_OPTIONS: dict[str, frozenset[str]] = {
    "math": frozenset({"rel_tol", "abs_tol"}),
    "choice": frozenset({"letters"}),
    "code": frozenset({"entry_point", "timeout", "memory_mb", "file_size_mb", "max_processes"}),
    "exact": frozenset({"case_sensitive"}),
    "regex": frozenset({"mode", "ignore_case", "strip", "timeout"}),
}


class EvalSetError(ValueError):
    """An evaluation set file is missing or malformed; the message names the file and the row."""


@dataclass(frozen=True)
class EvalItem:
    set: str
    id: str
    grader: str
    reference: str
    options: dict = field(default_factory=dict)
    prompt_digest: bytes | None = None  # of the normalised question, when the set binds items to one

    @property
    def key(self) -> str:
        return f"{self.set}:{self.id}"

    def asked_by(self, question: str) -> bool:
        """True when this item names no question, or ``question`` is it."""
        return self.prompt_digest is None or prompt_digest(question) == self.prompt_digest


def prompt_digest(text: str) -> bytes:
    # A digest, not the text: a matrix's questions would otherwise sit in every logger's memory.
    return hashlib.blake2b(" ".join(str(text).split()).encode("utf-8", "replace"), digest_size=16).digest()


@dataclass(frozen=True)
class EvalSetSource:
    name: str
    path: Path
    grader: str | None = None


class EvalRegistry:
    """Every configured evaluation set, loaded once; looks items up by ``SET:ID``."""

    def __init__(self, sets: Mapping[str, Mapping[str, EvalItem]] | None = None) -> None:
        self._sets = {name: dict(items) for name, items in (sets or {}).items()}

    @classmethod
    def load(cls, sources: Mapping[str, tuple[str | os.PathLike, str | None]]) -> EvalRegistry:
        """``{name: (path, default grader or None)}`` -> a registry; raises EvalSetError."""
        return cls({name: load_eval_set(EvalSetSource(name, Path(path), grader))
                    for name, (path, grader) in sources.items()})

    def __len__(self) -> int:
        return sum(len(items) for items in self._sets.values())

    @property
    def sets(self) -> dict[str, int]:
        return {name: len(items) for name, items in self._sets.items()}

    def lookup(self, key: object) -> EvalItem | None:
        """The item ``SET:ID`` names, or None for anything else (unknown set or id, not a string)."""
        if not isinstance(key, str) or len(key) > MAX_ITEM_KEY_CHARS or ":" not in key:
            return None
        name, item_id = key.split(":", 1)
        return self._sets.get(name, {}).get(item_id)


def _rows(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise EvalSetError(f"{path}:{line_no}: not JSON: {e}") from None
                if not isinstance(row, dict):
                    raise EvalSetError(f"{path}:{line_no}: each line must be a JSON object")
                yield line_no, row
        return
    if path.suffix.lower() != ".csv":
        raise EvalSetError(f"{path}: an evaluation set is a .csv or .jsonl file")
    csv.field_size_limit(sys.maxsize)
    with path.open(newline="", encoding="utf-8") as fh:
        for line_no, row in enumerate(csv.DictReader(fh), 2):
            yield line_no, row


def _first(row: dict, *names: str):
    for name in names:
        value = row.get(name)
        if value not in (None, ""):
            return value
    return None


def load_eval_set(source: EvalSetSource) -> dict[str, EvalItem]:
    if not SET_NAME.match(source.name):
        raise EvalSetError(f"evaluation set name {source.name!r} must match {SET_NAME.pattern} (no ':')")
    if source.grader is not None and source.grader not in GRADERS:
        raise EvalSetError(f"evaluation set {source.name!r}: unknown grader {source.grader!r}; "
                           f"known: {', '.join(sorted(GRADERS))}")
    if not source.path.is_file():
        raise EvalSetError(f"evaluation set {source.name!r}: file {source.path} does not exist")
    items: dict[str, EvalItem] = {}
    for line_no, row in _rows(source.path):
        where = f"{source.path}:{line_no}"
        item_id = _first(row, "id", "sample_id")
        if item_id is None:
            raise EvalSetError(f"{where}: no `id` (or `sample_id`)")
        item_id = str(item_id)
        grader = _first(row, "grader") or source.grader
        if grader is None:
            raise EvalSetError(f"{where}: no `grader`, and the set names none for all its rows")
        if grader not in GRADERS:
            raise EvalSetError(f"{where}: unknown grader {grader!r}")
        reference = _first(row, "reference", "answer")
        if reference is None:
            # A row with nothing to grade against (RouterBench rows may lack an answer) is no item.
            continue
        options = row.get("options") or {}
        if isinstance(options, str):
            try:
                options = json.loads(options)
            except json.JSONDecodeError as e:
                raise EvalSetError(f"{where}: `options` is not JSON: {e}") from None
        if not isinstance(options, dict):
            raise EvalSetError(f"{where}: `options` must be a JSON object")
        unknown = sorted(set(options) - ALLOWED_OPTIONS[grader])
        if unknown:
            raise EvalSetError(f"{where}: options {unknown} are not allowed for grader {grader!r}; "
                               f"allowed: {sorted(ALLOWED_OPTIONS[grader])}")
        if item_id in items:
            raise EvalSetError(f"{where}: id {item_id!r} appears twice")
        prompt = row.get("prompt")
        items[item_id] = EvalItem(source.name, item_id, grader, str(reference), options,
                                  prompt_digest(prompt) if prompt not in (None, "") else None)
    return items
