"""The benchmark's reports: per-hop latency read off trace spans, and the CPU profiles' rankings and
flame graph read off py-spy's collapsed stacks."""

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

# The bench scripts import each other by bare name (`from loadgen import ...`), as `make bench` runs them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from profiles import busy, by_library, flame_svg, read_collapsed, top_functions, top_total  # noqa: E402
from traces import CONSUMER, PRODUCER, SERVER, Span, hop_table, workflow_hops  # noqa: E402

INTERNAL, CLIENT = 1, 3
GATEWAY, ROUTER, SYNTH = "baton-gateway", "baton-router", "baton-synthesizer"
EXECUTOR, LOGGER = "baton-executor-openai_compatible", "baton-reward-logger"
TASKS = "baton.tasks.openai_compatible"


def ms(t: float) -> int:
    return int(t * 1_000_000)


def span(trace: str, service: str, name: str, kind: int, start: float, end: float | None = None) -> Span:
    return Span(trace, service, name, kind, ms(start), ms(end if end is not None else start + 1))


def usual(trace: str, scale: float = 1.0) -> list[Span]:
    """gateway → router → synthesizer → executor → synthesizer → gateway, times in ms × scale."""
    t = lambda v: v * scale  # noqa: E731
    return [
        span(trace, GATEWAY, "POST /v1/chat/completions", SERVER, 0, t(100)),
        span(trace, GATEWAY, "baton.requests publish", PRODUCER, t(2)),
        span(trace, ROUTER, "baton.requests process", CONSUMER, t(5), t(20)),
        span(trace, ROUTER, "plan", INTERNAL, t(6), t(16)),
        span(trace, ROUTER, "baton.workflow publish", PRODUCER, t(17)),
        span(trace, SYNTH, "baton.workflow process", CONSUMER, t(20)),
        span(trace, SYNTH, f"{TASKS} publish", PRODUCER, t(23)),
        span(trace, EXECUTOR, f"{TASKS} process", CONSUMER, t(27)),
        span(trace, EXECUTOR, "chat some-model", CLIENT, t(28), t(78)),
        span(trace, EXECUTOR, "baton.workflow publish", PRODUCER, t(80)),
        span(trace, SYNTH, "baton.workflow process", CONSUMER, t(84)),
        span(trace, SYNTH, "baton.responses publish", PRODUCER, t(88)),
        # The reward logger reads the answer too, before the gateway does: not a step of the path.
        span(trace, LOGGER, "baton.responses process", CONSUMER, t(89)),
        span(trace, GATEWAY, "baton.responses process", CONSUMER, t(91)),
    ]


USUAL_HOPS = [
    ("in gateway", 2), ("gateway → router (Kafka)", 3), ("in router", 12), ("router → synthesizer (Kafka)", 3),
    ("in synthesizer", 3), ("synthesizer → executor (Kafka)", 4), ("in executor", 53),
    ("executor → synthesizer (Kafka)", 4), ("in synthesizer", 4), ("synthesizer → gateway (Kafka)", 3),
    ("in gateway", 9), ("end to end (gateway HTTP span)", 100), ("of which: the router's plan", 10),
    ("of which: the provider call", 50),
]


def test_a_workflow_is_read_as_its_hops_in_path_order():
    # Spans arrive in export batches, not in time order.
    [hops] = workflow_hops(list(reversed(usual("t1"))))
    assert [h for h, _ in hops] == [h for h, _ in USUAL_HOPS]
    assert [v for _, v in hops] == pytest.approx([v for _, v in USUAL_HOPS])
    path = hops[:11]
    assert sum(v for _, v in path) == pytest.approx(100), "the path's hops add up to the HTTP span"


def test_parallel_steps_keep_the_path_of_the_first_result():
    spans = [s for s in usual("t1") if s.start_ns < ms(84)] + [
        span("t1", EXECUTOR, f"{TASKS} process", CONSUMER, 28),  # a second step, on another replica
        span("t1", EXECUTOR, "baton.workflow publish", PRODUCER, 86),
        span("t1", SYNTH, "baton.workflow process", CONSUMER, 84),
        span("t1", SYNTH, "baton.workflow process", CONSUMER, 87),  # the second result: still in the synthesizer
        span("t1", SYNTH, "baton.responses publish", PRODUCER, 90),
        span("t1", GATEWAY, "baton.responses process", CONSUMER, 91),
        span("t1", LOGGER, "baton.responses process", CONSUMER, 95),  # after the gateway this time
    ]
    [hops] = workflow_hops(spans)
    assert [h for h, _ in hops[:11]] == [h for h, _ in USUAL_HOPS[:11]]
    assert hops[6] == ("in executor", pytest.approx(53))
    assert hops[8] == ("in synthesizer", pytest.approx(6)), "from the first result to the answer's publish"
    assert hops[10] == ("in gateway", pytest.approx(9))


