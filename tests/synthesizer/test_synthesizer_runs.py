

from baton.v1 import common_pb2, requests_pb2, workflow_pb2
from baton_platform.config import load_config
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.runs import Dispatch, Finish, Runs
from baton_workflow import Plan, to_proto


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


def workflows(config, clock) -> Runs:
    """Runs with the settings the synthesizer's create_app gives them."""
    return Runs(config.synthesizer, WorkerPool(config.workers), max_steps=config.conductor.max_steps,
                judge=config.judge, clock=clock)


def setup(write_config, plan: Plan, step_timeout=60.0, fallback=None, budget=None, synthesizer=None, deadline_in_ms=0):
    from testbed import default_config_data

    data = default_config_data()
    if fallback:
        data["workers"][0]["fallback"] = fallback
    data["synthesizer"] = {"step_timeout_s": step_timeout, **(synthesizer or {})}
    config = load_config(write_config(data=data))
    clock = Clock()
    wf = workflows(config, clock)
    request = requests_pb2.ChatRequest(request_id="r1", messages=[common_pb2.ChatMessage(role="user", content="Q?")],
                                       created_unix_ms=clock.now, reply_partition=3, budget=budget,
                                       deadline_unix_ms=clock.now + deadline_in_ms if deadline_in_ms else 0)
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


def test_a_plan_naming_a_worker_this_service_was_not_configured_with_fails_at_once_and_says_why(write_config):
    """A plan naming a worker the configuration does not list: nothing is dispatched."""
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro", "qwen-110b"], subtasks=["a", "b"], access=[[], [0]]))
    (finish,) = wf.advance(run)
    assert isinstance(finish, Finish) and finish.response.error.code == "unknown_worker"
    assert "'qwen-110b'" in finish.response.error.message and "configuration does not list" in finish.response.error.message


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


def test_a_plan_read_after_its_deadline_dispatches_nothing(write_config):
    """A plan that waited in a backlog, or a run resumed after a restart, past the request's deadline."""
    wf, run, clock = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), deadline_in_ms=1000)
    clock.now += 1001
    (finish,) = wf.advance(run)
    assert isinstance(finish, Finish) and finish.response.error.code == "deadline_exceeded"
    assert not finish.response.episode.steps and run.finished


def test_no_step_is_dispatched_after_the_deadline_but_a_finished_run_still_answers(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, clock = setup(write_config, plan, deadline_in_ms=1000)
    (first,) = wf.advance(run)
    assert isinstance(first, Dispatch)
    clock.now += 1500
    wf.on_completed("r1", completed(0, "draft"))
    (finish,) = wf.advance(run)
    assert finish.response.error.code == "deadline_exceeded", "step 2 is not sent once the client has its 504"
    assert [s.output for s in finish.response.episode.steps] == ["draft"]

    wf, run, clock = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), deadline_in_ms=1000)
    wf.advance(run)
    clock.now += 1500
    wf.on_completed("r1", completed(0, "late but whole"))
    (finish,) = wf.advance(run)
    assert finish.response.answer == "late but whole", "nothing left to dispatch: the answer is kept for the episode"


def test_a_step_the_executor_did_not_send_at_its_deadline_moves_to_no_fallback(write_config):
    wf, run, clock = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), fallback="llama-70b",
                           deadline_in_ms=1000)
    wf.advance(run)
    clock.now += 1001
    wf.on_failed("r1", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(
        code="deadline_exceeded", message="the request's deadline passed before the call")))
    (finish,) = wf.advance(run)
    assert isinstance(finish, Finish) and finish.response.error.code == "deadline_exceeded"
    assert "step 1 (gemini-pro) failed: the request's deadline passed" in finish.response.error.message


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
    from baton_synthesizer.runs import Notify

    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, _ = setup(write_config, plan)
    run.request.stream = True
    first = wf.advance(run)
    assert [type(a).__name__ for a in first] == ["Dispatch", "Notify"]
    assert first[1].response.progress.state == "started" and first[1].response.progress.steps == 2
    wf.on_completed("r1", completed(0, "x"))
    notes = [a.response.progress for a in wf.advance(run) if isinstance(a, Notify)]
    assert [(p.step, p.state) for p in notes] == [(0, "completed"), (1, "started")]


