from baton_workflow import Plan, from_proto, plan_problems, readable_steps, ready_steps, step_messages, to_proto

WORKERS = ["a", "b", "c"]


def test_a_valid_plan_has_no_problems():
    plan = Plan(workers=["a", "b", "c"], subtasks=["x", "y", "z"], access=[[], [0], "all"])
    assert plan_problems(plan, WORKERS, max_steps=5) == []


def test_every_rule_is_checked():
    assert "differ in length" in plan_problems(Plan(workers=["a"], subtasks=[], access=[]), WORKERS, 5)[0]
    assert any("at most 2" in p for p in plan_problems(
        Plan(workers=["a"] * 3, subtasks=["x"] * 3, access=[[]] * 3), WORKERS, 2))
    problems = plan_problems(Plan(workers=["a", "zz"], subtasks=["x", " "], access=[[1], [0, 5]]), WORKERS, 5)
    assert "step 0: access to step 1 is not an earlier step" in problems
    assert "step 1: unknown worker 'zz'" in problems
    assert "step 1: empty instruction" in problems
    assert "step 1: access to step 5 is not an earlier step" in problems
    assert plan_problems(Plan(workers=[], subtasks=[], access=[]), WORKERS, 5) == ["the plan has no steps"]


def test_readable_steps():
    assert readable_steps("all", 3) == [0, 1, 2]
    assert readable_steps([2, 0, 0], 3) == [0, 2]
    assert readable_steps([], 3) == []


def test_proto_round_trip_keeps_access_lists():
    plan = Plan(workers=["a", "b", "c"], subtasks=["x", "y", "z"], access=[[], "all", [0]])
    proto = to_proto(plan, backend="static", propensity=1.0)
    assert from_proto(proto) == plan
    assert proto.steps[1].access.all and list(proto.steps[2].access.steps) == [0]


def test_a_step_sees_exactly_what_its_access_list_allows():
    plan = Plan(workers=["a", "b", "c"], subtasks=["solve", "critique", "finalise"], access=[[], [], [0]])
    outputs = {0: "ANSWER-ZERO", 1: "ANSWER-ONE"}
    conversation = [{"role": "user", "content": "What is 2+2?"}]
    msgs = step_messages(plan, 2, conversation, outputs)
    system = msgs[0]["content"]
    assert "finalise" in system and "ANSWER-ZERO" in system and "solve" in system
    assert "ANSWER-ONE" not in system and "critique" not in system
    assert msgs[1:] == conversation
    first = step_messages(plan, 0, conversation, {})[0]["content"]
    assert "earlier steps" not in first


def test_ready_steps_follow_the_access_graph():
    plan = Plan(workers=["a"] * 4, subtasks=["s"] * 4, access=[[], [], [0, 1], "all"])
    assert ready_steps(plan, done=set(), started=set()) == [0, 1]
    assert ready_steps(plan, done={0}, started={0, 1}) == []
    assert ready_steps(plan, done={0, 1}, started={0, 1}) == [2]
    assert ready_steps(plan, done={0, 1, 2}, started={0, 1, 2}) == [3]
