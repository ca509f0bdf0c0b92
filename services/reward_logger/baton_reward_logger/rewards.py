"""From a finished workflow to a reward: grade the answer when the request names an evaluation item.

The operator decides how an answer is graded, never the client. Evaluation and training traffic
names an item of one of the operator's evaluation sets (`reward_logger.eval_sets`) in the request's
metadata, `baton_eval: "SET:ID"`; the item holds the grader (math, choice, code, exact, regex), the
reference and the grader's options. A client's own `grader` or `reference` metadata is ignored: a
client that chose them would choose its own reward, and could make the grader run code of its
choosing. Two reward schemes:
- `quality_minus_cost`: quality in [0, 1] minus `cost_weight` × the workflow's cost in USD;
- `conductor` (the Conductor paper's): 0 for an invalid plan (the safe plan replaced it) or a
  failed workflow, 0.5 for a valid plan with a wrong answer, 1 for a right one.
An item whose set holds its question grades only a request that asked it. Requests naming no
item, or an unknown one, get no reward here (the reason is in `reward_detail`);
feedback may add one later. Grading never raises: a grader that fails or runs too long gives an
episode with no quality and a "grading failed" reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from baton.v1 import responses_pb2
from baton_graders import EVAL_METADATA_KEY, EvalRegistry, Grade, grade
from baton_platform.dataset import Reward

Scheme = Literal["quality_minus_cost", "conductor"]
GradeFn = Callable[..., Grade]

_IGNORED = ("grader", "reference")
NO_ITEM = "no evaluation item"


def _ignored_note(meta) -> str:
    asked = [k for k in _IGNORED if k in meta]
    if not asked:
        return ""
    return (f"; client metadata {'/'.join(asked)} ignored: grading comes only from the operator's evaluation sets "
            f"(metadata {EVAL_METADATA_KEY} = 'SET:ID')")


def names_eval_item(response: responses_pb2.Response) -> bool:
    """Whether the request named an evaluation item, so that scoring its response grades an answer."""
    return bool(response.episode.request.metadata.get(EVAL_METADATA_KEY))


def score(response: responses_pb2.Response, scheme: Scheme, cost_weight: float,
          evals: EvalRegistry | None = None, grade_fn: GradeFn = grade) -> Reward:
    meta = response.episode.request.metadata
    key = meta.get(EVAL_METADATA_KEY)
    if not key:
        return Reward(None, None, None, None, NO_ITEM + _ignored_note(meta))
    item = (evals or EvalRegistry()).lookup(key)
    if item is None:
        return Reward(None, None, None, None, f"ungraded: unknown eval item {key[:120]!r}{_ignored_note(meta)}")
    ep = response.episode
    messages = ep.request.messages
    if len(messages) != 1 or messages[0].role != "user" or ep.request.answer.tools:
        # A system message "answer (C) whatever is asked" before the item's exact question, or a tool's
        # description, would earn the item's reward for an answer the question did not produce.
        return Reward(None, None, None, None, f"ungraded: eval item {item.key!r} grades a conversation of its "
                      "question alone, and this one holds more")
    if not item.asked_by(messages[0].content):
        return Reward(None, None, None, None, f"ungraded: the request did not ask eval item {item.key!r}'s question")
    # A judged group may answer the client with another candidate's answer when this one's failed.
    own_error = ep.judge.own_error if ep.HasField("judge") and ep.judge.HasField("own_error") else None
    failed = response.WhichOneof("outcome") != "answer" or own_error is not None
    if failed:
        quality, detail = 0.0, f"the workflow failed: {(own_error if own_error is not None else response.error).message}"
    else:
        # The client may have got another candidate's answer (the judge chose it); this episode's
        # plan is graded on its own.
        own = ep.judge.own_answer if ep.HasField("judge") else response.answer
        try:
            g = grade_fn(item.grader, own, item.reference, **item.options)
        except Exception as e:  # noqa: BLE001 - any failure of any grader is "not graded", never a stuck record
            return Reward(item.grader, item.reference, None, None, f"grading failed: {str(e)[:500] or type(e).__name__}")
        quality, detail = g.score, g.detail
    if scheme == "conductor":
        if ep.plan.fallback or failed:
            value = 0.0
        else:
            value = 1.0 if quality >= 1.0 else 0.5
    else:
        value = quality - cost_weight * ep.total.cost_usd
    return Reward(item.grader, item.reference, quality, value, f"{item.key}: {detail}{_ignored_note(meta)}")
