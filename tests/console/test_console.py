"""The console's pages on a dataset the reward logger's own writer made: who may read them, what
they show, and that what a client wrote is shown as text, never as markup."""

import base64
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from starlette.testclient import TestClient
from testbed import default_config_data

from baton.v1 import common_pb2, feedback_pb2, requests_pb2, responses_pb2
from baton_console import data
from baton_console.main import create_app
from baton_console.refusals import RefusalSource
from baton_gateway.metrics import GatewayMetrics
from baton_platform.apikeys import hash_key, mint_key
from baton_platform.config import BatonConfig
from baton_platform.dataset import EPISODE_SCHEMA, FEEDBACK_SCHEMA, Reward, episode_row, feedback_row
from baton_policy import decisions
from baton_reward_logger.episodes import DatasetWriter, Record

ADMIN, CHAT_ONLY = mint_key(), mint_key()
T0 = 1_764_000_000_000


def response(i, tenant, workers, quality, *, query="What is 2+2?", error=None):
    req = requests_pb2.ChatRequest(request_id=f"req-{i}", policy="baton", created_unix_ms=T0 + i * 60_000,
                                   tenant=tenant, messages=[common_pb2.ChatMessage(role="user", content=query)])
    ep = responses_pb2.Episode(request=req, latency_ms=100.0 * (i + 1),
                               total=common_pb2.Usage(input_tokens=10, output_tokens=5, cost_usd=0.001 * len(workers),
                                                      calls=len(workers)))
    ep.plan.backend, ep.plan.policy_version = "policy", "v1" if i < 3 else "v2"
    for k, w in enumerate(workers):
        step = ep.plan.steps.add(worker=w, instruction=f"step {k + 1} of {query}")
        if k:
            step.access.steps.append(k - 1)
        ep.steps.add(step=k, worker=w, model=f"{w}-model", attempt=1, output=f"output of {w}",
                     usage=common_pb2.Usage(input_tokens=10, output_tokens=5, cost_usd=0.001), latency_ms=50.0)
    r = responses_pb2.Response(request_id=f"req-{i}", episode=ep, completed_unix_ms=T0 + i * 60_000 + 500)
    if error:
        r.error.code, r.error.message = error, "it failed"
    else:
        r.answer = f"answer {i}"
    grade = Reward(grader="exact", reference="4", quality=quality, reward=quality or 0.0, detail="compared with 4") \
        if quality is not None else Reward(grader="", reference="", quality=None, reward=0.0, detail="no reference")
    return r, grade


@pytest.fixture
def dataset(tmp_path):
    episodes = [response(0, "acme", ["gemini-flash"], 1.0), response(1, "acme", ["gemini-pro"], 0.0),
                response(2, "zeta", ["gemini-flash", "gemini-pro"], 1.0),
                response(3, "zeta", ["gemini-pro"], None, error="step_timeout"),
                response(4, "acme", ["gemini-flash"], 1.0, query="<script>alert('x')</script> & more")]
    DatasetWriter(tmp_path / "data" / "episodes", "baton.responses", EPISODE_SCHEMA).write(
        0, [Record(0, i, episode_row(r, g, 0, i), r.completed_unix_ms) for i, (r, g) in enumerate(episodes)])
    rating = feedback_pb2.Feedback(response_id="req-1", score=-1.0, comment="wrong <b>sum</b>", source="user",
                                   tenant="acme", created_unix_ms=T0)
    DatasetWriter(tmp_path / "data" / "feedback", "baton.feedback", FEEDBACK_SCHEMA).write(
        0, [Record(0, 0, feedback_row(rating, 0, 0), T0)])
    return tmp_path / "data"


def console(dataset, auth="keys", router=None, **console_settings):
    data = default_config_data()
    data["gateway"] = {"auth": auth}
    data["router"] = {**data.get("router", {}), **(router or {})}
    data["reward_logger"] = {"dataset_dir": str(dataset)}
    data["console"] = {"refresh_s": 0.01, **console_settings}
    data["tenants"] = [{"name": "acme", "budget_usd": 0.01, "keys": [
        {"sha256": hash_key(ADMIN), "scopes": ["admin"]}, {"sha256": hash_key(CHAT_ONLY), "scopes": ["chat"]}]}]
    return TestClient(create_app(BatonConfig(**data), env={}), follow_redirects=False)


