"""The Batch API's rules without a broker: input lines are checked, each rule naming its line; records
of baton.batches are checked as they are read; a cancel is a record of its own, only the batch's
tenant's counts, and from then on the batch reads as cancelling."""

import json

import pytest

from baton_gateway.api import ApiError
from baton_gateway.batch_runner import home_partition
from baton_gateway.batches import CANCEL, Batch, Batches, new_batch_object, parse_lines

ENDPOINT = "/v1/chat/completions"


def line(cid="a", **item):
    base = {"custom_id": cid, "method": "POST", "url": ENDPOINT,
            "body": {"model": "baton", "messages": [{"role": "user", "content": "hi"}]}}
    return json.dumps({**base, **item}).encode()


def test_the_lines_of_an_input_file_are_read_in_order_blank_lines_skipped():
    lines = parse_lines(line("a") + b"\n\n" + line("b") + b"\n", ENDPOINT, 10)
    assert [(x.number, x.custom_id) for x in lines] == [(1, "a"), (3, "b")]
    assert lines[0].body["messages"][0]["content"] == "hi"


@pytest.mark.parametrize("second, why", [
    (b"{not json", "line 2 of the input file is not JSON"),
    (b"[1, 2]", "line 2 of the input file is not a JSON object"),
    (line("a"), "line 2 of the input file repeats custom_id 'a'"),
    (line("b", custom_id=""), "line 2 of the input file needs a custom_id"),
    (line("b", method="GET"), "line 2 of the input file needs method POST"),
    (line("b", url="/v1/embeddings"), "line 2 of the input file has url '/v1/embeddings'"),
    (line("b", body="hi"), "line 2 of the input file needs a body object"),
])
def test_a_line_that_breaks_a_rule_is_a_400_naming_it(second, why):
    with pytest.raises(ApiError) as err:
        parse_lines(line("a") + b"\n" + second, ENDPOINT, 10)
    assert err.value.status == 400 and err.value.message.startswith(why) and err.value.param == "input_file_id"


def test_a_file_over_the_tenants_lines_or_with_none_is_refused():
    with pytest.raises(ApiError, match="more than 2 requests"):
        parse_lines(b"\n".join(line(str(i)) for i in range(3)), ENDPOINT, 2)
    with pytest.raises(ApiError, match="no requests"):
        parse_lines(b"\n \n", ENDPOINT, 2)


def batch(tenant="acme", status="in_progress") -> Batch:
    obj = new_batch_object("file-1", ENDPOINT, {"job": "nightly"}, 3)
    obj["status"] = status
    return Batch(tenant, "k1", ["chat"], ["*"], obj)


def test_records_that_are_not_batches_are_skipped():
    batches = Batches(None, None)
    good = batch()
    batches._take(good.id, json.dumps(good.record()).encode())
    batches._take("batch_" + "0" * 24, b"{not json")
    wrong_key = batch()
    batches._take("batch_" + "1" * 24, json.dumps(wrong_key.record()).encode())
    odd = batch(status="running")
    batches._take(odd.id, json.dumps(odd.record()).encode())
    assert [b.id for b in batches.of("acme")] == [good.id]
    assert batches.get("zeta", good.id) is None, "another tenant's batch is not found"
    assert batches.open_count("acme") == 1


def test_a_cancel_is_read_only_from_the_batchs_own_tenant_and_shows_as_cancelling():
    batches = Batches(None, None)
    b = batch()
    batches._take(b.id, json.dumps(b.record()).encode())
    batches._take(CANCEL + b.id, json.dumps({"tenant": "zeta", "at": 5}).encode())
    assert batches.cancel_asked(b.id) is None and batches.shown(b)["status"] == "in_progress"
    batches._take(CANCEL + b.id, json.dumps({"tenant": "acme", "at": 7}).encode())
    assert batches.cancel_asked(b.id) == 7
    assert (batches.shown(b)["status"], batches.shown(b)["cancelling_at"]) == ("cancelling", 7)
    b.object["status"] = "cancelled"
    assert batches.shown(b)["status"] == "cancelled"


def test_a_batch_has_one_home_partition_and_batches_spread_over_them():
    assert home_partition("batch_x", 4) == home_partition("batch_x", 4)
    homes = {home_partition(new_batch_object("f", ENDPOINT, None, 1)["id"], 4) for _ in range(64)}
    assert homes == {0, 1, 2, 3}
