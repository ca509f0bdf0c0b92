"""Who may name an evaluation item (metadata baton_eval): the gateway in process, through the
official OpenAI client, with no broker. A request that passes every check meets the unstarted
broker and gets a 503, which shows it was not refused."""

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from testbed import default_config_data

from baton_gateway.main import create_app
from baton_platform.apikeys import hash_key, mint_key
from baton_platform.config import BatonConfig

CHAT, EVAL = mint_key(), mint_key()


def gateway(**gw):
    data = default_config_data()
    data["gateway"] = {"auth": "keys", **gw}
    data["tenants"] = [{"name": "acme", "keys": [{"sha256": hash_key(CHAT), "scopes": ["chat", "feedback"]},
                                                  {"sha256": hash_key(EVAL), "scopes": ["chat", "eval"]}]}]
    return create_app(BatonConfig(**data), tracer_provider=TracerProvider())


def client(app, key="unused"):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=key, max_retries=0, http_client=http)


def ask(c, metadata):
    return c.chat.completions.create(model="baton", messages=[{"role": "user", "content": "2+2?"}],
                                     metadata=metadata)


async def test_a_key_without_the_eval_scope_may_not_name_an_evaluation_item():
    c = client(gateway(), CHAT)
    with pytest.raises(openai.AuthenticationError) as err:
        await ask(c, {"baton_eval": "quiz:q1"})
    assert err.value.status_code == 401 and err.value.code is None and "Missing scopes: eval" in err.value.message
    assert CHAT not in err.value.message
    # Nor choose the routing feature the fast policy reads.
    with pytest.raises(openai.AuthenticationError, match="Missing scopes: eval"):
        await ask(c, {"eval_name": "mmlu-pro.law"})
    # The same key may still send the client grading keys the reward logger ignores.
    with pytest.raises(openai.InternalServerError) as err:
        await ask(c, {"grader": "code", "reference": "open('x', 'w')"})
    assert err.value.status_code == 503


async def test_a_key_with_the_eval_scope_may_and_a_malformed_item_is_a_400():
    c = client(gateway(), EVAL)
    with pytest.raises(openai.InternalServerError) as err:
        await ask(c, {"baton_eval": "quiz:q1"})
    assert err.value.status_code == 503
    with pytest.raises(openai.BadRequestError) as err:
        await ask(c, {"baton_eval": "no-colon"})
    assert err.value.param == "metadata.baton_eval" and "metadata.baton_eval" in err.value.message


async def test_auth_none_on_loopback_may_name_an_evaluation_item():
    c = client(gateway(auth="none"))
    with pytest.raises(openai.InternalServerError) as err:
        await ask(c, {"baton_eval": "quiz:q1"})
    assert err.value.status_code == 503