def signed_in(client):
    r = client.post("/login", content=f"key={ADMIN}", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 303 and "baton_console" in r.cookies
    assert ADMIN not in r.headers["set-cookie"] and hash_key(ADMIN) not in r.headers["set-cookie"]
    return client


@pytest.mark.parametrize("path", ["/", "/quality", "/workflows", "/workers", "/tenants", "/episodes", "/episodes/req-0"])
def test_every_page_asks_for_an_admin_key(dataset, path):
    client = console(dataset)
    r = client.get(path)
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert client.get(path, headers={"authorization": f"Bearer {CHAT_ONLY}"}).status_code == 303, "a chat key is not enough"
    assert client.get(path, headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
    client.cookies.set("baton_console", hash_key(ADMIN)[:12] + "." + "0" * 64)
    assert client.get(path).status_code == 303, "a forged session is refused"


def test_a_wrong_key_cannot_sign_in_and_a_right_one_gets_a_session(dataset):
    client = console(dataset)
    r = client.post("/login", content=f"key={CHAT_ONLY}", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 401 and "admin scope" in r.text and "baton_console" not in r.cookies
    assert signed_in(client).get("/").status_code == 200


def test_with_gateway_auth_none_the_console_is_open_on_loopback_only(dataset):
    assert console(dataset, auth="none").get("/").status_code == 200
    with pytest.raises(ValueError, match="console open"):
        console(dataset, auth="none", host="0.0.0.0")


def test_the_overview_draws_a_chart_per_measure_split_as_asked(dataset):
    client = signed_in(console(dataset))
    page = client.get("/").text
    assert page.count("<svg") == 5 and "5 episodes" in page
    for name in ("requests per second", "p50 latency (s)", "p99 latency (s)", "errors per minute", "cost per minute"):
        assert name in page
    assert ">acme</text>" in page and ">zeta</text>" in page, "split by tenant by default"
    by_worker = client.get("/?by=worker").text
    assert ">gemini-flash</text>" in by_worker and ">acme</text>" not in by_worker
    assert ">v1</text>" in client.get("/?by=version").text


def test_quality_marks_each_rollout_and_places_workers_and_policies_by_cost_and_quality(dataset):
    page = signed_in(console(dataset)).get("/quality").text
    assert "rollout v1" in page and "rollout v2" in page
    # flash alone: 2 graded, both right; pro alone: 1 graded (the failed one is not graded), wrong.
    assert "worker gemini-flash: quality 1.000, $0.001000 per query, 2 episodes" in page
    assert "worker gemini-pro: quality 0.000" in page and "policy v1: quality 0.667" in page
    assert "gate decisions appear here when router.policy_store is set" in page


def test_quality_marks_each_gate_decision_and_lists_the_latest(dataset, tmp_path):
    store = str(tmp_path / "policies")
    gate = {"candidate": 0.7, "current": 0.6, "difference": 0.1, "upper": 0.2, "episodes": 90}
    decisions.record(store, "baton", decisions.decision("published", "v2", "v1", gate={**gate, "lower": 0.012},
                                                        reason="lower bound > 0", unix_ms=T0 + 2 * 60_000))
    decisions.record(store, "baton", decisions.decision("refused", "v3<i>", "v2", gate={**gate, "lower": -0.02},
                                                        reason="<b>no</b>", unix_ms=T0 + 3 * 60_000))
    decisions.record(store, "other", decisions.decision("rollback", "v0", "v9", unix_ms=T0 + 3 * 60_000))
    page = signed_in(console(dataset, router={"policy_store": store})).get("/quality").text
    assert "rollout v1" in page, "the rollouts are still marked"
    marks = {kind: page.split(f'class="mark {kind}"><title>')[1].split("</title>")[0]
             for kind in ("published", "refused")}
    assert marks["published"].startswith("published v2 (serving before: v1); gate lower bound +0.0120")
    assert marks["refused"].startswith("refused v3&lt;i&gt; (serving before: v2); gate lower bound -0.0200")
    assert 'class="mark rollback"' not in page, "another policy's decisions are not this one's"
    table = page.split("id='decisions'>")[1].split("</table>")[0]
    assert table.index("v3&lt;i&gt;") < table.index("<td>v2</td><td>v1</td>"), "newest first"
    assert "<td>+0.1000</td><td>+0.0120</td><td>lower bound &gt; 0</td>" in table
    assert "<td>-0.0200</td><td>&lt;b&gt;no&lt;/b&gt;</td>" in table and "<b>no</b>" not in page


def test_a_policy_store_that_cannot_be_read_leaves_the_page_and_says_so(dataset):
    page = signed_in(console(dataset, router={"policy_store": "nosuchscheme://bucket/policies"})).get("/quality")
    assert page.status_code == 200 and "rollout v1" in page.text
    assert "No gate decisions shown: the policy store (router.policy_store) cannot be read" in page.text


def test_workflows_count_plan_shapes_with_what_each_step_reads(dataset):
    page = signed_in(console(dataset)).get("/workflows").text
    assert "gemini-flash; gemini-pro &lt;- 1: 1" in page and "gemini-flash: 2" in page and "(5)" in page


def test_tenants_show_spend_against_budget(dataset):
    page = signed_in(console(dataset)).get("/tenants").text
    assert "<td>acme</td><td>0.003000</td><td>0.01</td><td>30%</td>" in page
    assert "<td>zeta</td><td>0.003000</td>" in page


@contextmanager
def serving(answer):
    """A real HTTP server on loopback: `answer(path, query, headers)` gives each GET's (content type, body)."""
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlsplit(self.path)
            asked.append((url.path, parse_qs(url.query), dict(self.headers)))
            kind, body = answer(url.path, parse_qs(url.query), self.headers)
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def refusals_of(page):
    table = page.split("id='refusals'>")[1].split("</table>")[0]
    return [[c.split("<")[0] for c in row.split("<td>")[1:]] for row in table.split("<tr>")[2:]]


def test_tenants_draw_the_refusals_one_gateway_counted(dataset):
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, ["acme", "zeta"], waiting=lambda: 0.0)
    for tenant, outcome, n in (("acme", "rate_limit_exceeded", 3), ("acme", "answered", 7), ("acme", "rejected", 1),
                               ("zeta", "insufficient_quota", 2), ("zeta", "failed", 4), ("<b>x</b>", "overloaded", 1)):
        metrics.tenant_requests.labels(tenant, outcome).inc(n)
    with serving(lambda path, query, headers: ("text/plain; version=0.0.4", generate_latest(registry))) as (url, asked):
        page = signed_in(console(dataset, gateway_metrics_url=url + "/metrics")).get("/tenants").text
    assert asked and asked[0][0] == "/metrics"
    assert "<td>acme</td><td>0.003000</td><td>0.01</td><td>30%</td>" in page, "spend is still shown"
    header = page.split("id='refusals'>")[1].split("</tr>")[0]
    assert [h.split(">")[1] for h in header.split("<th")[2:]] == [
        "rate limit</th", "budget spent</th", "at capacity</th", "other rejections</th", "total</th"]
    assert refusals_of(page) == [["acme", "3", "0", "0", "1", "4"], ["zeta", "0", "2", "0", "0", "2"],
                                 ["&lt;b&gt;x&lt;/b&gt;", "0", "0", "1", "0", "1"]]
    chart = page.split("refused requests by tenant and reason</figcaption>")[1].split("</svg>")[0]
    assert chart.count("<rect") == 4 + 4, "a bar for each tenant's reason, and the legend's four"
    assert "<title>acme, rate limit: 3</title>" in chart and "<b>x</b>" not in page
    assert f"Read from {url}/metrics, since the gateway started" in page


def test_tenants_sum_the_refusals_of_every_replica_from_prometheus(dataset):
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"tenant": "acme", "outcome": "rate_limit_exceeded"}, "value": [T0 / 1000, "12.000000001"]},
        {"metric": {"tenant": "zeta", "outcome": "insufficient_quota"}, "value": [T0 / 1000, "0"]}]}}
    with serving(lambda path, query, headers: ("application/json", json.dumps(vector).encode())) as (url, asked):
        secret_url = url.replace("http://", "http://reader:s3cret@")
        page = signed_in(console(dataset, prometheus_url=secret_url, refusals_window="7d")).get("/tenants").text
    (path, query, headers), = asked
    assert path == "/api/v1/query"
    assert query["query"] == ['sum by (tenant, outcome) (increase(baton_gateway_tenant_requests_total'
                              '{outcome!~"answered|failed"}[7d]))']
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"reader:s3cret").decode(), "the URL's user signs in"
    assert refusals_of(page) == [["acme", "12", "12"]], "a reason no tenant met has no column"
    assert f"Read from {url}, in the last 7d." in page and "s3cret" not in page and "reader" not in page


