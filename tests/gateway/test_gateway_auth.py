"""API keys, tenants, scopes, rates and budgets at the gateway (no broker: the Gatekeeper alone)."""

import pytest
from testbed import default_config_data

from baton_gateway.api import ApiError
from baton_gateway.auth import ANONYMOUS, Gatekeeper
from baton_platform.apikeys import hash_key, key_entry, mint_key, parse_key_entries
from baton_platform.config import BatonConfig, ConfigError

ACME, FEEDBACK_ONLY, SLOW = mint_key(), mint_key(), mint_key()


def config(tenants=None, **gateway):
    data = default_config_data()
    data["gateway"] = {"auth": "keys", **gateway}
    data["tenants"] = tenants if tenants is not None else [
        {"name": "acme", "models": ["baton"], "budget_usd": 0.01,
         "keys": [{"sha256": hash_key(ACME), "scopes": ["chat", "feedback"]},
                  {"sha256": hash_key(FEEDBACK_ONLY), "scopes": ["feedback"]}]},
        {"name": "slow", "requests_per_minute": 2, "tokens_per_minute": 100, "keys": [{"sha256": hash_key(SLOW)}]},
    ]
    return BatonConfig(**data)


def settings(tenants=None, **gateway):
    """What the gateway gives its Gatekeeper: its own section and the tenants."""
    c = config(tenants, **gateway)
    return c.gateway, c.tenants


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def bearer(key):
    return f"Bearer {key}"


def test_a_minted_key_is_random_prefixed_and_stored_only_as_its_hash():
    a, b = mint_key(), mint_key()
    assert a != b and a.startswith("bt-") and len(a) > 40
    assert hash_key(a) == hash_key(a) and len(hash_key(a)) == 64 and a not in hash_key(a)


def test_keys_map_to_tenants_with_scopes():
    gate = Gatekeeper(*settings(), env={})
    p = gate.authenticate(bearer(ACME), "chat")
    assert (p.tenant, p.scopes) == ("acme", frozenset({"chat", "feedback"}))
    assert p.key_id == hash_key(ACME)[:12] and ACME not in repr(p) and hash_key(ACME) not in repr(p)
    assert gate.authenticate(bearer(FEEDBACK_ONLY), "feedback").tenant == "acme"


@pytest.mark.parametrize("header, code, fragment", [
    (None, None, "didn't provide an API key"),
    ("Basic abc", None, "Authorization: Bearer"),
    ("Bearer ", None, "didn't provide"),
    ("Bearer bt-not-a-key", "invalid_api_key", "Incorrect API key"),
])
def test_no_key_or_a_wrong_one_is_a_401_that_never_echoes_the_key(header, code, fragment):
    gate = Gatekeeper(*settings(), env={})
    with pytest.raises(ApiError) as err:
        gate.authenticate(header, "chat")
    assert err.value.status == 401 and err.value.code == code and fragment in err.value.message
    assert "bt-not-a-key" not in str(err.value.body())


def test_a_key_without_the_scope_is_refused_as_openai_refuses_a_restricted_key():
    gate = Gatekeeper(*settings(), env={})
    with pytest.raises(ApiError) as err:
        gate.authenticate(bearer(FEEDBACK_ONLY), "chat")
    assert err.value.status == 401 and "Missing scopes: chat" in err.value.message


def test_a_tenant_sees_and_uses_only_its_models():
    gate = Gatekeeper(*settings(), env={})
    known = {"baton", "baton-v2"}
    assert gate.visible_models(gate.authenticate(bearer(ACME), "chat"), known) == ["baton"]
    assert gate.visible_models(gate.authenticate(bearer(SLOW), "chat"), known) == ["baton", "baton-v2"]


def test_the_request_rate_is_per_key_with_retry_after():
    clock = Clock()
    gate = Gatekeeper(*settings(), env={}, clock=clock)
    slow = gate.authenticate(bearer(SLOW), "chat")
    gate.admit(slow)
    gate.admit(slow)
    with pytest.raises(ApiError) as err:
        gate.admit(slow)
    e = err.value
    assert (e.status, e.code, e.type) == (429, "rate_limit_exceeded", "requests")
    assert e.headers == {"retry-after": "30"}  # one request comes back every 30 s at 2 per minute
    gate.admit(gate.authenticate(bearer(ACME), "chat"))  # another key is not limited by it
    clock.now += 30
    gate.admit(slow)