def test_a_streaming_requests_last_step_streams_to_the_reply_partition_and_only_it(write_config):
    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["a", "b"], access=[[], [0]])
    wf, run, _ = setup(write_config, plan, fallback="llama-70b")
    run.request.stream = True
    (first,) = [a for a in wf.advance(run) if isinstance(a, Dispatch)]
    assert not first.task.stream, "earlier steps are not streamed"
    wf.on_completed("r1", completed(0, "x"))
    (last,) = [a for a in wf.advance(run) if isinstance(a, Dispatch)]
    assert last.task.stream and last.task.reply_partition == 3
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]), fallback="llama-70b")
    run.request.stream = True
    wf.advance(run)
    wf.on_failed("r1", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(code="provider_error")))
    (fallback,) = [a for a in wf.advance(run) if isinstance(a, Dispatch)]
    assert fallback.task.worker == "llama-70b" and fallback.task.stream, "a fallback still answers"
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]))
    assert not wf.advance(run)[0].task.stream, "a request that does not stream"


def test_a_plan_delivered_again_after_its_workflow_finished_does_not_run_again(write_config):
    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro"], subtasks=["a"], access=[[]]))
    wf.advance(run)
    wf.on_completed("r1", completed(0, "done"))
    wf.advance(run)
    wf.forget("r1")
    again = workflow_pb2.WorkflowPlanned(request=run.request, plan=run.plan_proto)
    assert wf.on_planned(again) is None and "r1" not in wf.runs


def test_a_conductor_step_becomes_an_inner_request_whose_result_returns_as_the_step(write_config):
    from baton_synthesizer.runs import Replan, Return

    plan = Plan(workers=["gemini-pro", "gemini-flash", "conductor"], subtasks=["solve", "unrelated", "check"],
                access=[[], [], [0]])
    wf, run, clock = setup(write_config, plan, budget=common_pb2.Budget(max_calls=6))
    wf.advance(run)
    wf.on_completed("r1", completed(0, "first answer"))
    wf.on_completed("r1", completed(1, "not readable"))
    actions = wf.advance(run)
    (replan,) = [a for a in actions if isinstance(a, Replan)]
    inner = replan.request
    assert inner.request_id == "r1:2:1" and inner.messages[0].content == "Q?"
    # The inner call sees exactly the steps the conductor step may read, and their last answer.
    assert inner.parent.request_id == "r1" and inner.parent.step == 2 and inner.parent.depth == 1
    assert [(s.worker, s.instruction, s.output) for s in inner.parent.steps] == [("gemini-pro", "solve", "first answer")]
    assert inner.parent.last_answer == "first answer"
    assert inner.budget.max_calls == 3, "six calls less the two steps and the conductor step itself"

    # The corrective workflow runs like any other; its steps see the workflow it corrects.
    child_plan = Plan(workers=["llama-70b"], subtasks=["fix it"], access=[[]])
    child = wf.on_planned(workflow_pb2.WorkflowPlanned(request=inner, plan=to_proto(child_plan, backend="static")))
    (task,) = wf.advance(child)
    assert task.task.request_id == "r1:2:1" and "first answer" in task.task.messages[0].content
    assert "not readable" not in task.task.messages[0].content
    wf.on_completed("r1:2:1", workflow_pb2.StepCompleted(step=0, attempt=1, output="fixed answer", usage=common_pb2.Usage(
        cost_usd=0.25, calls=1)))
    (ret,) = wf.advance(child)
    assert isinstance(ret, Return) and ret.event.request_id == "r1"
    done = ret.event.step_completed
    assert (done.task_id, done.step, done.attempt, done.worker) == ("r1:2:1", 2, 1, "conductor")
    assert done.output == "fixed answer" and done.usage.calls == 1 and done.inner_plan.steps[0].worker == "llama-70b"
    wf.forget("r1:2:1")

    wf.on_completed("r1", done)
    (finish,) = wf.advance(run)
    assert finish.response.answer == "fixed answer"
    record = finish.response.episode.steps[2]
    assert record.worker == "conductor" and record.inner_plan.steps[0].instruction == "fix it"
    assert finish.response.episode.total.calls == 3


