"""The router's planner: fallbacks, unparseable plans and the recursion limit (its consumers are
tested in test_router_consumer.py)."""

from __future__ import annotations

from testbed import default_config_data, pool

from baton.v1 import common_pb2, requests_pb2
from baton_platform.config import load_config


async def test_an_invalid_plan_falls_back_and_is_marked(write_config):
    from baton_router.conductor import Proposal
    from baton_router.planning import Planner
    from baton_workflow import Plan

    class Wild:
        name = "wild"

        async def propose(self, request):
            return Proposal(plan=Plan(workers=["gemini-pro", "ghost"], subtasks=["a", "b"], access=[[1], []]),
                            token_logprobs=[-0.5, -1.0], propensity=0.25)

        async def aclose(self):
            pass

    planner = Planner(*pool(load_config(write_config())), Wild())
    result = await planner.plan(requests_pb2.ChatRequest(request_id="x"))
    assert not result.valid and result.plan.fallback
    assert "unknown worker 'ghost'" in result.plan.invalid_reason and "not an earlier step" in result.plan.invalid_reason
    assert [s.worker for s in result.plan.steps] == ["gemini-pro"], "the safe plan: first worker, one step"
    assert list(result.plan.token_logprobs) == [-0.5, -1.0], "kept so training can give the plan reward 0"


async def test_an_unparseable_plan_keeps_its_log_probs_in_the_fallback(write_config):
    from baton_router.conductor import ConductorOutputError
    from baton_router.planning import Planner

    class Babbler:
        name = "babbler"

        async def propose(self, request):
            raise ConductorOutputError("not JSON", text="{{", token_logprobs=[-2.0], propensity=0.1,
                                       policy_version="v3")

        async def aclose(self):
            pass

    result = await Planner(*pool(load_config(write_config())), Babbler()).plan(requests_pb2.ChatRequest(request_id="x"))
    assert not result.valid and "unparseable plan: not JSON" in result.plan.invalid_reason
    assert list(result.plan.token_logprobs) == [-2.0] and result.plan.policy_version == "v3"


async def test_a_plan_that_copies_the_prompts_example_is_refused_while_the_prompt_shows_it(write_config):
    from baton_conductor.prompt import EXAMPLE_SUBTASKS
    from baton_router.conductor import Proposal
    from baton_router.planning import COPIED_EXAMPLE, Planner
    from baton_workflow import Plan

    class Copier:
        name = "copier"

        async def propose(self, request):
            return Proposal(plan=Plan(workers=["gemini-flash", "gemini-pro"], subtasks=list(EXAMPLE_SUBTASKS[:2]),
                                      access=[[], [0]]), token_logprobs=[-0.5])

    data = default_config_data()
    data["conductor"]["prompt_example"] = True  # the shipped config trains its conductor without one
    config = load_config(write_config(data=data))
    result = await Planner(*pool(config), Copier()).plan(requests_pb2.ChatRequest(request_id="x"))
    assert not result.valid and result.plan.fallback and COPIED_EXAMPLE in result.plan.invalid_reason
    assert [s.worker for s in result.plan.steps] == ["gemini-pro"] and list(result.plan.token_logprobs) == [-0.5]
    # Without the example in the prompt the same words are the conductor's own, and run.
    conductor, workers = pool(config)
    without_example = conductor.model_copy(update={"prompt_example": False})
    result = await Planner(without_example, workers, Copier()).plan(requests_pb2.ChatRequest(request_id="y"))
    assert result.valid and [s.worker for s in result.plan.steps] == ["gemini-flash", "gemini-pro"]


def inner_request(depth: int = 1) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(
        request_id="p:1:1", messages=[common_pb2.ChatMessage(role="user", content="2+2?")],
        parent=requests_pb2.Parent(request_id="p", task_id="p:1:1", step=1, attempt=1, depth=depth,
                                   last_answer="4", steps=[requests_pb2.PriorStep(worker="gemini-pro", output="4")]))


async def test_recursion_stops_at_the_depth_limit_by_keeping_the_answer(write_config):
    from baton_router.conductor import Proposal
    from baton_router.planning import Planner
    from baton_workflow import Plan

    class Recursive:
        name = "recursive"

        async def propose(self, request):
            return Proposal(plan=Plan(workers=["gemini-pro", "conductor"], subtasks=["a", "b"], access=[[], "all"]))

        async def aclose(self):
            pass

    planner = Planner(*pool(load_config(write_config())), Recursive())
    top = await planner.plan(requests_pb2.ChatRequest(request_id="x"))
    assert top.valid and [s.worker for s in top.plan.steps] == ["gemini-pro", "conductor"]
    deep = await planner.plan(inner_request(depth=1))
    assert not deep.valid and deep.plan.fallback and len(deep.plan.steps) == 0, "at the limit: keep the answer"
    assert "at most 1 level(s) deep" in deep.plan.invalid_reason
    off = Planner(*pool(load_config(write_config({"conductor": {**load_config(write_config()).conductor.model_dump(
        mode="json", exclude_none=True), "max_depth": 0}}))), Recursive())
    assert not (await off.plan(requests_pb2.ChatRequest(request_id="y"))).valid, "max_depth 0 turns recursion off"
