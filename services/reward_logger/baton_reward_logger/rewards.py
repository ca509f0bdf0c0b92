"""From a finished workflow to a reward: grade the answer when the request carried a reference.

Evaluation and training traffic put `reference` and `grader` (math, choice, code, exact, regex)
in the request's metadata. Two reward schemes:
- `quality_minus_cost`: quality in [0, 1] minus `cost_weight` × the workflow's cost in USD;
- `conductor` (the Conductor paper's): 0 for an invalid plan (the safe plan replaced it) or a
  failed workflow, 0.5 for a valid plan with a wrong answer, 1 for a right one.
Requests without a reference get no reward here; user feedback may add one later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from baton.v1 import responses_pb2
from baton_graders import grade

Scheme = Literal["quality_minus_cost", "conductor"]


@dataclass(frozen=True)
class Reward:
    grader: str | None
    reference: str | None
    quality: float | None
    reward: float | None
    detail: str


def score(response: responses_pb2.Response, scheme: Scheme, cost_weight: float) -> Reward:
    meta = response.episode.request.metadata
    reference, grader = meta.get("reference"), meta.get("grader")
    if not reference or not grader:
        return Reward(grader or None, reference or None, None, None, "no reference answer")
    ep = response.episode
    # A judged group may answer the client with another candidate's answer when this one's failed.
    own_error = ep.judge.own_error if ep.HasField("judge") and ep.judge.HasField("own_error") else None
    failed = response.WhichOneof("outcome") != "answer" or own_error is not None
    if failed:
        quality, detail = 0.0, f"the workflow failed: {(own_error if own_error is not None else response.error).message}"
    else:
        # The client may have got another candidate's answer (the judge chose it); this episode's
        # plan is graded on its own.
        own = response.episode.judge.own_answer if response.episode.HasField("judge") else response.answer
        try:
            g = grade(grader, own, reference)
        except ValueError as e:
            return Reward(grader, reference, None, None, str(e))
        quality, detail = g.score, g.detail
    if scheme == "conductor":
        if response.episode.plan.fallback or failed:
            value = 0.0
        else:
            value = 1.0 if quality >= 1.0 else 0.5
    else:
        value = quality - cost_weight * response.episode.total.cost_usd
    return Reward(grader, reference, quality, value, detail)