def test_a_workflow_without_its_answer_or_a_publish_or_its_http_span_is_left_out():
    no_answer = [s for s in usual("a") if not (s.service == GATEWAY and s.kind == CONSUMER)]
    no_publish = [s for s in usual("b") if not (s.service == ROUTER and s.kind == PRODUCER)]
    no_server = [s for s in usual("c") if s.kind != SERVER]
    # The result's publish is missing: the synthesizer's second read of baton.workflow must not be
    # taken for an answer to the router's plan, published earlier on the same topic.
    no_result = [s for s in usual("e") if not (s.service == EXECUTOR and s.kind == PRODUCER)]
    incomplete = no_answer + no_publish + no_server + no_result
    assert workflow_hops(incomplete) == []
    assert len(workflow_hops(incomplete + usual("d"))) == 1


def test_the_hop_table_summarises_the_most_common_path():
    # The synthesizer answering without a step: gateway → router → synthesizer → gateway.
    short = [s for s in usual("s") if s.start_ns <= ms(20) or s.service == GATEWAY]
    short[-1:-1] = [span("s", SYNTH, "baton.responses publish", PRODUCER, 30)]
    incomplete = [s for s in usual("x") if s.kind != CONSUMER or s.service != GATEWAY]
    spans = usual("t1") + usual("t2", scale=2) + short + incomplete
    table = hop_table(spans)
    assert (table["workflows"], table["other_paths"], table["traces"], table["spans"]) == (2, 1, 4, len(spans))
    assert [r["hop"] for r in table["hops"]] == [h for h, _ in USUAL_HOPS]
    router = table["hops"][2]
    # Two values, 12 and 24 ms: linear interpolation between them.
    assert (router["p50_ms"], router["p99_ms"], router["mean_ms"]) == (18.0, 23.88, 18.0)
    e2e = table["hops"][11]
    assert (e2e["p50_ms"], e2e["p99_ms"]) == (150.0, 199.0)

    [short_hops] = workflow_hops(short)
    assert short_hops[4:8] == [("in synthesizer", pytest.approx(10)), ("synthesizer → gateway (Kafka)", pytest.approx(61)),
                               ("in gateway", pytest.approx(9)), ("end to end (gateway HTTP span)", pytest.approx(100))]


def test_an_empty_collection_says_what_was_seen():
    table = hop_table(usual("x")[1:])
    assert table == {"workflows": 0, "traces": 1, "spans": 13, "hops": []}


# --- profiles ---------------------------------------------------------------------------------------

STDLIB, SITE = "/usr/lib/python3.12", "/srv/ci/baton/.venv/lib/python3.12/site-packages"
# A checkout named like the project: the package directory, not the checkout's, names the module.
GATEWAY_PY = "/srv/ci/baton/services/gateway/baton_gateway/main.py"
LOOP = (f"main ({GATEWAY_PY});run ({STDLIB}/asyncio/runners.py);BaseEventLoop._run_once ({STDLIB}/asyncio/base_events.py);"
        f"Handle._run ({STDLIB}/asyncio/events.py)")
THREAD = f"Thread._bootstrap ({STDLIB}/threading.py);Thread.run ({STDLIB}/threading.py)"
EXPORTER = f"BatchSpanProcessor.worker ({SITE}/opentelemetry/sdk/trace/export/__init__.py)"
COLLAPSED = f"""\
{LOOP};on_response ({GATEWAY_PY});AIOKafkaProducer.send ({SITE}/aiokafka/producer/producer.py) 30
{LOOP};on_response ({GATEWAY_PY});<lambda> ({GATEWAY_PY});Condition.notify ({STDLIB}/threading.py) 10
{LOOP};on_response ({GATEWAY_PY}) 20
{LOOP};_SelectorSocketTransport._read_ready ({STDLIB}/asyncio/selector_events.py) 15
main ({GATEWAY_PY});run ({STDLIB}/asyncio/runners.py);BaseEventLoop._run_once ({STDLIB}/asyncio/base_events.py);EpollSelector.select ({STDLIB}/selectors.py) 100
{THREAD};_worker ({STDLIB}/concurrent/futures/thread.py) 25
{THREAD};{EXPORTER};Condition.wait ({STDLIB}/threading.py) 40
{THREAD};{EXPORTER};encode_spans ({SITE}/opentelemetry/exporter/otlp/proto/common/trace_encoder.py) 25
"""


@pytest.fixture
def stacks(tmp_path):
    path = tmp_path / "profile-gateway.txt"
    path.write_text(COLLAPSED)
    return read_collapsed(path)


