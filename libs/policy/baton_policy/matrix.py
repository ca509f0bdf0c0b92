"""Outcome matrices in RouterBench's CSV layout.

Columns: ``sample_id``, ``eval_name``, ``prompt``, optional ``answer`` (reference); every other
column without ``|`` is a model's score in [0, 1]; ``<model>|<field>`` columns carry per-model
extras. Fields used here: ``total_cost`` (USD), ``answer`` (the model's extracted answer) and
``output_chars`` (length of its output, a cost proxy when ``total_cost`` is absent).
"""

from __future__ import annotations

import csv
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BASE_COLUMNS = ("sample_id", "eval_name", "prompt", "answer")

COST_TOTAL = "total_cost"
COST_CHARS = "output_chars"
COST_UNIT = "unit"

_COST_SOURCE_TEXT = {
    COST_TOTAL: "<model>|total_cost (USD per query)",
    COST_CHARS: "<model>|output_chars x uniform price (proxy: output characters, one price for every model; not USD)",
    COST_UNIT: "unit cost per call (no cost columns in the file); per-model overrides: {overrides}",
}


def _raise_field_limit() -> None:
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:
            limit //= 10


def group_key(prompt: str) -> str:
    """Identity of a question for grouping: whitespace- and case-normalised prompt hash."""
    return hashlib.sha256(" ".join(prompt.split()).casefold().encode("utf-8")).hexdigest()


@dataclass
class OutcomeMatrix:
    sample_ids: list[str]
    eval_names: list[str]
    prompts: list[str]
    models: list[str]
    scores: np.ndarray  # [n, m] in [0, 1]
    costs: np.ndarray  # [n, m], units given by cost_source
    cost_source: str
    reference: list[str] | None = None
    answers: np.ndarray | None = None  # [n, m] object array of str ("" when none)
    output_chars: np.ndarray | None = None  # [n, m] float, NaN when missing
    unit_costs: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def has_answers(self) -> bool:
        return self.answers is not None

    def answer_columns(self, what: str) -> np.ndarray:
        """The recorded answers, for `what` needs them; a clear error when the file has none."""
        if self.answers is None:
            raise ValueError(f"{what} needs <model>|answer columns")
        return self.answers

    def cost_description(self) -> str:
        text = _COST_SOURCE_TEXT[self.cost_source]
        if self.cost_source == COST_UNIT:
            text = text.format(overrides=self.unit_costs or "none")
        return text

    def subset(self, rows: Sequence[int] | np.ndarray) -> OutcomeMatrix:
        idx = np.asarray(rows, dtype=int)
        def pick(xs):
            return [xs[i] for i in idx]

        return OutcomeMatrix(
            sample_ids=pick(self.sample_ids),
            eval_names=pick(self.eval_names),
            prompts=pick(self.prompts),
            models=list(self.models),
            scores=self.scores[idx],
            costs=self.costs[idx],
            cost_source=self.cost_source,
            reference=pick(self.reference) if self.reference is not None else None,
            answers=self.answers[idx] if self.answers is not None else None,
            output_chars=self.output_chars[idx] if self.output_chars is not None else None,
            unit_costs=dict(self.unit_costs),
        )


def without(matrix: OutcomeMatrix, models: Sequence[str]) -> OutcomeMatrix:
    """The matrix with these models' columns hidden (scores, costs, answers), as if never seen."""
    missing = sorted(set(models) - set(matrix.models))
    if missing:
        raise ValueError(f"models not in the matrix: {missing}")
    keep = [j for j, m in enumerate(matrix.models) if m not in set(models)]
    return OutcomeMatrix(
        sample_ids=list(matrix.sample_ids), eval_names=list(matrix.eval_names), prompts=list(matrix.prompts),
        models=[matrix.models[j] for j in keep], scores=matrix.scores[:, keep], costs=matrix.costs[:, keep],
        cost_source=matrix.cost_source, reference=matrix.reference,
        answers=matrix.answers[:, keep] if matrix.answers is not None else None,
        output_chars=matrix.output_chars[:, keep] if matrix.output_chars is not None else None,
        unit_costs={m: c for m, c in matrix.unit_costs.items() if m not in set(models)},
    )


def read_rows(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    _raise_field_limit()
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    return header, rows


def model_columns(header: Sequence[str]) -> list[str]:
    return [c for c in header if "|" not in c and c not in BASE_COLUMNS]


def _float(value: str | None) -> float:
    if value is None or value.strip() == "":
        return float("nan")
    return float(value)


def from_rows(
    header: Sequence[str],
    rows: Sequence[dict[str, str]],
    *,
    unit_costs: dict[str, float] | None = None,
    models: Sequence[str] | None = None,
) -> OutcomeMatrix:
    for col in ("prompt",):
        if col not in header:
            raise ValueError(f"outcome matrix lacks the required column {col!r}")
    models = list(models) if models is not None else model_columns(header)
    if not models:
        raise ValueError("outcome matrix has no model score columns")
    missing = [m for m in models if m not in header]
    if missing:
        raise ValueError(f"outcome matrix lacks model columns {missing}")
    n, m = len(rows), len(models)
    scores = np.array([[_float(r[mm]) for mm in models] for r in rows], dtype=float).reshape(n, m)
    if np.isnan(scores).any():
        # A missing score is treated as a failure: the replay cannot credit an unknown outcome.
        scores = np.nan_to_num(scores, nan=0.0)
    if (scores < 0).any() or (scores > 1).any():
        raise ValueError("model scores must lie in [0, 1]")
    def has(fld: str) -> bool:
        return all(f"{mm}|{fld}" in header for mm in models)

    output_chars = None
    if has(COST_CHARS):
        output_chars = np.array([[_float(r[f"{mm}|{COST_CHARS}"]) for mm in models] for r in rows]).reshape(n, m)
    unit_costs = dict(unit_costs or {})
    if has(COST_TOTAL):
        costs = np.array([[_float(r[f"{mm}|{COST_TOTAL}"]) for mm in models] for r in rows]).reshape(n, m)
        costs = np.nan_to_num(costs, nan=0.0)
        source = COST_TOTAL
    elif output_chars is not None:
        costs = np.nan_to_num(output_chars, nan=0.0).copy()
        source = COST_CHARS
    else:
        unknown = set(unit_costs) - set(models)
        if unknown:
            raise ValueError(f"unit costs given for unknown models {sorted(unknown)}")
        costs = np.tile(np.array([float(unit_costs.get(mm, 1.0)) for mm in models]), (n, 1))
        source = COST_UNIT
    answers = None
    if has("answer"):
        answers = np.array([[(r.get(f"{mm}|answer") or "").strip() for mm in models] for r in rows], dtype=object)
        answers = answers.reshape(n, m)
    reference = None
    if "answer" in header and any((r.get("answer") or "").strip() for r in rows):
        reference = [(r.get("answer") or "").strip() for r in rows]
    return OutcomeMatrix(
        sample_ids=[r.get("sample_id") or str(i) for i, r in enumerate(rows)],
        eval_names=[r.get("eval_name") or "" for r in rows],
        prompts=[r["prompt"] for r in rows],
        models=models,
        scores=scores,
        costs=costs,
        cost_source=source,
        reference=reference,
        answers=answers,
        output_chars=output_chars,
        unit_costs=unit_costs if source == COST_UNIT else {},
    )


def load_matrix(path: str | Path, *, unit_costs: dict[str, float] | None = None) -> OutcomeMatrix:
    header, rows = read_rows(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return from_rows(header, rows, unit_costs=unit_costs)
