"""What the model-backed conductors share: the prompt inputs, and turning sampled text into a Proposal.

Log-probabilities, the same for every backend: `Proposal.token_logprobs` holds the conductor model's
OWN log-probabilities of the tokens it emitted, from its raw logits at temperature 1, before the
grammar/schema mask and before temperature, top-k or top-p. That is what vLLM returns by default
(`logprobs_mode="raw_logprobs"`), what an OpenAI-compatible server returns, and what a trainer such as
TRL recomputes from the policy, so logged episodes from every backend compare. Under constrained
decoding these are NOT the probabilities the plan was sampled with (the mask renormalises over the
allowed tokens), so their sum is at most the log of the sampling probability.

`Proposal.propensity` is the probability with which this plan was actually drawn: 1.0 under greedy
decoding, exp(sum of the renormalised, temperature-scaled sampling log-probs) where the backend can
compute them (transformers), and 0.0 ("unknown") where it cannot (an HTTP server or vLLM, whose
default log-probs are the raw ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from baton.v1 import requests_pb2
from baton_platform.config import BatonConfig

from baton_router.conductor.base import Proposal
from baton_router.conductor.prompt import cards_from, conductor_messages, conversation
from baton_router.conductor.schema import ConductorOutputError, PlanBounds, parse_plan


class ConductorUnavailable(RuntimeError):
    """The backend cannot run here: a package or the model is missing."""


class PlanPrompter:
    """Builds the conductor's chat messages and reads its answers for one configured worker pool."""

    def __init__(self, config: BatonConfig) -> None:
        conductor = config.conductor
        self.worker_names = [w.name for w in config.workers]
        self.cards = cards_from(config.workers)
        self.bounds = PlanBounds(len(self.worker_names), conductor.max_steps, conductor.max_subtask_chars)
        self._example = conductor.prompt_example
        self._max_query_chars = conductor.max_query_chars

    def messages(self, request: requests_pb2.ChatRequest) -> list[dict[str, str]]:
        return conductor_messages(conversation(request), self.cards, self.bounds, example=self._example,
                                  max_query_chars=self._max_query_chars)

    def proposal(self, text: str, token_logprobs: Sequence[float], propensity: float,
                 policy_version: str) -> Proposal:
        """The Proposal for `text`; ConductorOutputError (carrying the log-probs) when it is not a plan."""
        logprobs = [float(x) for x in token_logprobs]
        try:
            plan = parse_plan(text, self.worker_names, self.bounds)
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