def test_frames_are_named_by_module_path_from_their_package(stacks):
    assert stacks[("main (baton_gateway/main.py)", "run (asyncio/runners.py)",
                   "BaseEventLoop._run_once (asyncio/base_events.py)", "Handle._run (asyncio/events.py)",
                   "on_response (baton_gateway/main.py)", "AIOKafkaProducer.send (aiokafka/producer/producer.py)")] == 30
    assert len(stacks) == 8 and sum(stacks.values()) == 265


def test_busy_drops_the_samples_that_wait(stacks):
    running, waiting = busy(stacks)
    assert waiting == 100 + 25 + 40
    assert sum(running.values()) == 100
    leaves = {frames[-1] for frames in running}
    assert not leaves & {"EpollSelector.select (selectors.py)", "_worker (concurrent/futures/thread.py)",
                         "Condition.wait (threading.py)"}
    assert "Condition.notify (threading.py)" in leaves, "a thread that notifies is working, not waiting"


def test_top_functions_rank_self_time_with_total_and_caller(stacks):
    running, _ = busy(stacks)
    top = top_functions(running, n=3)
    assert top == [
        {"function": "AIOKafkaProducer.send (aiokafka/producer/producer.py)", "self": 0.3, "total": 0.3,
         "via": "on_response (baton_gateway/main.py)"},
        {"function": "encode_spans (opentelemetry/exporter/otlp/proto/common/trace_encoder.py)", "self": 0.25,
         "total": 0.25, "via": "BatchSpanProcessor.worker (opentelemetry/sdk/trace/export/__init__.py)"},
        {"function": "on_response (baton_gateway/main.py)", "self": 0.2, "total": 0.6,
         "via": "Handle._run (asyncio/events.py)"},
    ]


def test_top_total_counts_only_own_steps_below_the_event_loop(stacks):
    running, _ = busy(stacks)
    # `main` is on three quarters of the samples, above the loop: it says nothing and is left out.
    assert top_total(running) == [{"function": "on_response (baton_gateway/main.py)", "total": 0.6},
                                  {"function": "<lambda> (baton_gateway/main.py)", "total": 0.1}]


def test_by_library_charges_the_standard_library_to_its_caller(stacks):
    running, _ = busy(stacks)
    shares = {r["library"]: r["self"] for r in by_library(running)}
    # on_response's own 20 samples and the 10 of the Condition.notify its lambda called; the socket read
    # that the loop itself runs stays asyncio's.
    assert shares == {"aiokafka": 0.3, "baton_gateway": 0.3, "opentelemetry": 0.25, "asyncio": 0.15}


def test_the_flame_graph_is_well_formed_svg_with_a_box_per_frame(stacks):
    running, _ = busy(stacks)
    svg = ET.fromstring(flame_svg(running, "gateway <at 5 & 10/s>"))
    ns = {"svg": "http://www.w3.org/2000/svg"}
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert svg.find("svg:text", ns).text == "gateway <at 5 & 10/s> — 100 samples"
    boxes = {g.find("svg:title", ns).text: g.find("svg:rect", ns).attrib for g in svg.findall("svg:g", ns)}
    assert len(boxes) == 13, "one box per distinct frame on a distinct path"
    assert "<lambda> (baton_gateway/main.py) — 10.0%" in boxes
    main = boxes["main (baton_gateway/main.py) — 75.0%"]
    assert (main["x"], main["width"]) == ("300.0", "900.0"), "after the thread's 25%, sorted by name"
    send = boxes["AIOKafkaProducer.send (aiokafka/producer/producer.py) — 30.0%"]
    assert (send["width"], send["y"]) == ("360.0", str(24 + 5 * 16)), "six frames deep"
    assert svg.attrib["height"] == str(24 + 7 * 16 + 8), "seven rows: the lambda's stack"


def test_a_recursive_function_counts_once_per_sample():
    running, _ = busy(Counter({("g (m.py)", "f (m.py)", "f (m.py)"): 3, ("h (m.py)",): 1}))
    assert top_functions(running, n=1) == [{"function": "f (m.py)", "self": 0.75, "total": 0.75, "via": "f (m.py)"}]
    totals = {r["function"]: r["total"] for r in top_total(running, prefix="m")}
    assert totals == {"f (m.py)": 0.75, "g (m.py)": 0.75, "h (m.py)": 0.25}


