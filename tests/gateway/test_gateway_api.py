import json

import pytest

from baton_gateway.api import ApiError, parse_chat_request

MODELS = {"baton"}


def parse(body):
    return parse_chat_request(body if isinstance(body, bytes) else json.dumps(body).encode(), MODELS)


def test_a_plain_openai_request_parses():
    req = parse({"model": "baton", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "max_completion_tokens": 20, "frequency_penalty": 0.1})
    assert req.messages[0].text() == "hi" and req.max_completion_tokens == 20


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    ([1, 2], "must be a JSON object"),
    ({"model": "baton"}, "messages"),
    ({"model": "baton", "messages": []}, "at least one message"),
    ({"model": "baton", "messages": [{"role": "system", "content": "only system"}]}, "non-empty user message"),
    ({"model": "baton", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"model": "baton", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
     "messages.1.tool_call_id: Field required"),
    ({"model": "baton", "messages": [{"role": "user", "content": "x"}], "temperature": 7}, "temperature"),
    ({"model": "baton", "messages": [{"role": "user", "content": "x"}], "n": 3}, "n"),
    # Found by the fuzz suite: each once reached the wire format and failed there with a 500.
    ({"model": "baton", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2**38}, "max_tokens"),
    ({"model": "baton", "messages": [{"role": "user", "content": "x"}], "stream": "false"}, "stream"),
    (b'{"model": "baton", "messages": [{"role": "user", "content": "x\\udb98"}]}', "unpaired surrogate"),
])
def test_malformed_requests_get_a_400_that_says_why(body, fragment):
    with pytest.raises(ApiError) as err:
        parse(body)
    assert err.value.status == 400 and fragment in err.value.message
    assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_named():
    with pytest.raises(ApiError) as err:
        parse({"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]})
    assert err.value.status == 404 and err.value.code == "model_not_found" and "'gpt-5'" in err.value.message


def test_a_budget_rides_in_openai_metadata():
    from baton_gateway.api import budget_from

    b = budget_from({"baton_max_cost_usd": "0.05", "baton_max_calls": "3", "other": "x"})
    assert b.max_cost_usd == 0.05 and b.max_calls == 3
    with pytest.raises(ApiError, match="metadata.baton_max_calls must be a number"):
        budget_from({"baton_max_calls": "three"})
    for bad in ({"baton_max_cost_usd": "-1"}, {"baton_max_cost_usd": "nan"}, {"baton_max_calls": str(2**40)}):
        with pytest.raises(ApiError, match="must be positive and finite"):
            budget_from(bad)


def test_feedback_is_validated_joins_on_the_request_id_and_names_its_tenant():
    from baton_gateway.api import MAX_COMMENT_CHARS, parse_feedback

    fb = parse_feedback(json.dumps({"response_id": "chatcmpl-abc", "score": 1, "comment": "good"}).encode(), "acme")
    assert (fb.response_id, fb.score, fb.comment, fb.tenant, fb.source) == ("abc", 1.0, "good", "acme", "user")
    with pytest.raises(ApiError, match="score"):
        parse_feedback(json.dumps({"response_id": "x", "score": 5}).encode(), "acme")
    with pytest.raises(ApiError, match="response_id"):
        parse_feedback(b'{"score": 0}', "acme")
    with pytest.raises(ApiError, match="comment"):
        parse_feedback(json.dumps({"response_id": "x", "score": 0, "comment": "x" * (MAX_COMMENT_CHARS + 1)}).encode(),
                       "acme")
    with pytest.raises(ApiError, match="tenant"):  # the tenant is the key's, never the body's
        parse_feedback(json.dumps({"response_id": "x", "score": 0, "tenant": "other"}).encode(), "acme")


@pytest.mark.parametrize("value", [
    "", "quiz", ":q1", "quiz:", "-quiz:q1", "quiz set:q1", "q/z:q1", "s" * 65 + ":q1", "quiz:q1\n",
    "quiz:line\nbreak", "quiz:" + "x" * 508,
])
def test_a_malformed_eval_item_is_a_400_naming_metadata_baton_eval(value):
    with pytest.raises(ApiError) as err:
        parse({"model": "baton", "messages": [{"role": "user", "content": "x"}], "metadata": {"baton_eval": value}})
    assert err.value.status == 400 and err.value.param == "metadata.baton_eval"
    assert "metadata.baton_eval" in err.value.message and "SET:ID" in err.value.message


@pytest.mark.parametrize("value", ["quiz:q1", "mmlu_pro:mmlu-pro-70", "a.b-c_d:x:y z", "s" * 64 + ":1",
                                   "quiz:" + "x" * 507])
def test_a_well_formed_eval_item_parses_and_other_metadata_stays_accepted(value):
    # A client's grader and reference are accepted here and ignored by the reward logger.
    meta = {"baton_eval": value, "grader": "code", "reference": "x", "eval_name": "quiz"}
    assert parse({"model": "baton", "messages": [{"role": "user", "content": "x"}], "metadata": meta}).metadata == meta


USER = [{"role": "user", "content": "x"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("extra, param", [
    ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"store": True}, "store"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0.tool_calls"),
    ({"no_such_parameter": 1}, "no_such_parameter"),
    ({"n": 2}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"logit_bias": {"abc": 5}}, "logit_bias"),
    ({"top_p": 1.5}, "top_p"),
])
def test_every_unsupported_or_inconsistent_parameter_is_a_400_naming_it(extra, param):
    with pytest.raises(ApiError) as err:
        parse({"model": "baton", "messages": USER, **extra})
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert param.split(".")[0] in err.value.message


def test_a_tool_turn_must_answer_an_earlier_call():
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}
    ok = parse({"model": "baton", "tools": [TOOL], "messages": USER + [call, {
        "role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    assert ok.messages[2].role == "tool"
    with pytest.raises(ApiError) as err:
        parse({"model": "baton", "messages": USER + [call, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]})
    assert err.value.param == "messages.2" and "call_9" in err.value.message


def test_supported_parameters_reach_the_answer_options_and_messages():
    from baton_gateway.params import answer_options, messages_proto

    req = parse({"model": "baton", "messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}],
        "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False, "top_p": 0.5, "stop": "END", "seed": 7, "logprobs": True, "top_logprobs": 2,
        "user": "u1", "presence_penalty": 0.1, "frequency_penalty": 0.2, "logit_bias": {"50256": -100},
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"},
                                                                   "strict": True}},
        "store": False, "temperature": None})
    opts = answer_options(req)
    assert [t.name for t in opts.tools] == ["get_weather"] and json.loads(opts.tools[0].parameters_json) == \
        TOOL["function"]["parameters"]
    assert (opts.tool_choice, opts.tool_choice_name, opts.parallel_tool_calls) == ("function", "get_weather", False)
    assert (opts.response_format, opts.schema_name, opts.schema_strict) == ("json_schema", "w", True)
    assert json.loads(opts.schema_json) == {"type": "object"}
    assert (opts.top_p, list(opts.stop), opts.seed, opts.logprobs, opts.top_logprobs, opts.user) == \
        (0.5, ["END"], 7, True, 2, "u1")
    assert (round(opts.presence_penalty, 3), round(opts.frequency_penalty, 3)) == (0.1, 0.2)
    assert json.loads(opts.logit_bias_json) == {"50256": -100}
    msgs = messages_proto(req)
    assert msgs[1].tool_calls[0].name == "get_weather" and msgs[1].tool_calls[0].arguments == '{"city": "Oslo"}'
    assert (msgs[2].role, msgs[2].tool_call_id, msgs[2].name, msgs[2].content) == ("tool", "c1", "get_weather", "rain")


def test_a_schema_that_is_not_json_schema_is_a_400_naming_where():
    for body, param in (
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
         "response_format.json_schema.schema"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": "city"}}}]},
         "tools.0.function.parameters"),
    ):
        with pytest.raises(ApiError) as err:
            parse({"model": "baton", "messages": USER, **body})
        assert err.value.param == param and "not a valid JSON Schema" in err.value.message


def test_a_schema_pattern_that_cannot_match_in_linear_time_is_a_400_naming_it():
    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(\\w)\\1$"}}}
    with pytest.raises(ApiError) as err:
        parse({"model": "baton", "messages": USER,
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert err.value.param == "response_format.json_schema.schema"
    assert json.dumps(schema["properties"]["word"]["pattern"]) in err.value.message and "linear time" in err.value.message


def test_a_control_character_is_text_as_the_published_schema_counts_it():
    # The schema's `\S` is ECMA-262's, for which \x1f is not whitespace (found by the fuzz suite).
    assert parse({"model": "baton", "messages": [{"role": "user", "content": "\x1f"}]}).messages[0].text() == "\x1f"


@pytest.mark.parametrize("metadata", [{f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}])
def test_metadata_is_capped_as_openai_caps_it(metadata):
    """Every record of a workflow and every episode carries the metadata: 16 pairs, 64-character keys and
    512-character values at most."""
    with pytest.raises(ApiError) as err:
        parse({"model": "baton", "messages": [{"role": "user", "content": "x"}], "metadata": metadata})
    assert err.value.status == 400 and err.value.param == "metadata"
    parse({"model": "baton", "messages": [{"role": "user", "content": "x"}],
           "metadata": {f"k{i}": "v" * 512 for i in range(16)}})