def test_a_source_that_cannot_be_read_leaves_the_page_saying_why(dataset):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    client = signed_in(console(dataset, gateway_metrics_url=closed))
    r = client.get("/tenants")
    assert r.status_code == 200 and "<td>zeta</td><td>0.003000</td>" in r.text
    assert f"Could not read the refusals from {closed}, since the gateway started" in r.text and "ConnectError" in r.text
    with serving(lambda path, query, headers: ("text/html", b"<html>not metrics</html>")) as (url, _):
        page = signed_in(console(dataset, prometheus_url=url)).get("/tenants").text
    assert f"Could not read the refusals from {url}, in the last 24h: JSONDecodeError" in page


def test_the_gateway_read_by_default_is_the_configured_one():
    """Its metrics port, not its API port, which does not serve /metrics."""
    data = default_config_data()
    data["gateway"] = {"host": "0.0.0.0", "port": 8181, "metrics_port": 9181, "auth": "keys"}
    assert RefusalSource.of(BatonConfig(**data)).url == "http://127.0.0.1:9181/metrics"
    with pytest.raises(ValueError, match="Prometheus duration"):
        BatonConfig(**{**data, "console": {"refusals_window": "24 hours"}})


def test_episodes_are_found_by_tenant_worker_outcome_and_id(dataset):
    client = signed_in(console(dataset))

    def ids(**query):
        page = client.get("/episodes", params=query).text
        return [line.split('">')[1].split("<")[0] for line in page.split('<a href="/episodes/')[1:]]

    assert ids() == ["req-4", "req-3", "req-2", "req-1", "req-0"]
    assert ids(tenant="zeta") == ["req-3", "req-2"]
    assert ids(worker="gemini-flash", result="right") == ["req-4", "req-2", "req-0"]
    assert ids(result="error") == ["req-3"] and ids(request_id="req-1") == ["req-1"]


