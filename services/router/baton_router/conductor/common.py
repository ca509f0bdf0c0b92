"""What the model-backed conductors share: the prompt inputs, and turning sampled text into a Proposal.

Log-probabilities, the same for every backend: `Proposal.token_logprobs` holds, for each token the
conductor emitted, its log-probability under the model's distribution RESTRICTED to the tokens the
constraint (grammar or schema) allowed at that step and renormalised, at temperature 1, before
top-k/top-p. That is what vLLM returns (its default `logprobs_mode="raw_logprobs"` is computed from
logits the structured-output bitmask has already masked, in place, before the sampler), so the
in-process vLLM backend, `vllm serve` behind the 'openai' backend and the 'transformers' backend
record the same quantity. The model's unconstrained log-probs (what a trainer recomputes from the
policy without the mask) are lower; the transformers backend has them too (`Sample.model_logprobs`).
A hosted API behind the 'openai' backend reports whatever its provider computes.

`Proposal.propensity` is the probability with which this plan was actually drawn: 1.0 under greedy
decoding; exp(sum of the sampling log-probs: mask, then temperature, top-k, top-p) where the backend
sees them (transformers); for vLLM, exp(sum(token_logprobs)) at temperature 1 (the sampling
distribution then is the masked one); 0.0 ("unknown") otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from baton.v1 import requests_pb2
from baton_platform.config import CONDUCTOR, BatonConfig

from baton_router.conductor.base import Proposal
from baton_router.conductor.prompt import CONDUCTOR_CARD, cards_from, conductor_messages, conversation, inner_context
from baton_router.conductor.schema import ConductorOutputError, PlanBounds, parse_plan


class ConductorUnavailable(RuntimeError):
    """The backend cannot run here: a package or the model is missing."""


class PlanPrompter:
    """Builds the conductor's chat messages and reads its answers for one configured worker pool.

    With recursion on (conductor.max_depth > 0) the pool's last model is the conductor itself, and
    requests that re-plan a step (`ChatRequest.parent`) are inner calls: their prompt shows the
    workflow so far, and their constraint (`inner_bounds`) also admits the empty plan."""

    def __init__(self, config: BatonConfig) -> None:
        conductor = config.conductor
        self.max_depth = conductor.max_depth
        recursive = [CONDUCTOR] if self.max_depth else []
        self.worker_names = [w.name for w in config.workers] + recursive
        self.cards = cards_from(config.workers) + ([CONDUCTOR_CARD] if recursive else [])
        self.bounds = PlanBounds(len(self.worker_names), conductor.max_steps, conductor.max_subtask_chars)
        self.inner_bounds = dataclasses.replace(self.bounds, allow_empty=True)
        self._example = conductor.prompt_example
        self._max_query_chars = conductor.max_query_chars

    def bounds_for(self, request: requests_pb2.ChatRequest) -> PlanBounds:
        return self.inner_bounds if request.HasField("parent") else self.bounds

    def messages(self, request: requests_pb2.ChatRequest) -> list[dict[str, str]]:
        inner = ""
        if request.HasField("parent"):
            inner = inner_context(request.parent, self.worker_names, self._max_query_chars,
                                  may_recurse=request.parent.depth < self.max_depth)
        return conductor_messages(conversation(request), self.cards, self.bounds, example=self._example,
                                  max_query_chars=self._max_query_chars, inner=inner)

    def proposal(self, text: str, token_logprobs: Sequence[float], propensity: float,
                 policy_version: str, bounds: PlanBounds | None = None) -> Proposal:
        """The Proposal for `text`; ConductorOutputError (carrying the log-probs) when it is not a plan."""
        logprobs = [float(x) for x in token_logprobs]
        try:
            plan = parse_plan(text, self.worker_names, bounds or self.bounds)
        except ConductorOutputError as e:
            e.token_logprobs, e.propensity, e.policy_version = logprobs, propensity, policy_version
            raise
        return Proposal(plan=plan, policy_version=policy_version, token_logprobs=logprobs, propensity=propensity)


def propensity_from(sampling_logprob_sum: float | None, temperature: float) -> float:
    if temperature == 0:
        return 1.0
    if sampling_logprob_sum is None:
        return 0.0
    return math.exp(sampling_logprob_sum)