def test_a_failed_corrective_workflow_fails_the_conductor_step_with_its_reason(write_config):
    from baton_synthesizer.runs import Replan, Return

    wf, run, _ = setup(write_config, Plan(workers=["gemini-pro", "conductor"], subtasks=["a", "b"], access=[[], "all"]))
    wf.advance(run)
    wf.on_completed("r1", completed(0, "x"))
    (replan,) = [a for a in wf.advance(run) if isinstance(a, Replan)]
    child = wf.on_planned(workflow_pb2.WorkflowPlanned(request=replan.request, plan=to_proto(
        Plan(workers=["llama-70b"], subtasks=["fix"], access=[[]]), backend="static")))
    wf.advance(child)
    wf.on_failed("r1:1:1", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(code="x", message="401 bad key")))
    (ret,) = wf.advance(child)
    assert isinstance(ret, Return) and "the corrective workflow failed" in ret.event.step_failed.error.message
    wf.on_failed("r1", ret.event.step_failed)
    (finish,) = wf.advance(run)
    assert finish.response.error.code == "step_failed" and "step 2 (conductor) failed" in finish.response.error.message


def test_a_conductor_step_has_time_for_a_whole_inner_workflow(write_config):
    wf, run, clock = setup(write_config, Plan(workers=["conductor"], subtasks=["a"], access=[[]]), step_timeout=1.0)
    wf.advance(run)
    clock.now += 2_000
    assert wf.expired() == [], "one step's timeout is too short for planning and running a workflow"
    clock.now += 10_000
    ((_, (finish,)),) = wf.expired()
    assert finish.response.error.code == "step_timeout"
    from testbed import default_config_data

    max_steps = load_config(write_config(data=default_config_data())).conductor.max_steps
    assert f"within {max_steps + 1} s" in finish.response.error.message


def judged_group(write_config, wait_s=None, stream=False, actions=None):
    """Three candidates of one exploration group, judged by gemini-pro; returns the workflows and the runs."""
    from testbed import default_config_data

    data = default_config_data()
    data["synthesizer"] = {"group_answer": "judge"}
    data["judge"] = {"worker": "gemini-pro", **({"wait_s": wait_s} if wait_s else {})}
    clock = Clock()
    wf = workflows(load_config(write_config(data=data)), clock)
    plan = to_proto(Plan(workers=["gemini-flash"], subtasks=["a"], access=[[]]), backend="static")
    runs = []
    for k in range(3):
        request = requests_pb2.ChatRequest(request_id="g" if k == 0 else f"g.{k}", group_id="g", candidate=k,
                                           group_size=3, reply_partition=1, created_unix_ms=clock.now,
                                           tenant="acme",
                                           messages=[common_pb2.ChatMessage(role="user", content="Q?")],
                                           stream=stream and k == 0)
        runs.append(wf.on_planned(workflow_pb2.WorkflowPlanned(request=request, plan=plan)))
        (actions if actions is not None else []).extend(wf.advance(runs[-1]))
    return wf, runs, clock


def test_a_judged_groups_answer_is_not_streamed_as_it_may_be_another_candidates(write_config):
    actions = []
    judged_group(write_config, stream=True, actions=actions)
    tasks = [a.task for a in actions if isinstance(a, Dispatch)]
    assert len(tasks) == 3 and not any(t.stream for t in tasks)


