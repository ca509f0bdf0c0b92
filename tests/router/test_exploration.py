from baton.v1 import common_pb2, requests_pb2
from baton_router.exploration import candidates, explores


def test_the_explored_share_is_close_to_the_setting_and_stable_per_request():
    ids = [f"req-{i}" for i in range(4000)]
    share = sum(explores(i, 0.25) for i in ids) / len(ids)
    assert 0.22 < share < 0.28
    assert [explores(i, 0.25) for i in ids[:50]] == [explores(i, 0.25) for i in ids[:50]]
    assert not any(explores(i, 0.0) for i in ids[:100]) and all(explores(i, 1.0) for i in ids[:100])


def test_a_group_keeps_the_clients_request_first_and_names_the_others():
    req = requests_pb2.ChatRequest(request_id="abc", stream=True, reply_partition=5,
                                   messages=[common_pb2.ChatMessage(role="user", content="q")])
    group = candidates(req, 3)
    assert [c.request_id for c in group] == ["abc", "abc.1", "abc.2"]
    assert {c.group_id for c in group} == {"abc"} and [c.candidate for c in group] == [0, 1, 2]
    assert [c.stream for c in group] == [True, False, False], "only the client's candidate streams progress"
    assert all(c.group_size == 3 and c.reply_partition == 5 and c.messages[0].content == "q" for c in group)