def test_the_sustained_rate_is_the_one_that_held_not_the_highest_short_step(monkeypatch, tmp_path):
    """Short steps pass up to 200/s; held for longer, 200 and 170 fail and 144 holds."""
    import argparse

    import report
    import run

    limit = {False: 200, True: 150}  # what passes in a short step, and when held

    def step(plan, url, meter, rate, *, seed, attempt, seconds=None):
        held = seconds is not None
        verdict = "pass" if rate <= limit[held] else "fail"
        summary = {"sent": 1, "ok": 1, "shed": 0, "achieved_rps": rate, "p50_ms": 1, "p95_ms": 1, "p99_ms": 1,
                   "max_ms": 1, "lag_p99_ms": 1}
        return {"offered_rps": rate, "seconds": seconds or plan.step_s, "attempt": attempt, "verdict": verdict,
                "why": verdict, "summary": summary, "latencies_ms": [1.0],
                "cpu": {"core_share": {"gateway": 0.2}, "client_cores": 0.1, "others_cores": 0,
                        "machine_busy_share": 0.5, "rss_mb": {"gateway": 100 + rate / 10}}}

    monkeypatch.setattr(run, "_throughput_step", step)
    monkeypatch.setattr(run.time, "sleep", lambda s: None)
    monkeypatch.setattr(run, "emit", lambda record: None)
    args = argparse.Namespace(rates=None, steps=[100, 200, 300], p99_limit_ms=1000.0, profile_rate=None, no_direct=False,
                              trace_sample=0.1)
    data = run.bench_throughput(run.Plan(True, args), "http://unused", meter=None)
    assert data["step_max_rps"] == 200
    assert [h["offered_rps"] for h in data["holds"]] == [200, 170, 144]
    assert data["max_sustained_rps"] == 144
    lines = report._throughput({**data, "meta": {"provider_latency_ms": 50}}, tmp_path, None)
    assert any("**Max sustained: 144 workflows/s** for 15 s" in line for line in lines)
    assert sum("(held 15 s)" in line for line in lines) == 6  # the results table, and the memory table
    assert "| 144 (held 15 s) | 114 |" in lines  # resident MB at the end of the hold that passed
    summary = report._summary({"throughput": data})
    assert "- Resident memory (MB) after the 144/s hold: gateway 114" in summary


def test_the_meter_reads_each_process_trees_resident_memory(tmp_path):
    """A child holding 64 MB under a parent: the tree's resident memory counts both."""
    import subprocess

    from procs import CpuMeter

    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', " \
           "'import time; b = bytearray(64 << 20); print(1, flush=True); time.sleep(60)'], stdout=sys.stdout); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "1"
        meter = CpuMeter({"tree": parent.pid})
        meter.start()
        rss = meter.stop()["rss_mb"]["tree"]
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
    assert 64 < rss < 200


# --- capacity ---------------------------------------------------------------------------------------


def test_the_capacity_plan_sums_executor_replicas_keeps_each_core_at_the_utilization_and_leaves_out_the_rest():
    import capacity

    measured = {"gateway": 1.5, "router": 1.2, "executor-0": 1.0, "executor-1": 0.8, "reward-logger": 0.05,
                "kafka": 1.8, "standin": 0.3, "loadgen": 0.4}
    rows = {r["service"]: r for r in capacity.plan(measured, rate=1000, utilization=0.6)}
    assert list(rows) == ["gateway", "router", "executor", "reward-logger", "kafka"], "the stand-in is not Baton's"
    assert rows["executor"]["cpu_ms_per_workflow"] == 1.8 and rows["executor"]["cores"] == 1.8
    # 1.5 cores at 60% of each: 2.5 cores' worth, so 3 replicas; 1.8 / 0.6 is exactly 3.
    assert [rows[n]["replicas"] for n in rows] == [3, 2, 3, 1, 3]
    assert capacity.plan({"gateway": 1.5}, rate=200)[0]["replicas"] == 1
    with pytest.raises(ValueError):
        capacity.plan(measured, utilization=0)


def test_the_summary_reads_each_measured_figure_against_its_goal():
    import report

    meta = {"plan": {"direct": True}}
    present = {
        "profile": {"meta": meta, "rate": 200, "cpu_ms_per_workflow": {"gateway": 1.0, "executor-0": 1.5, "kafka": 0.4,
                                                                       "standin": 5.0},
                    "cpu": {"rss_mb": {"gateway": 150, "executor-sim-0": 210, "kafka": 900, "standin": 999}}},
        "throughput": {"max_sustained_rps": 408.0, "criterion": {"hold_s": 60}},
        "overload": {"path": "synthesizer", "runs": [{"summary": {"ok": 10, "sent": 10, "p99_ms": 950.0}}]},
    }
    found = {g["goal"].split(" at ")[0].split(" (")[0]: g for g in report.goals(present)}
    cpu = found["CPU per one-step workflow"]
    assert cpu["figure"] == "2.90 ms" and cpu["met"], "the stand-in is not Baton's"
    assert "direct path" in cpu["goal"]
    memory = found["resident memory of the largest service"]
    assert "(executor-sim-0)" in memory["goal"] and memory["figure"] == "210 MB" and not memory["met"], (
        "an executor replica is a service; the broker is not")
    assert not found["workflows/s held for 60 s"]["met"]
    assert found["after an overload and a restart over its backlog"]["met"]
    present["overload"]["runs"][0]["summary"]["ok"] = 9
    assert not report.goals(present)[-1]["met"], "a request left unanswered fails the goal whatever the p99"