def test_ratings_are_limited_per_key_sixty_a_minute_by_default():
    clock = Clock()
    gate = Gatekeeper(*settings(), env={}, clock=clock)
    acme, feedback_only = gate.authenticate(bearer(ACME), "feedback"), gate.authenticate(bearer(FEEDBACK_ONLY), "feedback")
    for _ in range(60):
        gate.admit_feedback(acme)
    with pytest.raises(ApiError) as err:
        gate.admit_feedback(acme)
    assert (err.value.status, err.value.code, err.value.type) == (429, "rate_limit_exceeded", "requests")
    assert "ratings per minute" in err.value.message and err.value.headers == {"retry-after": "1"}
    gate.admit_feedback(feedback_only)  # another key of the same tenant has its own
    gate.admit(gate.authenticate(bearer(ACME), "chat"))  # and ratings do not count against chat requests
    clock.now += 1
    gate.admit_feedback(acme)


def test_the_token_rate_counts_the_tokens_of_answers():
    clock = Clock()
    gate = Gatekeeper(*settings(), env={}, clock=clock)
    slow = gate.authenticate(bearer(SLOW), "chat")
    gate.admit(slow)
    gate.opened("r1", slow)
    gate.settle("r1", 90, 60)  # 150 tokens of a 100-per-minute budget: 50 in debt
    clock.now += 1
    with pytest.raises(ApiError) as err:
        gate.admit(slow)
    assert err.value.code == "rate_limit_exceeded" and err.value.type == "tokens"
    assert int(err.value.headers["retry-after"]) == 30  # back above zero after 30 s more (51 tokens at 100/min)
    clock.now += 31
    gate.admit(slow)


def test_the_budget_stops_a_tenant_with_insufficient_quota():
    gate = Gatekeeper(*settings(), env={})
    acme = gate.authenticate(bearer(ACME), "chat")
    gate.admit(acme)
    gate.ledger.count("acme", 0, 7, 0.006)
    gate.admit(acme)
    gate.ledger.count("acme", 1, 3, 0.006)  # an exploration candidate or an unknown request still counts
    with pytest.raises(ApiError) as err:
        gate.admit(acme)
    assert (err.value.status, err.value.code, err.value.type) == (429, "insufficient_quota", "insufficient_quota")
    assert gate.ledger.spent("acme") == pytest.approx(0.012)


def test_a_response_read_again_is_not_counted_twice():
    gate = Gatekeeper(*settings(), env={})
    for offset in (4, 5, 5, 3):  # a crash or a rebalance reads offsets 5 and 3 again
        gate.ledger.count("acme", 0, offset, 0.001)
    gate.ledger.count("acme", 1, 5, 0.001)  # another partition's offsets are its own
    gate.ledger.count("nobody", 1, 6, 0.5)  # not a tenant
    assert gate.ledger.spent("acme") == pytest.approx(0.003) and gate.ledger.spent("nobody") == 0


def test_a_request_reserves_its_cost_cap_until_its_answer_settles_it():
    gate = Gatekeeper(*settings(), env={})  # acme: $0.01, so a cap of $0.0001 a request by default
    acme = gate.authenticate(bearer(ACME), "chat")
    assert gate.cost_cap(acme, 0.0) == pytest.approx(0.0001)
    assert gate.cost_cap(acme, 0.00005) == pytest.approx(0.00005)  # a request may lower it
    assert gate.cost_cap(gate.authenticate(bearer(SLOW), "chat"), 0.0) == 0.0  # no budget, no reservation
    gate.ledger.count("acme", 0, 0, 0.0097)
    for i in range(3):  # $0.0003 left: three requests of $0.0001 may run at once, not a fourth
        gate.admit(acme, 0.0001)
        gate.opened(f"r{i}", acme, 0.0001)
    with pytest.raises(ApiError) as err:
        gate.admit(acme, 0.0001)
    assert err.value.code == "insufficient_quota" and "held by its requests still running" in err.value.message
    gate.ledger.count("acme", 0, 1, 0.00002)  # r0 answered, for less than its cap
    gate.settle("r0", 5, 5)
    with pytest.raises(ApiError):  # $0.00028 left, $0.0002 of it held by r1 and r2
        gate.admit(acme, 0.0001)
    gate.ledger.count("acme", 0, 2, 0.00003)
    gate.settle("r1", 5, 5)  # $0.00025 left, $0.0001 held
    gate.admit(acme, 0.0001)
    assert gate.budget_used("acme") == pytest.approx((0.00975 + 0.0002) / 0.01)


def test_a_tenant_cap_and_the_synthesizers_bound_the_reservation():
    tenants = [{"name": "acme", "budget_usd": 10, "max_request_cost_usd": 0.5, "keys": [{"sha256": hash_key(ACME)}]}]
    acme_of = lambda gate: gate.authenticate(bearer(ACME), "chat")  # noqa: E731
    gate = Gatekeeper(*settings(tenants), env={})
    assert gate.cost_cap(acme_of(gate), 0.0) == 0.5 and gate.cost_cap(acme_of(gate), 2.0) == 0.5
    gate = Gatekeeper(*settings(tenants), env={}, max_cost_usd=0.2)
    assert gate.cost_cap(acme_of(gate), 0.0) == 0.2