def finish_candidate(wf, run, answer):
    """The candidate's one step completes; returns what the synthesizer does next."""
    wf.on_completed(run.request.request_id, workflow_pb2.StepCompleted(step=0, attempt=1, output=answer,
                                                                      usage=common_pb2.Usage(calls=1)))
    actions = wf.advance(run)
    return actions[0] if len(actions) == 1 else actions


def test_the_judge_gives_the_client_the_best_candidates_answer_and_rates_every_one(write_config):
    from baton_synthesizer.runs import Rate

    wf, (primary, one, two), clock = judged_group(write_config)
    assert finish_candidate(wf, primary, "The answer is (A).") == []  # waits for the others
    report = finish_candidate(wf, one, "The answer is (B).").report
    assert report.request_id == "g" and report.candidate_finished.candidate == 1
    assert wf.on_candidate("g", report.candidate_finished) is primary and wf.advance(primary) == []
    report = finish_candidate(wf, two, "The answer is (C).").report
    wf.on_candidate("g", report.candidate_finished)
    (judge,) = wf.advance(primary)
    assert isinstance(judge, Dispatch) and judge.task.worker == "gemini-pro" and judge.task.step == 1
    assert list(judge.task.candidates) == ["The answer is (A).", "The answer is (B).", "The answer is (C)."]
    assert "Answer 3:\nThe answer is (C)." in judge.task.messages[1].content
    wf.on_completed("g", workflow_pb2.StepCompleted(step=1, attempt=1, output='{"scores": [2, 9, 9]}',
                                                     usage=common_pb2.Usage(cost_usd=0.01, calls=1)))
    *rates, finish = wf.advance(primary)
    assert finish.response.answer == "The answer is (B).", "the best score; a tie goes to the earlier candidate"
    judge_record = finish.response.episode.judge
    assert list(judge_record.request_ids) == ["g", "g.1", "g.2"] and judge_record.chosen == 1
    assert judge_record.own_answer == "The answer is (A)."
    assert finish.response.episode.total.calls == 2, "its own step and the judge's call"
    assert all(isinstance(r, Rate) for r in rates)
    assert [(r.feedback.response_id, r.feedback.score, r.feedback.source, r.feedback.tenant) for r in rates] == [
        ("g", 0.2, "judge", "acme"), ("g.1", 0.9, "judge", "acme"), ("g.2", 0.9, "judge", "acme")]


def test_without_a_usable_judgement_the_client_gets_its_own_candidates_answer(write_config):
    wf, (primary, one, two), clock = judged_group(write_config, wait_s=5)
    assert finish_candidate(wf, primary, "mine") == []
    wf.on_candidate("g", finish_candidate(wf, one, "theirs").report.candidate_finished)
    clock.now += 6_000  # the third candidate never reports: judge what came in
    ((_, (judge,)),) = wf.expired()
    assert list(judge.task.candidates) == ["mine", "theirs"]
    wf.on_completed("g", workflow_pb2.StepCompleted(step=1, attempt=1, output="Both look fine to me."))
    (finish,) = wf.advance(primary)
    assert finish.response.answer == "mine" and "no {\"scores\": [...]} object" in finish.response.episode.judge.error
    assert list(finish.response.episode.judge.scores) == []


def test_judge_replies_are_read_strictly():
    import pytest

    from baton_synthesizer.judge import best, parse_scores

    assert parse_scores('Scores follow. {"scores": [10, 0, 7.5]}', 3) == [1.0, 0.0, 0.75]
    with pytest.raises(ValueError, match="scored 2 answers, not 3"):
        parse_scores('{"scores": [1, 2]}', 3)
    with pytest.raises(ValueError, match="not numbers from 0 to 10"):
        parse_scores('{"scores": [1, 11, 2]}', 3)
    assert best([0.5, 0.9, 0.9]) == 1 and best([0.0, 0.0]) == 0


