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
     "messages.1.role"),
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


def test_feedback_is_validated_and_joins_on_the_request_id():
    from baton_gateway.api import parse_feedback

    fb = parse_feedback(json.dumps({"response_id": "chatcmpl-abc", "score": 1, "comment": "good"}).encode())
    assert fb.response_id == "abc" and fb.score == 1.0 and fb.comment == "good"
    with pytest.raises(ApiError, match="score"):
        parse_feedback(json.dumps({"response_id": "x", "score": 5}).encode())
    with pytest.raises(ApiError, match="response_id"):
        parse_feedback(b'{"score": 0}')


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
