"""The `sim` provider: a declared provider that answers from a real outcome matrix.

The matrix (RouterBench CSV layout: `prompt`, one score column per model, optional `<model>|answer`
and `<model>|output_chars`) records how real models did on real questions. Asked a question it
knows, a sim worker answers as its model did: that model's recorded answer when there is one, else
the reference answer when the model scored right and a refusal to commit when it scored wrong. An
unknown question fails the step (non-retryable: the matrix will not learn it), so that the worker's
`fallback` can take it: the matrix records what its model did, and inventing an answer would be the
sim's, not the model's. Latency is configured, tokens estimated.

As a judge (a task with candidates), a sim worker judges as well as its model answered: it scores
10 the answers that agree with what its model would have answered, 0 the others, and 5 all of them
when its model would not commit to an answer.
"""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from baton_executor.providers.base import ProviderCall, ProviderError, ProviderReply

# Rough characters per token, for estimates where the matrix records characters.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class SimRow:
    score: float
    answer: str | None
    output_chars: int | None
    reference: str | None


class OutcomeMatrix:
    """One CSV, indexed by prompt text; shared by every sim worker that reads the same file."""

    def __init__(self, path: Path) -> None:
        csv.field_size_limit(sys.maxsize)
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            self.columns = list(reader.fieldnames or [])
            self.rows = {row["prompt"].strip(): row for row in reader}
        self.models = [c for c in self.columns if "|" not in c and c not in ("sample_id", "eval_name", "prompt", "answer")]

    def lookup(self, prompt: str, model: str) -> SimRow | None:
        row = self.rows.get(prompt.strip())
        if row is None:
            return None
        answer = row.get(f"{model}|answer") or None
        chars = row.get(f"{model}|output_chars")
        return SimRow(score=float(row[model] or 0), answer=answer,
                      output_chars=int(float(chars)) if chars else None, reference=row.get("answer") or None)


class SimProvider:
    def __init__(self, matrix: OutcomeMatrix, model: str, latency_ms: float) -> None:
        if model not in matrix.models:
            raise ValueError(f"sim: model column {model!r} is not in the matrix; it has {matrix.models}")
        self._matrix = matrix
        self._model = model
        self._latency_s = latency_ms / 1000

    async def complete(self, call: ProviderCall, query: str = "", candidates: Sequence[str] = ()) -> ProviderReply:
        # A recorded answer is text: it cannot be a tool call, JSON or carry log-probabilities. Tools the
        # model may leave uncalled (tool_choice auto) do not change it; sampling options cannot either.
        refused = sorted(call.spec.given() & {"response_format", "logprobs", "top_logprobs", "logit_bias"})
        if call.spec.tool_choice in ("required", "function"):
            refused.append("tool_choice")
        if refused:
            raise ProviderError(f"sim: a recorded answer cannot honour the request parameter {', '.join(refused)}",
                                retryable=False)
        await asyncio.sleep(self._latency_s)
        row = self._matrix.lookup(query, self._model)
        if candidates:
            text = self._judge(row, candidates)
        elif row is None:
            raise ProviderError(f"sim: this question is not in the outcome matrix of {self._model!r}, which answers "
                                f"only the questions it records", retryable=False)
        elif row.answer:
            text = f"The answer is ({row.answer})."
        elif row.score >= 0.5 and row.reference:
            text = f"The answer is ({row.reference})."
        elif row.score >= 0.5:
            text = "I answered this question correctly (the matrix records no answer text)."
        else:
            text = "I am not certain of the answer to this question."
        prompt_chars = sum(len(m["content"]) for m in call.messages)
        out_chars = row.output_chars if row and row.output_chars else len(text)
        finish = "stop"
        for stop in call.spec.stop:
            if stop and stop in text:
                text, out_chars = text[:text.index(stop)], len(text[:text.index(stop)])
        if call.max_tokens and out_chars > call.max_tokens * CHARS_PER_TOKEN:
            text, out_chars, finish = text[:call.max_tokens * CHARS_PER_TOKEN], call.max_tokens * CHARS_PER_TOKEN, "length"
        return ProviderReply(text=text, input_tokens=max(1, prompt_chars // CHARS_PER_TOKEN),
                             output_tokens=max(1, out_chars // CHARS_PER_TOKEN), model=self._model,
                             finish_reason=finish)

    @staticmethod
    def _judge(row: SimRow | None, candidates: Sequence[str]) -> str:
        belief = None
        if row is not None:
            belief = row.answer or (row.reference if row.score >= 0.5 else None)
        if belief is None:
            return json.dumps({"scores": [5] * len(candidates)})
        return json.dumps({"scores": [10 if f"({belief})" in c else 0 for c in candidates]})

    async def aclose(self) -> None:
        return None


__all__ = ["OutcomeMatrix", "ProviderError", "SimProvider"]