def test_when_the_clients_own_workflow_fails_the_group_still_answers(write_config):
    wf, (primary, one, two), clock = judged_group(write_config)
    wf.on_failed("g", workflow_pb2.StepFailed(step=0, attempt=1, error=common_pb2.Error(code="x", message="HTTP 500")))
    assert wf.advance(primary) == [], "it waits for the others instead of failing"
    for run, answer in ((one, "The answer is (B)."), (two, "The answer is (C).")):
        wf.on_candidate("g", finish_candidate(wf, run, answer).report.candidate_finished)
    (judge,) = wf.advance(primary)
    assert list(judge.task.candidates) == ["The answer is (B).", "The answer is (C)."]
    wf.on_completed("g", workflow_pb2.StepCompleted(step=1, attempt=1, output='{"scores": [1, 9]}'))
    *rates, finish = wf.advance(primary)
    assert finish.response.answer == "The answer is (C)."
    judgement = finish.response.episode.judge
    assert list(judgement.request_ids) == ["g.1", "g.2"] and "HTTP 500" in judgement.own_error.message
    assert [r.feedback.response_id for r in rates] == ["g.1", "g.2"]


def test_a_failed_group_fails_the_request_with_the_clients_own_error(write_config):
    wf, (primary, one, two), clock = judged_group(write_config, wait_s=5)
    clock.now += 61_000  # the client's own step is never answered
    ((_, actions),) = [(r, a) for r, a in wf.expired() if r is primary]
    assert actions == [], "the others may still answer"
    wf.on_candidate("g", workflow_pb2.CandidateFinished(request_id="g.1", candidate=1,
                                                        error=common_pb2.Error(code="step_failed", message="boom")))
    clock.now += 6_000
    ((_, (finish,)),) = [(r, a) for r, a in wf.expired() if r is primary]
    assert finish.response.error.code == "step_timeout"


