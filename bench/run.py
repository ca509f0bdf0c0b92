"""Baton's benchmarks: overhead against LiteLLM, sustained throughput, where the time goes (CPU profiles
and per-hop latency from trace spans), provider limits, what tracing costs, an overload followed
by a restart, and what one Kafka hop costs with each client.

    .venv/bin/python bench/run.py            # everything, about 15 minutes
    .venv/bin/python bench/run.py --quick    # a short run, about 5 minutes
    .venv/bin/python bench/run.py --only overhead,limits
    .venv/bin/python bench/run.py --only overload --no-direct   # restarts and an overload, through the synthesizer
    .venv/bin/python bench/run.py --only profile --profile-rate 30   # profiles and per-hop latency only
    .venv/bin/python bench/run.py --only tracing   # CPU per workflow with tracing off, at 10% and at 100%
    .venv/bin/python bench/run.py --only clients   # a relay hop on aiokafka and librdkafka, with and without FastStream
    .venv/bin/python bench/run.py --report-only   # redraw REPORT.md from the last JSON files

Writes bench/results/<benchmark>.json, bench/results/REPORT.md with its PNG plots, and one JSON line
per result on stdout (progress goes to stderr). Not a test: nothing here passes or fails a build.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import kafka_clients
import limits as limits_bench
import overload
import profiles
import report
import tracing_cost
import ttft
import yaml
from loadgen import LAG_LIMIT_MS, Load, generate, pooled, procs_for
from procs import (
    LITELLM_VERSION,
    CpuMeter,
    ensure_litellm,
    litellm_ready_url,
    start_litellm,
    start_standin,
    user_system_s,
    wait_http_ok,
)
from traces import SpanReceiver, hop_table

from baton_tools.kafka import LocalKafka
from baton_tools.procs import free_port
from baton_tools.stack import Stack
from baton_tools.standins.server import configure_standin

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
BENCHMARKS = ("overhead", "throughput", "profile", "limits", "tracing", "overload", "clients")

PROVIDER_LATENCY_MS = 50  # the stand-in's fixed answer time in the overhead and throughput runs
PARTITIONS = 8
DEFAULT_PROFILE_RATE = 20.0  # workflows/s to profile at when no throughput run found the maximum


_T0 = time.monotonic()


def echo(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


class Plan:
    """Rates, durations and limits of a run; --quick shortens every part."""

    def __init__(self, quick: bool, args: argparse.Namespace) -> None:
        self.quick = quick
        self.direct = not args.no_direct  # router.direct_single_step in Baton's configuration
        # 50/s: the rate the overhead goal is set at (Baton's overhead at most half of LiteLLM's).
        self.rates = args.rates or ([10, 20] if quick else [5, 10, 20, 40, 50])
        # On this two-core machine Baton holds about 400 single-step workflows/s (about 300 through the
        # synthesizer, --no-direct): steps up to past it.
        self.steps = args.steps or ([20, 40, 80, 160, 240, 320, 400, 480, 560] if quick
                                    else [10, 20, 40, 80, 120, 160, 200, 240, 280, 320, 400, 480, 560, 640])
        self.warm_s = 2.0 if quick else 8.0  # unmeasured load on each target after start-up
        self.warmup_s = 1.0  # unmeasured start of every measured run
        self.rounds = 1 if quick else 3
        self.step_s = 4.0 if quick else 10.0
        # A short step passes at rates the system cannot hold (its queue has no time to grow): the
        # step maximum is then held this long, stepping down until a rate holds.
        self.hold_s = 15.0 if quick else 60.0
        self.hold_tries = 3 if quick else 5
        self.p99_limit_ms = args.p99_limit_ms
        self.request_timeout_s = 10.0
        self.limit_per_s = 20.0
        self.limit_window_s = 2.0
        self.limit_overload = 3.0
        self.limit_offered_s = 2.0 if quick else 6.0
        self.replicas = [1, 2, 3]
        self.ttft_requests = 10 if quick else 30
        self.profile_s = 15.0 if quick else 40.0
        self.profile_rate = args.profile_rate  # None: the highest rate the throughput run sustained
        self.profile_hz = 97  # py-spy samples per second per process; off any round timer period
        self.trace_sample = args.trace_sample
        # Overload, then a restart over its backlog: past what the throughput run holds on this
        # machine, then the rate the stack must serve in full at once after the restart.
        self.overload_rps = 600.0 if quick else 700.0
        self.overload_s = 10.0 if quick else 20.0
        self.after_rps = 100.0
        self.after_s = 10.0 if quick else 20.0
        # What tracing costs: CPU per workflow with tracing off, at 10% and at 100%, in turns.
        self.tracing_rps = 100.0
        self.tracing_s = 10.0 if quick else 20.0
        self.tracing_rounds = 1 if quick else 2
        # What one Kafka hop costs with each client (bench/kafka_clients.py), relays in turns.
        self.clients_rps = 300.0
        self.clients_s = 8.0 if quick else 15.0
        self.clients_rounds = 1 if quick else 2

    def overhead_duration(self, rate: float) -> float:
        """Measured seconds per target: ~120+ samples at low rates, bounded so the run stays short."""
        if self.quick:
            return 4.0
        return min(24.0, max(10.0, 150.0 / rate))

    def public(self) -> dict:
        return {k: v for k, v in vars(self).items()}


# --- the system under test -----------------------------------------------------------------------


def baton_config(path: Path, standin_url: str, request_timeout_s: float, direct: bool = True) -> Path:
    """One `openai_compatible` worker on the stand-in and a static one-step plan: Baton adds only its
    own path (gateway, router, executor, Kafka in between; with `direct` off, the synthesizer too) to
    the provider call."""
    data = {
        "workers": [{"name": "standin", "provider": "openai_compatible", "model": "standin-model",
                     "base_url": standin_url, "limits": {"concurrency": 1024},
                     "card": "Local OpenAI stand-in with a fixed latency."}],
        "conductor": {"backend": "static",
                      "plan": {"workers": ["standin"], "subtasks": ["Answer the question."], "access": [[]]}},
        "kafka": {"partitions": PARTITIONS, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        "gateway": {"request_timeout_s": request_timeout_s, "auth": "none"},  # local, on loopback
        "router": {"direct_single_step": direct},
        "synthesizer": {"step_timeout_s": 30},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def prime(url: str, model: str, n: int = 20) -> None:
    """A few requests one at a time: connections, caches and first-call paths warm before measuring."""
    body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "warm-up"}]}
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
        for _ in range(n):
            client.post("/chat/completions", json=body).raise_for_status()


def warm_up(plan: Plan, targets: dict[str, tuple[str, str]]) -> None:
    """Some load on every target before anything is measured: the broker's JIT, connection pools
    and first-call paths otherwise count against whichever run comes first."""
    for name, (url, model) in targets.items():
        prime(url, model)
        if name == "direct":
            continue  # the stand-in has nothing to warm beyond what prime() did
        echo(f"warming up {name} ...")
        generate(Load(url=url, model=model, rate=10, duration_s=plan.warm_s, warmup_s=0, seed=999))


def metered(meter: CpuMeter, load: Load) -> tuple[dict, dict]:
    meter.start()
    out = generate(load)
    cpu = meter.stop()
    # The load generators are our own processes too; take them out of "others".
    cpu["client_cores"] = round(out["client_cpu_s"] / cpu["wall_s"], 2)
    cpu["others_cores"] = round(max(0.0, cpu["others_cores"] - cpu["client_cores"]), 2)
    cpu["requests"] = len(out["records"])
    return out, cpu


def merged_cpu(cpus: list[dict]) -> dict:
    """CPU readings of several runs as one reading over their combined time."""
    wall = sum(c["wall_s"] for c in cpus)
    names = {n for c in cpus for n in c["cpu_s"]}
    cpu_s = {n: round(sum(c["cpu_s"].get(n, 0.0) for c in cpus), 3) for n in names}

    def weighted(key: str) -> float:
        return round(sum(c[key] * c["wall_s"] for c in cpus) / wall, 3)

    return {"wall_s": round(wall, 2), "cpu_s": cpu_s, "core_share": {n: round(v / wall, 3) for n, v in cpu_s.items()},
            "machine_busy_share": weighted("machine_busy_share"), "others_cores": weighted("others_cores"),
            "client_cores": weighted("client_cores"), "cores": weighted("cores"),
            "requests": sum(c["requests"] for c in cpus)}


# --- 1. overhead ------------------------------------------------------------------------------------


def bench_overhead(plan: Plan, targets: dict[str, tuple[str, str]], meter: CpuMeter) -> dict:
    """Each rate's time is cut into rounds in which every target takes a turn (in rotating order), so
    a burst of load from other tenants of the machine lands on all targets alike, not on one."""
    runs, rows = [], []
    for i, rate in enumerate(plan.rates):
        duration = plan.overhead_duration(rate)
        procs = procs_for(rate)
        outs: dict[str, list[dict]] = {name: [] for name in targets}
        cpus: dict[str, list[dict]] = {name: [] for name in targets}
        echo(f"overhead: {rate:g} req/s, {duration:g} s per target in {plan.rounds} round(s) ...")
        for k in range(plan.rounds):
            names = list(targets)
            turn = (i + k) % len(names)
            for name in names[turn:] + names[:turn]:
                url, model = targets[name]
                load = Load(url=url, model=model, rate=rate, duration_s=duration / plan.rounds,
                            warmup_s=plan.warmup_s, timeout_s=plan.request_timeout_s + 5, seed=(i + 1) * 100 + k,
                            procs=procs)
                out, cpu = metered(meter, load)
                outs[name].append(out)
                cpus[name].append(cpu)
        by_target = {}
        for name in targets:
            out, cpu = pooled(outs[name], duration, procs), merged_cpu(cpus[name])
            s = by_target[name] = out["summary"]
            latencies = sorted(r[2] for r in out["records"] if not r[4] and r[3] == 200)
            runs.append({"rate": rate, "target": name, "duration_s": duration, "rounds": plan.rounds, "summary": s,
                         "cpu": cpu, "latencies_ms": latencies})
            emit({"bench": "overhead", "kind": "latency", "rate": rate, "target": name, **s,
                  "cpu_ms_per_request": {n: round(v * 1000 / cpu["requests"], 2) for n, v in cpu["cpu_s"].items()},
                  "others_cores": cpu["others_cores"]})
        for q in ("p50", "p95", "p99"):
            row = overhead_row(rate, q, by_target)
            rows.append(row)
            emit({"bench": "overhead", "kind": "overhead", **row})
    return {"runs": runs, "overhead": rows}


def overhead_row(rate: float, q: str, by_target: dict[str, dict]) -> dict:
    key = f"{q}_ms"
    direct = by_target.get("direct", {}).get(key)
    row: dict[str, Any] = {"rate": rate, "percentile": q, "direct_ms": direct}
    for name in ("baton", "litellm"):
        value = by_target.get(name, {}).get(key)
        row[f"{name}_ms"] = value
        row[f"{name}_overhead_ms"] = round(value - direct, 2) if value is not None and direct is not None else None
    baton, peer = row["baton_overhead_ms"], row["litellm_overhead_ms"]
    row["ratio"] = round(baton / peer, 2) if baton is not None and peer is not None and peer > 0 else None
    return row


# --- 2. throughput ------------------------------------------------------------------------------------


def bench_throughput(plan: Plan, url: str, meter: CpuMeter) -> dict:
    """Step the offered rate up until a step fails twice in a row, then hold the highest rate that
    passed for `plan.hold_s`, stepping down by 15% until one holds: that is the sustained rate.

    A failed step is run once more before it counts: on a shared machine one burst from another
    tenant can spoil a single 10 s window, and the maximum should not hinge on that.
    """
    steps, best = [], None
    for i, rate in enumerate(plan.steps):
        for attempt in (1, 2):
            step = _throughput_step(plan, url, meter, rate, seed=100 + i + 50 * (attempt - 1), attempt=attempt)
            steps.append(step)
            if step["verdict"] == "pass":
                break
        if step["verdict"] != "pass":
            break
        best = step
        time.sleep(1.0)
    holds, held = [], None
    rate = float(best["offered_rps"]) if best else 0.0
    for k in range(plan.hold_tries if best else 0):
        time.sleep(plan.request_timeout_s)  # what the last run left queued has expired
        hold = _throughput_step(plan, url, meter, rate, seed=900 + k, attempt=1, seconds=plan.hold_s)
        holds.append(hold)
        if hold["verdict"] == "pass":
            held = hold
            break
        rate = float(round(rate * 0.85))
    result = {
        "criterion": {
            "all_answered": "every request sent in the measured window got a 200 with an answer (no error, "
                            f"no 504, no client timeout at {plan.request_timeout_s + 5:g} s)",
            "p99_limit_ms": plan.p99_limit_ms,
            "client_lag_limit_ms": LAG_LIMIT_MS,
            "step_s": plan.step_s,
            "retry": "a failed step is run once more; the rate fails only if both tries fail",
            "hold_s": plan.hold_s,
            "hold": "the highest step that passed is held for hold_s, then 15% less each time, until a rate holds",
        },
        "steps": steps,
        "step_max_rps": best["offered_rps"] if best else None,
        "holds": holds,
        "max_sustained_rps": held["offered_rps"] if held else None,
        "achieved_rps_at_max": held["summary"]["achieved_rps"] if held else None,
        "stopped_by": steps[-1]["why"] if steps and steps[-1]["verdict"] != "pass" else "the last step passed",
    }
    emit({"bench": "throughput", "kind": "max", "step_max_rps": result["step_max_rps"],
          "max_sustained_rps": result["max_sustained_rps"], "achieved_rps_at_max": result["achieved_rps_at_max"],
          "stopped_by": result["stopped_by"]})
    return result


def _throughput_step(plan: Plan, url: str, meter: CpuMeter, rate: float, *, seed: int, attempt: int,
                     seconds: float | None = None) -> dict:
    seconds = seconds or plan.step_s
    load = Load(url=url, model="baton", rate=rate, duration_s=seconds, warmup_s=1.0,
                timeout_s=plan.request_timeout_s + 5, seed=seed, procs=procs_for(rate))
    again = " (second try)" if attempt > 1 else ""
    echo(f"throughput: {rate:g} workflows/s for {seconds:g} s ({load.procs} client process(es)){again} ...")
    out, cpu = metered(meter, load)
    s = out["summary"]
    verdict, why = judge(s, plan.p99_limit_ms)
    emit({"bench": "throughput", "kind": "step", "offered_rps": rate, "attempt": attempt, "verdict": verdict,
          "why": why, **s, "core_share": cpu["core_share"], "others_cores": cpu["others_cores"]})
    return {"offered_rps": rate, "seconds": seconds, "attempt": attempt, "verdict": verdict, "why": why, "summary": s,
            "cpu": cpu,
            "latencies_ms": sorted(r[2] for r in out["records"] if not r[4] and r[3] == 200)}


def judge(s: dict, p99_limit_ms: float) -> tuple[str, str]:
    """pass, fail (Baton lost or delayed requests) or client-bound (the generator fell behind).

    A late generator offered less than the nominal rate: a failure under that lighter load is still
    a failure, but a pass under it proves nothing about the nominal rate.
    """
    lag = "" if s["client_keeping_up"] else f" (and the load generator fell behind: send lag p99 {s['lag_p99_ms']} ms)"
    if s["ok"] < s["sent"]:
        return "fail", f"{s['sent'] - s['ok']} of {s['sent']} requests not answered: {s['errors']}{lag}"
    if s["p99_ms"] is None or s["p99_ms"] > p99_limit_ms:
        return "fail", f"p99 {s['p99_ms']} ms above the {p99_limit_ms:g} ms bound{lag}"
    if lag:
        return "client-bound", f"the load generator fell behind its schedule (send lag p99 {s['lag_p99_ms']} ms)"
    return "pass", f"all {s['sent']} answered, p99 {s['p99_ms']} ms"


# --- 3. where the time goes ----------------------------------------------------------------------

EXPORT_WAIT_S = 6.0  # the services' BatchSpanProcessor exports every 5 s


def bench_profile(plan: Plan, url: str, meter: CpuMeter, receiver: SpanReceiver, pids: dict[str, int],
                  rate: float) -> dict:
    """Steady load at one rate with py-spy on every service and sampled traces collected."""
    load = Load(url=url, model="baton", rate=rate, duration_s=plan.profile_s, warmup_s=1.0,
                timeout_s=plan.request_timeout_s + 5, seed=7, procs=procs_for(rate))
    echo(f"profile: {rate:g} workflows/s for {plan.profile_s:g} s, py-spy on {len(pids)} processes ...")
    receiver.take()
    receiver.collecting = True
    load_before = os.getloadavg()
    # The recorders sample the whole run, warm-up included: every second of it is under the same load.
    recorder = profiles.Recorder(RESULTS, pids, plan.profile_s + load.warmup_s - 0.5, plan.profile_hz)
    modes0 = {name: user_system_s(pid) for name, pid in pids.items()}
    out, cpu = metered(meter, load)
    modes1 = {name: user_system_s(pid) for name, pid in pids.items()}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    errors = recorder.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    profiler_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    time.sleep(EXPORT_WAIT_S)
    receiver.collecting = False
    spans = receiver.take()
    procs_out = {}
    for name, path in recorder.files.items():
        if name in errors:
            continue
        user, system = (b - a for a, b in zip(modes0[name], modes1[name]))
        procs_out[name] = {**profiles.summarise(path, plan.profile_hz, f"{name} at {rate:g} workflows/s"),
                           "user_s": round(user, 2), "system_s": round(system, 2)}
    s = out["summary"]
    hops = hop_table(spans)
    result = {"rate": rate, "duration_s": plan.profile_s, "py_spy_hz": plan.profile_hz,
              "trace_sample": plan.trace_sample, "summary": s, "cpu": cpu,
              "cpu_ms_per_workflow": {n: round(v * 1000 / max(cpu["requests"], 1), 2) for n, v in cpu["cpu_s"].items()},
              "profiler_cores": round(profiler_s / cpu["wall_s"], 2), "load_average": [load_before, os.getloadavg()],
              "profiles": procs_out, "profile_errors": errors, "hops": hops}
    emit({"bench": "profile", "kind": "summary", "rate": rate, "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"],
          "cpu_ms_per_workflow": result["cpu_ms_per_workflow"], "traced_workflows": hops["workflows"],
          "profile_errors": errors})
    return result


# --- 4. limits ---------------------------------------------------------------------------------------


def bench_limits(plan: Plan, bootstrap: str, work: Path, logs: Path) -> dict:
    child, url = start_standin(logs, name="standin-limited", latency_ms=20,
                               rpm=int(plan.limit_per_s * plan.limit_window_s), window_s=plan.limit_window_s)
    try:
        runs = asyncio.run(limits_bench.run_limits(
            bootstrap, url, plan.replicas, limit_per_s=plan.limit_per_s, window_s=plan.limit_window_s,
            offered_s=plan.limit_offered_s, overload=plan.limit_overload, partitions=PARTITIONS, work_dir=work,
            log_dir=logs, echo=echo, emit=lambda run: emit({"bench": "limits", **run})))
    finally:
        child.stop()
    return {
        "method": "tasks published straight to baton.tasks.openai_compatible (no gateway, router or "
                  "synthesizer); one consumer group of executors scaled up 1 → 2 → 3 between measurements",
        "limit_per_s": plan.limit_per_s, "window_s": plan.limit_window_s, "overload": plan.limit_overload,
        "provider_latency_ms": 20, "runs": runs,
    }


# --- orchestration -----------------------------------------------------------------------------------


def machine_meta(argv: list[str], plan: Plan) -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    model = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/run.py", *argv]),
        "quick": plan.quick,
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "worktree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "litellm": LITELLM_VERSION,
        "litellm_workers": 1,
        "provider_latency_ms": PROVIDER_LATENCY_MS,
        "plan": plan.public(),
    }


def write_json(name: str, meta: dict, data: dict) -> None:
    meta = {**meta, "load_average_at_end": os.getloadavg()}
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, **data}, indent=1))


def run(args: argparse.Namespace, argv: list[str]) -> None:
    plan = Plan(args.quick, args)
    wanted = [b.strip() for b in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = set(wanted) - set(BENCHMARKS)
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if not 0.0 <= plan.trace_sample <= 1.0:
        raise SystemExit(f"--trace-sample must be between 0 and 1, not {plan.trace_sample:g}")
    if "profile" in wanted and profiles.py_spy() is None:
        raise SystemExit("py-spy not found: `make install` installs it into .venv")
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = RESULTS / "work"
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    meta = machine_meta(argv, plan)
    started = time.monotonic()
    echo(f"results in {RESULTS}; logs in {logs}")

    with contextlib.ExitStack() as cleanup:
        http = bool({"overhead", "throughput", "profile", "tracing", "overload"} & set(wanted))
        litellm = None
        if http:
            standin, standin_url = start_standin(logs, latency_ms=PROVIDER_LATENCY_MS)
            cleanup.callback(standin.stop)
            if "overhead" in wanted and "litellm" in args.targets.split(","):
                # Started first: its half a minute of start-up overlaps Kafka's and Baton's.
                litellm, litellm_url, litellm_model = start_litellm(ensure_litellm(echo), standin_url, work / "litellm",
                                                                     logs)
                cleanup.callback(litellm.stop)
        kafka = LocalKafka(log_file=logs / "kafka.log")
        echo("starting Kafka ...")
        kafka.start()
        cleanup.callback(kafka.stop)

        if http:
            config = baton_config(work / "baton.yaml", standin_url, plan.request_timeout_s, direct=plan.direct)
            receiver = SpanReceiver().start()
            cleanup.callback(receiver.stop)
            # Traces as a deployment with tracing on exports them: a sampled share of workflows, whole.
            tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                       "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                       "OTEL_TRACES_SAMPLER_ARG": str(plan.trace_sample)}
            baton = Stack(work / "stack", config_file=config, gateway_port=free_port(), console_port=free_port(),
                          bootstrap_servers=kafka.bootstrap_servers, env=tracing)
            baton.start(echo=echo)
            cleanup.callback(baton.stop)
            roots = {"kafka": kafka.pid, "standin": standin.pid, **{s.name: s.pid for s in baton.services}}
            targets = {"direct": (standin_url, "standin-model"), "baton": (baton.base_url, "baton")}
            if litellm is not None:
                echo("waiting for the LiteLLM proxy ...")
                wait_http_ok(litellm_ready_url(litellm_url), litellm, timeout=180)
                targets["litellm"] = (litellm_url, litellm_model)
                roots["litellm"] = litellm.pid
            meter = CpuMeter(roots)
            warm_up(plan, targets)
            if "overhead" in wanted:
                chosen = {"direct", *args.targets.split(",")}
                measured = {k: v for k, v in targets.items() if k in chosen}
                data = bench_overhead(plan, measured, meter)
                configure_standin(standin_url, chunk_delay_ms=ttft.CHUNK_DELAY_MS)
                data["ttft"] = ttft.bench(measured, plan.ttft_requests, echo, emit)
                configure_standin(standin_url, chunk_delay_ms=0)
                write_json("overhead", meta, {"targets": list(measured), **data})
            if litellm is not None:
                litellm.stop()
                meter.roots.pop("litellm", None)
            sustained = None
            if "throughput" in wanted:
                data = bench_throughput(plan, baton.base_url, meter)
                write_json("throughput", meta, data)
                sustained = data["max_sustained_rps"]
            if "profile" in wanted:
                rate = plan.profile_rate or sustained or DEFAULT_PROFILE_RATE
                pids = {s.name: s.pid for s in baton.services if s.pid}
                data = bench_profile(plan, baton.base_url, meter, receiver, pids, rate)
                write_json("profile", meta, data)
            if "tracing" in wanted:  # it restarts the stack's processes, with each setting's variables
                write_json("tracing", meta, tracing_cost.bench(plan, baton, meter, metered, echo, emit))
            if "overload" in wanted:  # last: it restarts the stack's processes and leaves a backlog
                write_json("overload", meta, overload.bench(plan, baton, echo, emit))
            baton.stop()
            standin.stop()

        if "limits" in wanted:
            data = bench_limits(plan, kafka.bootstrap_servers, work, logs)
            write_json("limits", meta, data)
        if "clients" in wanted:
            write_json("clients", meta, kafka_clients.bench(plan, kafka.bootstrap_servers, kafka.pid, echo, emit))

    echo(f"done in {time.monotonic() - started:.0f} s")
    report.render(RESULTS, echo)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short run (about 5 minutes)")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=None,
                   help="overhead: request rates (req/s), comma-separated")
    p.add_argument("--steps", type=lambda s: [float(x) for x in s.split(",")], default=None,
                   help="throughput: offered rates to step through, comma-separated")
    p.add_argument("--p99-limit-ms", type=float, default=1000.0,
                   help="throughput: a step whose p99 exceeds this has not kept latency bounded")
    p.add_argument("--targets", default="direct,baton,litellm",
                   help="overhead: which of direct, baton, litellm to measure (direct is always needed)")
    p.add_argument("--profile-rate", type=float, default=None,
                   help="profile: workflows/s to profile at (default: the throughput run's maximum, else "
                        f"{DEFAULT_PROFILE_RATE:g})")
    p.add_argument("--trace-sample", type=float, default=0.1,
                   help="share of workflows whose traces the services export (parentbased_traceidratio)")
    p.add_argument("--report-only", action="store_true", help="redraw REPORT.md and plots from the JSON files")
    p.add_argument("--no-direct", action="store_true",
                   help="run the one-step plan through the synthesizer (router.direct_single_step off) instead of "
                   "straight from the router to the executor (the default)")
    args = p.parse_args(argv)
    if args.report_only:
        report.render(RESULTS, echo)
        return 0
    run(args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
