"""The conductor's prompt, plan schema, grammar and parser, and the conductor config section."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError
from testbed import default_config_data, pool

from baton.v1 import common_pb2, requests_pb2
from baton_conductor.prompt import DEFAULT_CARD, conductor_messages, copies_example, example_plan, question
from baton_conductor.schema import PlanBounds, parse_plan, plan_grammar, plan_json_schema, plan_model, subtask_limits
from baton_platform.config import (
    BatonConfig,
    ConductorConfig,
    OpenAIConductorConfig,
    TransformersConductorConfig,
    VllmConductorConfig,
)
from baton_router.conductor import ConductorOutputError, build_backend
from baton_router.conductor.llm import PlanPrompter
from baton_workflow import plan_problems

NAMES = ["gemini-pro", "gemini-flash", "llama-70b"]


def config(**conductor) -> BatonConfig:
    data = default_config_data()
    data["conductor"] = {**data["conductor"], **conductor}
    return BatonConfig(**data)


def ask(text: str, policy: str = "baton") -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(request_id="r1", policy=policy, messages=[
        common_pb2.ChatMessage(role="system", content="Be brief."),
        common_pb2.ChatMessage(role="user", content="An earlier question"),
        common_pb2.ChatMessage(role="assistant", content="An earlier answer"),
        common_pb2.ChatMessage(role="user", content=text),
    ])


def test_the_prompt_shows_the_pool_as_cards_by_index_and_never_names_a_worker():
    cfg = config(evidence=None)
    messages = PlanPrompter(*pool(cfg)).messages(ask("Which planet is largest?"))
    system, user = messages
    assert system["role"] == "system" and user == {"role": "user", "content": "Which planet is largest?"}
    for i, worker in enumerate(cfg.workers):
        assert f"Model {i}: {worker.card}" in system["content"]
    text = json.dumps(messages).lower()
    for worker in cfg.workers:
        assert worker.name.lower() not in text and worker.model.lower() not in text
    for brand in ("gemini", "llama", "gpt", "claude"):
        assert brand not in text
    assert '"model_id"' in system["content"] and '"access_list"' in system["content"]
    assert f"at most {cfg.conductor.max_steps} steps" in system["content"]


def test_a_worker_without_a_card_gets_a_neutral_one_and_the_example_is_optional():
    data = default_config_data()
    data["workers"][1]["card"] = ""
    data["conductor"]["prompt_example"] = False
    system = PlanPrompter(*pool(BatonConfig(**data))).messages(ask("q"))[0]["content"]
    assert f"Model 1: {DEFAULT_CARD}" in system
    assert "Example" not in system
    assert "Example workflow" in PlanPrompter(*pool(config(prompt_example=True))).messages(ask("q"))[0]["content"]


def test_the_question_is_the_last_user_message_cut_to_its_limit():
    long = "word " * 1000
    assert question([{"role": "user", "content": long}], 100).endswith(" ...")
    assert len(question([{"role": "user", "content": long}], 100)) <= 104
    msgs = conductor_messages([{"role": "user", "content": "first"}, {"role": "user", "content": "second"}],
                              ["card"], PlanBounds(1, 3))
    assert msgs[1]["content"] == "second"


def test_the_example_plan_in_the_prompt_is_itself_a_valid_plan_for_the_pool():
    bounds = PlanBounds(3, 5, 160)
    system = conductor_messages([{"role": "user", "content": "q"}], ["a", "b", "c"], bounds)[0]["content"]
    example = system.split("Example workflow: ")[1].strip()
    plan = parse_plan(example, NAMES, bounds)
    assert plan_problems(plan, NAMES, 5) == []
    single = conductor_messages([{"role": "user", "content": "q"}], ["a"], PlanBounds(1, 1))[0]["content"]
    one_step = parse_plan(single.split("Example workflow: ")[1], ["only"], PlanBounds(1, 1))
    assert plan_problems(one_step, ["only"], 1) == []


def test_the_schema_bounds_steps_strings_and_model_ids():
    bounds = PlanBounds(pool_size=3, max_steps=4, max_subtask_chars=50)
    schema = plan_json_schema(bounds)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"model_id", "subtasks", "access_list"}
    props = schema["properties"]
    for key in ("model_id", "subtasks", "access_list"):
        assert (props[key]["minItems"], props[key]["maxItems"]) == (1, 4)
    assert (props["model_id"]["items"]["minimum"], props["model_id"]["items"]["maximum"]) == (0, 2)
    assert (props["subtasks"]["items"]["minLength"], props["subtasks"]["items"]["maxLength"]) == (1, 50)
    access = props["access_list"]["items"]["anyOf"]
    assert {"const": "all", "type": "string"} in access
    lists = next(a for a in access if a.get("type") == "array")
    assert lists["maxItems"] == 3 and lists["items"]["maximum"] == 2
    model = plan_model(bounds)
    ok = {"model_id": [2, 0], "subtasks": ["a", "b"], "access_list": [[], [0]]}
    assert model.model_validate(ok)
    for bad in ({**ok, "model_id": [3, 0]}, {**ok, "subtasks": ["x" * 51, "b"]}, {**ok, "subtasks": ["", "b"]},
                {**ok, "model_id": [0] * 5}, {**ok, "extra": 1}, {**ok, "access_list": ["some", []]}):
        with pytest.raises(ValidationError):
            model.model_validate(bad)


def test_parsing_maps_indices_to_worker_names_and_leaves_plan_rules_to_the_planner():
    bounds = PlanBounds(3, 5)
    plan = parse_plan('{"model_id": [1, 0, 2], "subtasks": ["draft", "check", "final"], '
                      '"access_list": [[], [0], "all"]}', NAMES, bounds)
    assert plan.workers == ["gemini-flash", "gemini-pro", "llama-70b"]
    assert plan.access == [[], [0], "all"]
    # Unequal lengths and forward references parse; plan_problems rejects them.
    uneven = parse_plan('{"model_id": [1, 0], "subtasks": ["a"], "access_list": [[1], []]}', NAMES, bounds)
    problems = plan_problems(uneven, NAMES, 5)
    assert problems and "differ in length" in problems[0]
    too_long = parse_plan(json.dumps({"model_id": [0] * 7, "subtasks": ["a"] * 7, "access_list": [[]] * 7}),
                          NAMES, bounds)
    assert "the plan has 7 steps; at most 5 are allowed" in plan_problems(too_long, NAMES, 5)


@pytest.mark.parametrize("text, why", [
    ('{"model_id": [1, 0], "subtasks": ["a", "b"], "access_list": [[], [0]', "not JSON"),
    ('["a"]', "not a JSON object"),
    ('{"model_id": [9], "subtasks": ["a"], "access_list": [[]]}', "model_id.0"),
    ('{"model_id": [0], "subtasks": ["a"]}', "access_list"),
])
def test_text_that_is_not_a_plan_raises_a_clear_error(text, why):
    with pytest.raises(ConductorOutputError, match=why) as err:
        parse_plan(text, NAMES, PlanBounds(3, 5))
    assert err.value.text == text


def test_the_prompter_keeps_log_probs_on_an_unparseable_answer():
    with pytest.raises(ConductorOutputError) as err:
        PlanPrompter(*pool(config())).proposal('{"model_id": [0', [-0.5, -1.0], math.log(0.25), "v1")
    assert err.value.token_logprobs == [-0.5, -1.0] and err.value.propensity == pytest.approx(0.25)
    assert err.value.log_propensity == math.log(0.25)
    assert err.value.policy_version == "v1"


def test_the_grammar_accepts_only_equal_lengths_and_earlier_access():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_ebnf(plan_grammar(PlanBounds(pool_size=3, max_steps=3, max_subtask_chars=20)))
    good = [
        '{"model_id": [2], "subtasks": ["Answer it."], "access_list": [[]]}',
        '{"model_id": [1, 0], "subtasks": ["Solve it.", "Check it."], "access_list": [[], [0]]}',
        '{"model_id": [2, 0, 1], "subtasks": ["a", "b", "c"], "access_list": [[], "all", [1, 0]]}',
    ]
    bad = [
        '{"model_id": [1, 0], "subtasks": ["Solve it."], "access_list": [[], [0]]}',  # unequal lengths
        '{"model_id": [1, 0], "subtasks": ["a", "b"], "access_list": [[], [1]]}',  # reads itself
        '{"model_id": [1], "subtasks": ["a"], "access_list": [[0]]}',  # first step reads a later one
        '{"model_id": [3], "subtasks": ["a"], "access_list": [[]]}',  # no model 3 in a pool of 3
        '{"model_id": [0], "subtasks": [" a"], "access_list": [[]]}',  # blank-led instruction
        '{"model_id": [0], "subtasks": ["' + "x" * 21 + '"], "access_list": [[]]}',  # too long
        '{"model_id": [0, 0, 0, 0], "subtasks": ["a", "b", "c", "d"], "access_list": [[], [0], [1], [2]]}',
    ]
    for text in good:
        assert _is_grammar_accept_string(grammar, text), text
        assert plan_problems(parse_plan(text, NAMES, PlanBounds(3, 3, 20)), NAMES, 3) == []
    for text in bad:
        assert not _is_grammar_accept_string(grammar, text), text


def test_conductor_config_sections_are_checked():
    assert ConductorConfig().backend == "static"
    with pytest.raises(ValidationError, match="needs a `conductor.openai:` section"):
        ConductorConfig(backend="openai")
    with pytest.raises(ValidationError, match="needs a `conductor.vllm:` section"):
        ConductorConfig(backend="vllm")
    with pytest.raises(ValidationError, match="default_adapter 'b' is not one of adapters"):
        ConductorConfig(backend="vllm", vllm={"model": "/m", "adapters": {"a": "/a"}, "default_adapter": "b"})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ConductorConfig(transformers={"batchsize": 4})
    cfg = ConductorConfig(backend="transformers", transformers={"batch_size": 4, "temperature": 0})
    assert cfg.transformers.batch_size == 4 and cfg.transformers.model_path is None
    for section in (ConductorConfig.model_fields, TransformersConductorConfig.model_fields,
                    OpenAIConductorConfig.model_fields, VllmConductorConfig.model_fields):
        undocumented = [n for n, f in section.items() if n not in ("plan", "max_steps") and not f.description]
        assert undocumented == []


async def test_building_a_model_backend_is_cheap_and_imports_no_model_library():
    import sys

    before = {m for m in ("torch", "transformers", "vllm") if m in sys.modules}
    for backend, extra in (("transformers", {}),
                           ("openai", {"openai": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}),
                           ("vllm", {"vllm": {"model": "/models/conductor"}})):
        conductor = build_backend(*pool(config(backend=backend, **extra)))
        assert conductor.name == backend and conductor.ready is (backend == "openai")
        await conductor.aclose()
    assert {m for m in ("torch", "transformers", "vllm") if m in sys.modules} == before


@pytest.mark.parametrize("bounds", [PlanBounds(3, 5, 160, token_budget=320), PlanBounds(12, 8, 200, token_budget=400),
                                    PlanBounds(2, 5, 160, token_budget=64)])
def test_with_a_token_budget_the_longest_plan_the_grammar_allows_fits_in_it(bounds):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_ebnf(plan_grammar(bounds))
    limits = subtask_limits(bounds)
    assert list(limits) == list(range(1, max(limits) + 1))
    assert all(v <= bounds.max_subtask_chars for v in limits.values())
    widest = str(bounds.pool_size - 1)

    def longest(k: int, chars: int) -> str:
        # Every list at its widest: top model ids, full instructions, each step reading all earlier ones.
        access = ["[]"] + ['"all"' if i == 1 else "[" + ", ".join([str(i - 1)] * i) + "]" for i in range(1, k)]
        tasks = ", ".join(['"' + "x" * chars + '"'] * k)
        return ('{"model_id": [' + ", ".join([widest] * k) + '], "subtasks": [' + tasks
                + '], "access_list": [' + ", ".join(access) + "]}")

    for k, chars in limits.items():
        # Instructions are ASCII, so each token covers at least one character; one token is left for the end.
        assert _is_grammar_accept_string(grammar, longest(k, chars))
        assert len(longest(k, chars)) <= bounds.token_budget - 1
        assert not _is_grammar_accept_string(grammar, longest(k, chars + 1))
    assert not _is_grammar_accept_string(grammar, '{"model_id": [0], "subtasks": ["caf\u00e9"], "access_list": [[]]}')
    with pytest.raises(ValueError, match="too small"):
        subtask_limits(PlanBounds(3, 5, 160, token_budget=40))


def test_the_conductor_learns_that_the_last_step_gets_the_clients_tools():
    prompter = PlanPrompter(*pool(config()))
    request = ask("What is the weather in Paris?")
    assert "tools" not in prompter.messages(request)[1]["content"]
    request.answer.tools.add(name="get_weather", parameters_json="{}")
    request.answer.tools.add(name="get_time", parameters_json="{}")
    user = prompter.messages(request)[1]["content"]
    assert user.startswith("What is the weather in Paris?")
    assert "these tools: get_weather, get_time" in user and "Only the last step gets them" in user
    assert "already holds results" not in user
    request.messages.add(role="assistant", tool_calls=[common_pb2.ToolCall(id="c1", name="get_weather", arguments="{}")])
    request.messages.add(role="tool", tool_call_id="c1", name="get_weather", content="Sunny")
    assert "already holds results of tool calls" in prompter.messages(request)[1]["content"]


def test_a_plan_that_copies_the_worked_example_is_told_from_one_that_works_on_its_question():
    for max_steps in (1, 3):
        example = json.loads(example_plan(3, max_steps))
        assert copies_example(example["subtasks"])
    assert copies_example(["Compute 17*24 step by step.", "Name the capital of France."])
    assert copies_example(["  check the calculation and state the FINAL answer "])
    assert not copies_example(["Name the capital of France.", "Check the answer and state it."])
    assert not copies_example(["Compute 17 * 25 step by step."])
    assert not copies_example([])


def test_the_routers_estimate_follows_the_question_most_likely_worker_first_by_index():
    prompter = PlanPrompter(*pool(config(evidence=None)))
    chances = {"llama-70b": 0.614, "gemini-pro": 0.7449, "gemini-flash": 0.7451, "not-in-the-pool": 0.99}
    user = prompter.messages(ask("Which planet is largest?"), chances)[1]["content"]
    assert user == ("Which planet is largest?\n\nThe router's estimate of each model's chance to answer right: "
                    "Model 1 75%, Model 0 74%, Model 2 61%.")
    assert prompter.chat_messages("Which planet is largest?", chances)[1]["content"] == user
    assert prompter.messages(ask("Which planet is largest?"), {})[1]["content"] == "Which planet is largest?"


def test_a_configured_estimate_is_shown_to_each_request_but_not_to_an_inner_call(tmp_path):
    from baton_policy.evidence import Evidence
    from baton_policy.matrix import from_rows

    # Worker gemini-flash is right on arithmetic, gemini-pro on history; llama-70b never.
    rows = []
    for i in range(60):
        math = i % 2 == 0
        prompt = f"What is {i} plus {i + 3}?" if math else f"In which year did treaty number {i} end the war?"
        rows.append({"sample_id": str(i), "eval_name": "math" if math else "history", "prompt": prompt,
                     "gemini-pro": "0" if math else "1", "gemini-flash": "1" if math else "0", "llama-70b": "0"})
    fitted = Evidence.fit(from_rows(["sample_id", "eval_name", "prompt", *NAMES], rows))
    prompter = PlanPrompter(*pool(config(evidence=str(fitted.save(tmp_path / "evidence")))))
    user = prompter.messages(ask("What is 70 plus 73?"))[1]["content"]
    assert user.startswith("What is 70 plus 73?\n\nThe router's estimate of each model's chance to answer right: "
                           "Model 1 "), user
    assert prompter.messages(ask("In which year did treaty number 71 end the war?"))[1]["content"].split(": ")[1] \
        .startswith("Model 0 ")
    inner = ask("What is 70 plus 73?")
    inner.parent.depth = 1
    inner.parent.last_answer = "143"
    assert "estimate" not in prompter.messages(inner)[1]["content"]
    with pytest.raises(ValueError, match="no evidence.json"):
        PlanPrompter(*pool(config(evidence=str(tmp_path))))