def test_only_the_answering_step_gets_the_clients_options_and_tool_turns(write_config):
    from testbed import default_config_data

    config = load_config(write_config(data=default_config_data()))
    wf = workflows(config, Clock())
    request = requests_pb2.ChatRequest(request_id="r1", max_tokens=5, temperature=0.3, messages=[
        common_pb2.ChatMessage(role="user", content="Weather in Oslo?"),
        common_pb2.ChatMessage(role="assistant", tool_calls=[
            common_pb2.ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}')]),
        common_pb2.ChatMessage(role="tool", tool_call_id="c1", name="get_weather", content="Rain")])
    request.answer.tools.add(name="get_weather", parameters_json="{}")
    request.answer.response_format = "json_object"
    plan = Plan(workers=["gemini-pro", "gemini-flash"], subtasks=["draft", "answer"], access=[[], [0]])
    run = wf.on_planned(workflow_pb2.WorkflowPlanned(request=request, plan=to_proto(plan, backend="static")))
    (draft,) = wf.advance(run)
    assert not draft.task.HasField("answer") and draft.task.max_tokens == 0 and not draft.task.HasField("temperature")
    # The drafting step sees the tool exchange as text: it has no tools to make sense of tool turns.
    assert [m.role for m in draft.task.messages] == ["system", "user", "assistant", "user"]
    assert "get_weather" in draft.task.messages[2].content and "Rain" in draft.task.messages[3].content
    wf.on_completed("r1", completed(0, "draft"))
    (answer,) = wf.advance(run)
    assert answer.task.answer.tools[0].name == "get_weather" and answer.task.answer.response_format == "json_object"
    assert answer.task.max_tokens == 5 and round(answer.task.temperature, 3) == 0.3
    assert [m.role for m in answer.task.messages] == ["system", "user", "assistant", "tool"]
    assert answer.task.messages[2].tool_calls[0].id == "c1" and answer.task.messages[3].tool_call_id == "c1"
    done = completed(1, "")
    done.tool_calls.add(id="c2", name="get_weather", arguments='{"city": "Bergen"}')
    done.finish_reason = "tool_calls"
    wf.on_completed("r1", done)
    (finish,) = wf.advance(run)
    assert finish.response.answer == "" and finish.response.tool_calls[0].id == "c2"
    assert finish.response.finish_reason == "tool_calls"


def test_a_one_step_workflow_answered_at_the_executor_gets_the_response_the_synthesizer_would_give(write_config):
    """router.direct_single_step: the router's task is the synthesizer's, and the executor's final
    response (baton_workflow.steps.one_step_response) is the synthesizer's, answer or failure."""
    from baton_router.handlers import direct_task
    from baton_workflow.steps import one_step_response

    plan = Plan(workers=["gemini-pro"], subtasks=["Answer."], access=[[]])
    for outcome in ("completed", "failed"):
        wf, run, clock = setup(write_config, plan)
        (dispatch,) = wf.advance(run)
        task = direct_task(run.request, run.plan_proto, wf._workers)
        assert task is not None and task.workflow.request == run.request and task.workflow.plan == run.plan_proto
        task.ClearField("workflow")
        assert task == dispatch.task
        clock.now += 250
        if outcome == "completed":
            result = workflow_pb2.WorkflowEvent(request_id="r1", step_completed=completed(0, "the answer"))
            result.step_completed.worker, result.step_completed.model = "gemini-pro", "gemini-1.5-pro-002"
            result.step_completed.finish_reason = "stop"
            wf.on_completed("r1", result.step_completed)
        else:
            result = workflow_pb2.WorkflowEvent(request_id="r1", step_failed=workflow_pb2.StepFailed(
                task_id="r1:0:1", step=0, attempt=1, worker="gemini-pro",
                error=common_pb2.Error(code="provider_error", message="429 from upstream")))
            wf.on_failed("r1", result.step_failed)
        (finish,) = wf.advance(run)
        planned = workflow_pb2.WorkflowPlanned(request=run.request, plan=run.plan_proto)
        assert one_step_response(planned, result, clock.now) == finish.response, outcome


def test_only_a_one_step_client_workflow_without_stream_or_group_goes_straight_to_the_executor():
    from baton_platform.config import WorkerConfig
    from baton_router.handlers import direct_task

    workers = {"a": WorkerConfig.model_construct(name="a", provider="openai_compatible", fallback=None),
               "b": WorkerConfig.model_construct(name="b", provider="sim", fallback="a")}
    request = requests_pb2.ChatRequest(request_id="r", messages=[common_pb2.ChatMessage(role="user", content="Q?")],
                                       max_tokens=7, deadline_unix_ms=123, reply_partition=2)
    one = to_proto(Plan(workers=["a"], subtasks=["Answer."], access=[[]]), backend="static")
    task = direct_task(request, one, workers)
    assert task is not None and (task.task_id, task.worker, task.max_tokens, task.deadline_unix_ms) == ("r:0:1", "a", 7, 123)
    assert task.workflow.request.reply_partition == 2 and task.workflow.planned_unix_ms > 0
    two = to_proto(Plan(workers=["a", "a"], subtasks=["Draft.", "Answer."], access=[[], [0]]), backend="static")
    with_fallback = to_proto(Plan(workers=["b"], subtasks=["Answer."], access=[[]]), backend="static")
    conductor = to_proto(Plan(workers=["conductor"], subtasks=["Plan."], access=[[]]), backend="static")
    streamed, inner, candidate = (requests_pb2.ChatRequest(), requests_pb2.ChatRequest(), requests_pb2.ChatRequest())
    for r in (streamed, inner, candidate):
        r.CopyFrom(request)
    streamed.stream = True
    inner.parent.request_id = "p"
    candidate.group_size = 4
    assert direct_task(request, two, workers) is None
    # Its executor hands it to the synthesizer if the step fails (see test_executor_consumer.py).
    assert direct_task(request, with_fallback, workers).worker == "b"
    assert direct_task(request, conductor, workers) is None
    assert all(direct_task(r, one, workers) is None for r in (streamed, inner, candidate))