def test_one_episode_shows_its_plan_every_step_its_grade_and_feedback(dataset):
    client = signed_in(console(dataset, trace_url="http://traces.local/search?id={request_id}"))
    page = client.get("/episodes/req-2").text
    assert page.count("<tr class='step'>") == 2
    for text in ("gemini-flash-model", "gemini-pro-model", "output of gemini-pro", "step 2 of What is 2+2?",
                 "quality 1.0, reward 1.0 by exact", "compared with 4", 'href="http://traces.local/search?id=req-2"'):
        assert text in page
    plan = page.split("id='plan'")[1].split("</table>")[0]
    assert "<td>2</td><td>gemini-pro</td><td>1</td>" in plan, "step 2 reads step 1"
    rated = client.get("/episodes/req-1").text
    assert "wrong &lt;b&gt;sum&lt;/b&gt;" in rated and "-1.00" in rated
    assert client.get("/episodes/nope").status_code == 404


def test_what_clients_wrote_is_shown_as_text(dataset):
    page = signed_in(console(dataset)).get("/episodes/req-4").text
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page


def test_pages_served_are_counted_by_page_and_status(dataset):
    client = signed_in(console(dataset))
    client.get("/episodes/req-0")
    client.get("/episodes/nope")
    text = client.get("/metrics").text
    assert 'baton_console_pages_total{page="/episodes/{request_id}",status="200"} 1.0' in text
    assert 'baton_console_pages_total{page="/episodes/{request_id}",status="404"} 1.0' in text
    assert "baton_console_episodes 5.0" in text


