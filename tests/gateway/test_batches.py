"""The Batch API's rules without a broker: input lines are checked, each rule naming its line; records
of baton.batches are checked as they are read; a cancel is a record of its own, only the batch's
tenant's counts, and from then on the batch reads as cancelling."""

import json

import pytest

from baton_gateway.api import ApiError
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


class Endpoint:
    """Answers each line as the chat endpoint would, or refuses the model it does not know."""

    def __init__(self):
        self.asked = []

    async def __call__(self, raw, principal, span, key):
        body = json.loads(raw)
        self.asked.append((body["model"], key.slot, principal.batch))
        if body["model"] != "baton":
            raise ApiError(404, "The model does not exist", code="model_not_found", param="model")
        return f"r{len(self.asked)}", {"object": "chat.completion", "choices": [{"message": {"content": "ok"}}]}


def runner_for(tmp_path, endpoint):
    from opentelemetry.trace import NoOpTracer

    from baton_gateway.batch_runner import BatchRunner
    from baton_gateway.files import FileStore
    from baton_platform.config import GatewayConfig

    files, batches = FileStore(str(tmp_path / "files"), 10**6), Batches(None, None)
    runner = BatchRunner(batches, files, str(tmp_path / "files"), {ENDPOINT: endpoint}, NoOpTracer(), GatewayConfig(),
                         owns=lambda partition: True, interactive_waiting=lambda: 0)
    return runner, batches, files


async def submitted(batches, files, content: bytes, **changes) -> Batch:
    upload = await files.put("acme", "in.jsonl", "batch", content)
    b = Batch("acme", "k1", ["chat"], ["*"], new_batch_object(upload["id"], ENDPOINT, None, content.count(b"\n") + 1))
    b.object.update(changes)
    await batches.save(b)
    return b


async def test_a_batch_runs_each_line_once_and_writes_its_output_and_error_files(tmp_path):
    endpoint = Endpoint()
    runner, batches, files = runner_for(tmp_path, endpoint)
    b = await submitted(batches, files, line("a") + b"\n" + line("b", body={"model": "nope", "messages": []}))
    await runner._drive(b.id)
    assert b.status == "completed" and b.object["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    out = [json.loads(x) for x in (await files.content("acme", b.object["output_file_id"])).splitlines()]
    err = [json.loads(x) for x in (await files.content("acme", b.object["error_file_id"])).splitlines()]
    assert [(o["custom_id"], o["response"]["status_code"]) for o in out] == [("a", 200)]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in err] == [("b", 404)]
    assert len({slot for _, slot, _ in endpoint.asked}) == 2 and all(batch for _, _, batch in endpoint.asked)


async def test_a_batch_taken_over_asks_only_the_lines_not_answered_yet(tmp_path):
    from baton_gateway.batch_runner import Progress

    endpoint = Endpoint()
    runner, batches, files = runner_for(tmp_path, endpoint)
    b = await submitted(batches, files, b"\n".join(line(c) for c in "abc"), status="in_progress")
    # What the last replica answered and kept before it died.
    await Progress(str(tmp_path / "files"), b.id).add([{"id": "x", "custom_id": "b", "error": None, "response": {
        "status_code": 200, "request_id": "r0", "body": {}}}])
    await runner._drive(b.id)
    assert len(endpoint.asked) == 2 and b.object["request_counts"]["completed"] == 3


async def test_a_batch_past_its_window_or_cancelled_starts_no_line(tmp_path):
    endpoint = Endpoint()
    runner, batches, files = runner_for(tmp_path, endpoint)
    late = await submitted(batches, files, line("a"), expires_at=1)
    await runner._drive(late.id)
    stopped = await submitted(batches, files, line("a"))
    await batches.cancel(stopped)
    await runner._drive(stopped.id)
    assert (late.status, stopped.status, endpoint.asked) == ("expired", "cancelled", [])
    assert stopped.object["cancelling_at"] and stopped.object["cancelled_at"]
