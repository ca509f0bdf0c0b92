"""What the LLM conductors (transformers, vLLM, OpenAI-compatible) share: the prompt inputs, and turning sampled text into a Proposal.

Log-probabilities, the same for every backend: `Proposal.token_logprobs` holds, for each token the
conductor emitted, its log-probability under the model's distribution RESTRICTED to the tokens the
constraint (grammar or schema) allowed at that step and renormalised, at temperature 1, before
top-k/top-p. That is what vLLM returns (its default `logprobs_mode="raw_logprobs"` is computed from
logits the structured-output bitmask has already masked, in place, before the sampler), so the
in-process vLLM backend, `vllm serve` behind the 'openai' backend and the 'transformers' backend
record the same quantity. The model's unconstrained log-probs (what a trainer recomputes from the
policy without the mask) are lower; the transformers backend has them too (`Sample.model_logprobs`).
A hosted API behind the 'openai' backend reports whatever its provider computes.

`Proposal.log_propensity` is the log of the probability with which this plan was actually drawn: 0
under greedy decoding; the sum of the sampling log-probs (mask, then temperature, top-k, top-p) where
the backend sees them (transformers); for vLLM, sum(token_logprobs) at temperature 1 (the sampling
distribution then is the masked one); None ("unknown") otherwise. It is kept in log space because a
plan of a few hundred tokens has a probability far below the smallest double: `Proposal.propensity`
is its exp() for readers that want a probability, 0.0 when it underflows or is unknown, which only
`log_propensity` tells apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from baton.v1 import requests_pb2
from baton_conductor import ConductorOutputError, PlanBounds, Prompter
from baton_conductor.prompt import conversation
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_router.conductor.base import Proposal
from baton_workflow import query_text


class ConductorUnavailable(RuntimeError):
    """The backend cannot run here: a package or the model is missing."""


class PlanPrompter(Prompter):
    """The shared prompter, plus the router's estimate of each worker's chance (`conductor.evidence`,
    shown to a request that is not an inner call) and turning sampled text into a Proposal."""

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig]) -> None:
        super().__init__(conductor, workers)
        self.evidence = None
        if conductor.evidence is not None:
            from baton_policy.evidence import Evidence

            self.evidence = Evidence.load(conductor.evidence)

    def messages(self, request: requests_pb2.ChatRequest, chances=None) -> list[dict[str, str]]:
        if chances is None and self.evidence is not None and not request.HasField("parent"):
            chances = self.evidence.chance_of(query_text(conversation(request)), request.metadata.get("eval_name") or None)
        return super().messages(request, chances)

    def proposal(self, text: str, token_logprobs: Sequence[float], log_prop: float | None,
                 policy_version: str, bounds: PlanBounds | None = None) -> Proposal:
        """The Proposal for `text`; ConductorOutputError (carrying the log-probs) when it is not a plan."""
        logprobs = [float(x) for x in token_logprobs]
        propensity = 0.0 if log_prop is None else math.exp(log_prop)
        try:
            plan = self.parse(text, bounds)
        except ConductorOutputError as e:
            e.token_logprobs, e.propensity, e.policy_version = logprobs, propensity, policy_version
            e.log_propensity = log_prop
            raise
        return Proposal(plan=plan, policy_version=policy_version, token_logprobs=logprobs, propensity=propensity,
                        log_propensity=log_prop)


def log_propensity(sampling_logprob_sum: float | None, temperature: float) -> float | None:
    """The plan's log-probability of being drawn: 0 when decoding is greedy, None when unknown."""
    if temperature == 0:
        return 0.0
    return sampling_logprob_sum
