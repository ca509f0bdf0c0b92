"""The conductor's prompt and constraint for one configured worker pool, as the router asks and the
trainer trains: both build them here, so the trained model sees exactly what it will be served."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from baton.v1 import requests_pb2
from baton_conductor.prompt import (
    CONDUCTOR_CARD,
    cards_from,
    conductor_messages,
    conversation,
    evidence_note,
    inner_context,
    tools_note,
)
from baton_conductor.schema import PlanBounds, parse_plan
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_workflow import CONDUCTOR, Plan


class Prompter:
    """Builds the conductor's chat messages and reads its answers for one configured worker pool.

    With recursion on (conductor.max_depth > 0) the pool's last model is the conductor itself, and
    requests that re-plan a step (`ChatRequest.parent`) are inner calls: their prompt shows the
    workflow so far, and their constraint (`inner_bounds`) also admits the empty plan."""

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig]) -> None:
        self.max_depth = conductor.max_depth
        recursive = [CONDUCTOR] if self.max_depth else []
        self.worker_names = [w.name for w in workers] + recursive
        self.cards = cards_from(workers) + ([CONDUCTOR_CARD] if recursive else [])
        self.bounds = PlanBounds(len(self.worker_names), conductor.max_steps, conductor.max_subtask_chars)
        self.inner_bounds = dataclasses.replace(self.bounds, allow_empty=True)
        self._example = conductor.prompt_example
        self._max_query_chars = conductor.max_query_chars

    def bounds_for(self, request: requests_pb2.ChatRequest) -> PlanBounds:
        return self.inner_bounds if request.HasField("parent") else self.bounds

    def messages(self, request: requests_pb2.ChatRequest,
                 chances: Mapping[str, float] | None = None) -> list[dict[str, str]]:
        """The conductor's messages for `request`; `chances` is the router's estimate of each worker's
        chance to answer it right (`baton_policy.evidence`), shown after the question when given."""
        inner = ""
        if request.HasField("parent"):
            inner = inner_context(request.parent, self.worker_names, self._max_query_chars,
                                  may_recurse=request.parent.depth < self.max_depth)
        # The plan's last step gets the client's tools: the conductor plans knowing it (and a trained
        # conductor learned with the same note, as the trainer builds prompts here too).
        inner = evidence_note(chances, self.worker_names) + tools_note(request, self._max_query_chars) + inner
        return conductor_messages(conversation(request), self.cards, self.bounds, example=self._example,
                                  max_query_chars=self._max_query_chars, inner=inner)

    def chat_messages(self, question: str, chances: Mapping[str, float] | None = None) -> list[dict[str, str]]:
        """The messages of a plain request asking `question` (no tools, not an inner call)."""
        return conductor_messages([{"role": "user", "content": question}], self.cards, self.bounds,
                                  example=self._example, max_query_chars=self._max_query_chars,
                                  inner=evidence_note(chances, self.worker_names))

    def parse(self, text: str, bounds: PlanBounds | None = None) -> Plan:
        """The plan in `text`, with worker names; ConductorOutputError when it is not one."""
        return parse_plan(text, self.worker_names, bounds or self.bounds)
