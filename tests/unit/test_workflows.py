from baton.v1 import common_pb2, requests_pb2, workflow_pb2

from baton_platform.config import load_config
from baton_synthesizer.workflows import Dispatch, Finish, Workflows
from baton_workflow import Plan, to_proto


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


def setup(write_config, plan: Plan, step_timeout=60.0, fallback=None, budget=None, synthesizer=None):
    from testbed import default_config_data

    data = default_config_data()
    if fallback:
        data["workers"][0]["fallback"] = fallback
    data["synthesizer"] = {"step_timeout_s": step_timeout, **(synthesizer or {})}
    config = load_config(write_config(data=data))
    clock = Clock()
    wf = Workflows(config, clock=clock)
    request = requests_pb2.ChatRequest(request_id="r1", messages=[common_pb2.ChatMessage(role="user", content="Q?")],
                                       created_unix_ms=clock.now, reply_partition=3, budget=budget)
    run = wf.on_planned(workflow_pb2.WorkflowPlanned(request=request, plan=to_proto(plan, backend="static")))
    return wf, run, clock


def completed(step, output, attempt=1, cost=0.5):
    return workflow_pb2.StepCompleted(task_id=f"r1:{step}:{attempt}", step=step, attempt=attempt, output=output, worker="",
                                      usage=common_pb2.Usage(input_tokens=10, output_tokens=5, cost_usd=cost, calls=1))


def test_steps_run_when_what_they_read_is_done_and_the_last_output_answers(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash", "llama-70b"], subtasks=["a", "b", "c"], access=[[], [], [0, 1]])
    wf, run, _ = setup(write_config, plan)
    first = wf.advance(run)
    assert [a.task.step for a in first] == [0, 1], "independent steps go out together"
    assert all(isinstance(a, Dispatch) and a.provider == "sim" for a in first)
    assert first[0].task.task_id == "r1:0:1" and first[0].task.query == "Q?"
    wf.on_completed("r1", completed(0, "zero"))
    assert wf.advance(run) == []
    wf.on_completed("r1", completed(1, "one"))
    third = wf.advance(run)
    assert [a.task.step for a in third] == [2]
    assert "zero" in third[0].task.messages[0].content and "one" in third[0].task.messages[0].content
    wf.on_completed("r1", completed(2, "final"))
    (finish,) = wf.advance(run)
    assert isinstance(finish, Finish) and finish.reply_partition == 3
    assert finish.response.answer == "final"
    ep = finish.response.episode
    assert [s.worker for s in ep.steps] == ["gemini-pro", "gemini-flash", "llama-70b"]
    assert ep.total.cost_usd == 1.5 and ep.total.calls == 3 and ep.total.input_tokens == 30


def test_duplicates_and_stale_attempts_are_ignored(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]))
    wf.advance(run)
    assert wf.on_completed("r1", completed(0, "x", attempt=0)) is None
    assert wf.on_completed("r1", completed(0, "first")) is run
    assert wf.on_completed("r1", completed(0, "second")) is None
    assert wf.advance(run)[0].response.answer == "first"
    assert wf.on_completed("unknown", completed(0, "x")) is None


def test_a_failed_step_ends_the_request_with_a_clear_error(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]]))
    wf.advance(run)
    wf.on_failed("r1", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(code="provider_error", message="401 bad key")))
    (finish,) = wf.advance(run)
    assert finish.response.error.code == "step_failed"
    assert "step 1 (gemini-pro) failed: 401 bad key" in finish.response.error.message
    assert run.finished and wf.advance(run) == []


def test_a_failed_step_moves_to_the_workers_fallback(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), fallback="llama-70b")
    wf.advance(run)
    wf.on_failed("r1", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(message="boom")))
    (retry,) = wf.advance(run)
    assert retry.task.worker == "llama-70b" and retry.task.attempt == 2 and retry.task.task_id == "r1:0:2"
    assert wf.on_completed("r1", completed(0, "late answer to attempt 1")) is None
    wf.on_completed("r1", completed(0, "saved", attempt=2))
    (finish,) = wf.advance(run)
    assert finish.response.answer == "saved"
    assert finish.response.episode.steps[0].worker == "llama-70b"


def test_an_unanswered_step_times_out(write_config):
    wf, run, clock = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), step_timeout=2)
    wf.advance(run)
    clock.now += 1500
    assert wf.expired() == []
    clock.now += 1000
    ((expired_run, (finish,)),) = wf.expired()
    assert expired_run is run and finish.response.error.code == "step_timeout"
    assert "not answered within 2 s" in finish.response.error.message
    assert wf.expired() == [], "a finished run does not time out twice"


def test_results_read_back_after_a_restart_rebuild_the_run(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, _ = setup(write_config, plan)
    # No dispatch happened in this instance: the results come from re-reading the partition.
    wf.on_completed("r1", completed(0, "from before the crash"))
    (again,) = wf.advance(run)
    assert again.task.step == 1, "the completed step is not dispatched again"
    assert "from before the crash" in again.task.messages[0].content


def test_a_redelivered_plan_does_not_start_a_second_run(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]))
    again = workflow_pb2.WorkflowPlanned(request=run.request, plan=run.plan_proto)
    assert wf.on_planned(again) is None


def test_a_call_budget_stops_a_plan_that_needs_more_calls(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash", "llama-70b"], subtasks=["a", "b", "c"], access=[[], [], [0, 1]])
    wf, run, _ = setup(write_config, plan, budget=common_pb2.Budget(max_calls=2))
    assert len(wf.advance(run)) == 2
    wf.on_completed("r1", completed(0, "x"))
    wf.on_completed("r1", completed(1, "y"))
    (finish,) = wf.advance(run)
    assert finish.response.error.code == "budget_exceeded" and "budget of 2 provider calls" in finish.response.error.message


def test_a_cost_budget_from_config_or_request_whichever_is_tighter(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, _ = setup(write_config, plan, budget=common_pb2.Budget(max_cost_usd=5.0),
                       synthesizer={"max_cost_usd": 0.4})
    wf.advance(run)
    wf.on_completed("r1", completed(0, "x", cost=0.5))
    (finish,) = wf.advance(run)
    assert finish.response.error.code == "budget_exceeded" and "$0.400000" in finish.response.error.message


def test_streaming_requests_get_progress_notes(write_config):
    from baton_synthesizer.workflows import Notify

    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, _ = setup(write_config, plan)
    run.request.stream = True
    first = wf.advance(run)
    assert [type(a).__name__ for a in first] == ["Dispatch", "Notify"]
    assert first[1].response.progress.state == "started" and first[1].response.progress.steps == 2
    wf.on_completed("r1", completed(0, "x"))
    notes = [a.response.progress for a in wf.advance(run) if isinstance(a, Notify)]
    assert [(p.step, p.state) for p in notes] == [(0, "completed"), (1, "started")]


def test_a_plan_delivered_again_after_its_workflow_finished_does_not_run_again(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]))
    wf.advance(run)
    wf.on_completed("r1", completed(0, "done"))
    wf.advance(run)
    wf.forget("r1")
    again = workflow_pb2.WorkflowPlanned(request=run.request, plan=run.plan_proto)
    assert wf.on_planned(again) is None and "r1" not in wf.runs