def test_the_budget_gauge_shows_the_share_spent_or_held_of_each_budgeted_tenant():
    from prometheus_client import CollectorRegistry

    from baton_gateway.metrics import GatewayMetrics

    gate = Gatekeeper(*settings(), env={}, share=lambda: 0.5)
    registry = CollectorRegistry()
    GatewayMetrics(registry, gate.tenants, waiting=lambda: 0, budgets=gate.budgeted(), budget_used=gate.budget_used)
    assert gate.budgeted() == ["acme"]
    gate.ledger.count("acme", 2, 0, 0.004)  # every replica's spend counts, whatever this replica's share
    gate.admit(gate.authenticate(bearer(ACME), "chat"), 0.0001)
    assert registry.get_sample_value("baton_gateway_tenant_budget_used", {"tenant": "acme"}) == pytest.approx(0.41)


def test_each_replica_reserves_at_most_its_share_of_what_is_left():
    gate = Gatekeeper(*settings(), env={}, share=lambda: 0.5)  # half of baton.responses' partitions
    acme = gate.authenticate(bearer(ACME), "chat")
    gate.ledger.count("acme", 0, 0, 0.0096)  # $0.0004 left: this replica may hold $0.0002 of it
    gate.admit(acme, 0.0001)
    gate.admit(acme, 0.0001)
    with pytest.raises(ApiError, match="held by its requests still running"):
        gate.admit(acme, 0.0001)
    slow = gate.authenticate(bearer(SLOW), "chat")
    gate.admit(slow)
    with pytest.raises(ApiError, match="Rate limit"):
        gate.admit(slow)


def test_key_hashes_may_come_from_the_environment():
    extra = mint_key()
    entry = key_entry("slow", hash_key(extra), ["chat", "feedback"])
    gate = Gatekeeper(*settings(), env={"BATON_API_KEYS": f" {entry},\n"})
    assert gate.authenticate(bearer(extra), "feedback").tenant == "slow"
    assert parse_key_entries(f"slow:{hash_key(extra)}", "X") == [("slow", hash_key(extra), frozenset({"chat"}))]


@pytest.mark.parametrize("env, fragment", [
    ({"BATON_API_KEYS": "a-plaintext-key"}, "entry 1 is not"),
    ({"BATON_API_KEYS": f"ghost:{'a' * 64}"}, "no such tenant"),
    ({"BATON_API_KEYS": f"slow:{'a' * 64}:root"}, "unknown scopes"),
])
def test_bad_key_entries_fail_the_start_without_repeating_them(env, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        Gatekeeper(*settings(), env=env)
    assert "a-plaintext-key" not in str(err.value)


def test_keys_mode_with_no_key_refuses_to_start():
    with pytest.raises(ConfigError, match="no key is configured"):
        Gatekeeper(*settings(tenants=[]), env={})


def test_auth_none_is_explicit_and_only_on_loopback():
    open_gate = Gatekeeper(*settings(auth="none"), env={})
    p = open_gate.authenticate(None, "feedback")
    assert p.tenant == ANONYMOUS
    open_gate.admit(p)
    with pytest.raises(Exception, match="would let anyone on the network"):
        config(auth="none", host="0.0.0.0")
    assert config(auth="none", host="0.0.0.0", allow_unauthenticated_network=True).gateway.auth == "none"
    assert BatonConfig(workers=default_config_data()["workers"],
                       conductor=default_config_data()["conductor"]).gateway.auth == "keys"  # the default


def test_config_rejects_a_key_listed_twice_and_a_hash_that_is_not_one():
    twice = [{"name": "a", "keys": [{"sha256": "a" * 64}]}, {"name": "b", "keys": [{"sha256": "a" * 64}]}]
    with pytest.raises(Exception, match="listed twice"):
        config(tenants=twice)
    with pytest.raises(Exception, match="sha256"):
        config(tenants=[{"name": "a", "keys": [{"sha256": "bt-plaintext"}]}])


def test_the_eval_scope_is_a_scope_of_its_own():
    extra = mint_key()
    gate = Gatekeeper(*settings(), env={"BATON_API_KEYS": key_entry("slow", hash_key(extra), ["chat", "eval"])})
    gate.require(gate.authenticate(bearer(extra), "chat"), "eval")
    with pytest.raises(ApiError) as err:
        gate.require(gate.authenticate(bearer(ACME), "chat"), "eval")
    assert err.value.status == 401 and "Missing scopes: eval" in err.value.message
    gate.require(Gatekeeper(*settings(auth="none"), env={}).authenticate(None, "chat"), "eval")
    assert config(tenants=[{"name": "a", "keys": [{"sha256": "a" * 64, "scopes": ["eval", "chat"]}]}])
    with pytest.raises(Exception, match="scopes"):
        config(tenants=[{"name": "a", "keys": [{"sha256": "a" * 64, "scopes": ["grade"]}]}])