def test_an_empty_dataset_says_so_and_is_ready(tmp_path):
    client = console(tmp_path / "none", auth="none")
    assert "No episodes yet" in client.get("/").text
    assert client.get("/health/ready").json() == {"status": "ready"}
    assert json.loads(client.get("/health/live").text) == {"status": "live"}


def test_only_the_newest_days_are_read_for_the_newest_episodes(tmp_path):
    """The console holds `console.max_episodes` rows; it reads the newest days' files until they hold
    that many, so a dataset that grows every day costs it no more. An older day's file is made unreadable
    here: reading it would fail (not the oldest's: the dataset's schema is read from its first file)."""
    day = 86_400_000
    writer = DatasetWriter(tmp_path / "episodes", "baton.responses", EPISODE_SCHEMA)
    for d in range(4):
        records = []
        for k in range(3):
            r, grade = response(10 * d + k, "acme", ["gemini-flash"], 1.0)
            r.completed_unix_ms = T0 + d * day + k * 1000
            records.append(Record(0, 10 * d + k, episode_row(r, grade, 0, 10 * d + k), r.completed_unix_ms))
        writer.write(0, records)
    older = sorted((tmp_path / "episodes").glob("date=*"))[1]
    for f in older.glob("*.parquet"):
        f.write_bytes(b"not parquet")

    rows, _ = data.Episodes(str(tmp_path), most=4)._read()
    assert [r["request_id"] for r in rows] == ["req-22", "req-30", "req-31", "req-32"]
    rows, _ = data.Episodes(str(tmp_path), most=3)._read()
    assert [r["request_id"] for r in rows] == ["req-30", "req-31", "req-32"]
    with pytest.raises(ValueError, match="magic bytes"):  # the unreadable day is read once more rows are asked for than the others hold
        data.Episodes(str(tmp_path), most=7)._read()


def test_the_dataset_is_decoded_again_only_when_its_files_change(dataset, monkeypatch):
    """Files are never changed once written, so the same files hold the same rows: a refresh that finds
    them all as they were (a readiness probe on an idle console) lists the folders and decodes nothing.
    A new file, or one a compaction removed, is read at the next refresh."""
    decoded = []
    newest = data.newest_episodes
    monkeypatch.setattr(data, "newest_episodes", lambda *args: decoded.append(args) or newest(*args))
    episodes = data.Episodes(str(dataset))
    rows, feedback = episodes._read()
    assert [r["request_id"] for r in rows] == [f"req-{i}" for i in range(5)] and len(decoded) == 1
    assert episodes._read() == (rows, feedback) and len(decoded) == 1, "the same files: nothing decoded again"

    first_files = list((dataset / "episodes").rglob("*.parquet"))
    r, grade = response(5, "acme", ["gemini-pro"], 1.0)
    DatasetWriter(dataset / "episodes", "baton.responses", EPISODE_SCHEMA).write(
        0, [Record(0, 5, episode_row(r, grade, 0, 5), r.completed_unix_ms)])
    rating = feedback_pb2.Feedback(response_id="req-5", score=1.0, source="user", tenant="acme", created_unix_ms=T0)
    DatasetWriter(dataset / "feedback", "baton.feedback", FEEDBACK_SCHEMA).write(
        0, [Record(0, 1, feedback_row(rating, 0, 1), T0)])
    rows, feedback = episodes._read()
    assert len(decoded) == 2 and rows[-1]["request_id"] == "req-5" and "req-5" in feedback

    for f in first_files:
        f.unlink()  # what a compaction does to the files it has merged into a new one
    rows, _ = episodes._read()
    assert len(decoded) == 3 and [r["request_id"] for r in rows] == ["req-5"]
