"""OpenAI's Files API through the official `openai` client, against the gateway of a running stack
(every service its own process on a real Kafka broker): a batch file uploaded, read back, listed and
deleted, kept per tenant beside the episodes."""

from __future__ import annotations

import openai
import pytest
from testbed import default_config_data, running_stack

from baton_platform.apikeys import hash_key, mint_key

ACME_KEY, OTHER_KEY = mint_key(), mint_key()
BATCH = b"".join(
    b'{"custom_id": "q%d", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "baton", "messages": [{"role": "user", "content": "What is %d+%d?"}]}}\n' % (i, i, i)
    for i in range(3))


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    data = default_config_data()
    data["gateway"] = {"auth": "keys"}
    data["tenants"] = [{"name": "acme", "keys": [{"sha256": hash_key(ACME_KEY)}]},
                       {"name": "other", "keys": [{"sha256": hash_key(OTHER_KEY)}]}]
    with running_stack(data, tmp_path_factory.mktemp("files"), kafka_bootstrap) as st:
        yield st


def client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)


def test_a_batch_file_round_trips_through_the_official_client_and_stays_its_tenants(stack):
    acme, other = client(stack, ACME_KEY), client(stack, OTHER_KEY)
    made = acme.files.create(file=("requests.jsonl", BATCH), purpose="batch")
    assert made.id.startswith("file-") and made.object == "file" and made.purpose == "batch"
    assert made.bytes == len(BATCH) and made.filename == "requests.jsonl" and made.status == "processed"
    # Kept beside the episodes (gateway.files_dir unset), under the tenant.
    assert (stack.dataset_dir / "files" / "acme" / f"{made.id}.content").read_bytes() == BATCH

    assert acme.files.retrieve(made.id) == made
    assert acme.files.content(made.id).read() == BATCH
    assert [f.id for f in acme.files.list(purpose="batch")] == [made.id]

    assert [f.id for f in other.files.list()] == []
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(made.id)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(made.id)

    deleted = acme.files.delete(made.id)
    assert deleted.id == made.id and deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve(made.id)
    assert list(acme.files.list()) == []


def test_a_file_that_is_not_jsonl_or_not_for_a_batch_is_refused_with_the_parameter_named(stack):
    acme = client(stack, ACME_KEY)
    with pytest.raises(openai.BadRequestError) as err:
        acme.files.create(file=("requests.jsonl", BATCH + b"not json\n"), purpose="batch")
    assert err.value.param == "file" and "line 4" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        acme.files.create(file=("requests.jsonl", BATCH), purpose="fine-tune")
    assert err.value.param == "purpose"
    with pytest.raises(openai.BadRequestError) as err:
        acme.files.create(file=("out.jsonl", BATCH), purpose="batch_output")
    assert err.value.param == "purpose"
    with pytest.raises(openai.AuthenticationError):
        client(stack, "bt-wrong").files.list()
