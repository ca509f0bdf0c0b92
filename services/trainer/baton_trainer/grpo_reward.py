"""The GRPO reward for the LLM conductor: each sampled plan is scored by the logged outcome of that plan.

GRPO learns from the spread of rewards within one prompt's group of samples, so the reward must depend
on what each sample wrote, never on the prompt alone. A sampled plan is read with the router's own
parser and rules (`parse_plan`, `plan_problems`), so it earns credit only if the router would run it:

- unparseable or invalid (the router would replace it with the safe plan): `INVALID` = 0;
- valid but copying the prompt's worked example (`copies_example`): `INVALID` too. Its workers would be
  told to work on the example's arithmetic, not on the question, so the logged outcome of its last
  worker says nothing about its answer; small conductors copy the example in most plans, and a reward
  that credited it would teach them to copy more;
- valid: the last step's output is the answer, so the plan is worth what its last step's worker scored
  on this query in the logs. With q the logged quality of that worker on that query (the share of its
  runs graded right), the reward is WRONG + (RIGHT - WRONG) * q: 1 for a worker that was right, 0.5
  for one that was wrong (the Conductor paper's scheme), the expected reward in between when its runs
  disagree;
- valid but that worker has never run on this query: `UNKNOWN` = 0.75 by default, halfway between
  right and wrong, i.e. a coin-flip prior on the unseen outcome. It keeps format learning going on such
  plans while never ranking them above a worker that is known to be right;
- with `cost_weight` > 0, minus `cost_weight` times the plan's summed worker costs (each step priced
  at that worker's logged mean cost on this query, else its mean cost over all queries, else 0), but
  never below `INVALID`: an expensive valid plan must not teach the model that invalid output is better.

Intermediate steps are not judged for quality: the logs say how a worker answers the question, not how
well it carries out an arbitrary sub-instruction, so only the worker that gives the answer is credited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baton_conductor import ConductorOutputError, PlanBounds, copies_example, parse_plan
from baton_workflow import CONDUCTOR, Plan, plan_problems

from .grpo_data import OutcomeTable

RIGHT = 1.0
WRONG = 0.5
INVALID = 0.0
UNKNOWN = (RIGHT + WRONG) / 2


@dataclass(frozen=True)
class Verdict:
    reward: float
    reason: str  # "invalid", "copied", "unknown" or "known"
    plan: Plan | None = None
    detail: str = ""


def completion_text(completion) -> str:
    """The text of one completion: TRL passes a string for text prompts and a list of messages for chat."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                return str(message.get("content") or "")
    return ""


class PlanOutcomeReward:
    """A TRL reward function: `reward(completions, query_key=[...], **_) -> list[float]`.

    `query_key` is a column of the training dataset (see `grpo_data.PromptSet`), which TRL repeats for
    every sample of a prompt and passes to reward functions by name.
    """

    __name__ = "plan_outcome"  # TRL logs each reward function's mean under its name

    def __init__(self, outcomes: OutcomeTable, worker_names: Sequence[str], bounds: PlanBounds, *,
                 cost_weight: float = 0.0, unknown: float = UNKNOWN) -> None:
        if len(worker_names) != bounds.pool_size:
            raise ValueError(f"{len(worker_names)} worker names for a pool of {bounds.pool_size}")
        if cost_weight < 0:
            raise ValueError("cost_weight must not be negative")
        self.outcomes = outcomes
        self.worker_names = list(worker_names)
        self.bounds = bounds
        self.cost_weight = cost_weight
        self.unknown = unknown

    def judge(self, text: str, key: str) -> Verdict:
        try:
            plan = parse_plan(text.strip(), self.worker_names, self.bounds)
        except ConductorOutputError as e:
            return Verdict(INVALID, "invalid", None, str(e))
        problems = plan_problems(plan, self.worker_names, self.bounds.max_steps)
        if problems:
            return Verdict(INVALID, "invalid", plan, "; ".join(problems))
        if copies_example(plan.subtasks):
            return Verdict(INVALID, "copied", plan, "the plan copies the prompt's worked example")
        # A conductor step keeps or corrects the answer before it; offline, only keeping it can be
        # scored, so the plan earns the outcome of its last step on a worker.
        answering = [w for w in plan.workers if w != CONDUCTOR]
        outcome = self.outcomes.get(key, answering[-1]) if answering else None
        if outcome is None:
            value, reason = self.unknown, "unknown"
        else:
            value, reason = WRONG + (RIGHT - WRONG) * outcome.quality, "known"
        if self.cost_weight:
            value = max(INVALID, value - self.cost_weight * self.plan_cost(plan, key))
        return Verdict(value, reason, plan)

    def plan_cost(self, plan: Plan, key: str) -> float:
        total = 0.0
        for worker in plan.workers:
            if worker == CONDUCTOR:
                continue  # its inner calls are unknown offline
            outcome = self.outcomes.get(key, worker)
            cost = outcome.cost_usd if outcome is not None else None
            if cost is None:
                cost = self.outcomes.mean_cost(worker)
            total += cost or 0.0
        return total

    def __call__(self, completions, query_key=None, **kwargs) -> list[float]:
        if query_key is None:
            raise ValueError("the training dataset needs a 'query_key' column for the plan reward")
        if len(query_key) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(query_key)} query keys")
        verdicts = [self.judge(completion_text(c), k) for c, k in zip(completions, query_key)]
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and verdicts:
            # How many samples the router could run, and how many the logs could judge.
            log_metric("plan_valid_share", sum(v.reason not in ("invalid", "copied") for v in verdicts) / len(verdicts))
            log_metric("plan_copied_share", sum(v.reason == "copied" for v in verdicts) / len(verdicts))
            log_metric("plan_known_share", sum(v.reason == "known" for v in verdicts) / len(verdicts))
        return [v.reward for v in verdicts]
