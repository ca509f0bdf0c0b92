"""REPORT.md and its plots, drawn from the JSON files a run wrote (so a report can be redrawn)."""

from __future__ import annotations

import json
from pathlib import Path

import capacity

BATON_PROCS = ("gateway", "router", "synthesizer", "executor", "reward-logger", "kafka")
COLOURS = {"direct": "#7f7f7f", "baton": "#1f77b4", "litellm": "#d62728"}


def _load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


SWAMPED_P99_MS = 1000.0


def _swamped(data: dict) -> set[tuple[float, str]]:
    return {(r["rate"], r["target"]) for r in data["runs"] if (r["summary"]["p99_ms"] or 0) > SWAMPED_P99_MS}


def _is_baton(name: str) -> bool:
    return name in BATON_PROCS or name.startswith("executor-")


def _baton_cpu_ms(cpu: dict) -> dict[str, float]:
    """Per-request CPU of each Baton process (executors of one provider added together)."""
    return capacity.per_service({name: secs * 1000 / max(cpu["requests"], 1) for name, secs in cpu["cpu_s"].items()})


def _marginal_ms(by_target: dict[str, dict], target: str, mine, total: bool = False) -> float | None:
    """CPU ms per request of the processes `mine` picks, in `target`'s run, less their idle use.

    Idle use is their CPU per second during the direct run at the same rate, when nothing was sent
    through them.
    """
    run, idle = by_target.get(target), by_target.get("direct")
    if run is None or not run["requests"]:
        return None
    used = sum(v for name, v in run["cpu_s"].items() if mine(name))
    if not total:
        if idle is None:
            return None
        used -= sum(v for name, v in idle["cpu_s"].items() if mine(name)) / idle["wall_s"] * run["wall_s"]
    return used * 1000 / run["requests"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


# --- sections --------------------------------------------------------------------------------------


def _overhead(data: dict, results: Path, plt) -> list[str]:
    meta = data["meta"]
    lines = [
        "## 1. Overhead: Baton and LiteLLM in front of the same provider",
        "",
        f"A local OpenAI stand-in answers every chat completion after a fixed {meta['provider_latency_ms']} ms. "
        "Three clients call it at the same open-loop Poisson arrival schedule (same seed per rate): "
        "**direct** (the stand-in itself), **Baton** ("
        + ("gateway → Kafka → router → executor → stand-in and back, `router.direct_single_step` on"
           if meta["plan"].get("direct") else "gateway → Kafka → router → synthesizer → executor → stand-in and back")
        + "; static one-step plan on one `openai_compatible` worker) and **LiteLLM** "
        f"(proxy {meta['litellm']}, in its own venv). Overhead = percentile through the proxy − "
        "the same percentile direct, in the same run; ratio = Baton's overhead ÷ LiteLLM's. At each rate the "
        f"measuring time is cut into {data['runs'][0].get('rounds', 1)} round(s) in which every target takes a "
        "turn, in rotating order, and each target's samples are pooled: a burst from another tenant of the "
        "machine then lands on all targets alike rather than on one.",
        "",
        f"LiteLLM runs as {meta.get('litellm_workers', 1)} worker process(es); Baton as five Python processes plus "
        "Kafka's JVM. When other tenants keep the cores busy, Linux shares CPU between runnable threads, so the "
        "system spread over more processes gets more of a contended machine: on a busy machine the ratio "
        "leans towards Baton more than it would on an idle one. Read it with the CPU-per-request table "
        "below, which does not depend on scheduling.",
        "",
        "| rate (req/s) | pct | direct ms | Baton ms | LiteLLM ms | Baton overhead ms | LiteLLM overhead ms | ratio |",
        "|---:|:--|---:|---:|---:|---:|---:|---:|",
    ]
    swamped = _swamped(data)
    for r in data["overhead"]:
        baton = _fmt(r["baton_ms"]) + (" ⚠" if (r["rate"], "baton") in swamped else "")
        peer = _fmt(r["litellm_ms"]) + (" ⚠" if (r["rate"], "litellm") in swamped else "")
        lines.append(f"| {_fmt(r['rate'], 0)} | {r['percentile']} | {_fmt(r['direct_ms'])} | {baton} | {peer} | "
                     f"**{_fmt(r['baton_overhead_ms'])}** | **{_fmt(r['litellm_overhead_ms'])}** | "
                     f"**{_fmt(r['ratio'], 2)}** |")
    if swamped:
        lines += ["", f"⚠ p99 above {SWAMPED_P99_MS:g} ms: at that rate the target was past what it could serve on "
                  "this machine at that moment, and its \"overhead\" there is mostly queueing for CPU."]
    lines += ["", "Samples and the client's own behaviour per run. Latency is timed from the moment a request "
              "actually left, so a late generator does not inflate it, but a send lag p99 near 100 ms would mean "
              "the arrivals were burstier than scheduled:", "",
              "| rate | target | measured requests | errors | client procs | send lag p99 ms | client CPU ms/req | "
              "CPU of other tenants (cores) |",
              "|---:|:--|---:|:--|---:|---:|---:|---:|"]
    for run in data["runs"]:
        s = run["summary"]
        lines.append(f"| {_fmt(run['rate'], 0)} | {run['target']} | {s['sent']} | {s['errors'] or '–'} | "
                     f"{s['client_procs']} | {_fmt(s['lag_p99_ms'])} | {_fmt(s['client_cpu_ms_per_request'], 2)} | "
                     f"{_fmt(run['cpu']['others_cores'], 2)} |")
    lines += ["", "CPU per request, from /proc, in ms (Kafka counted with Baton: it is on Baton's path). A "
              "process's CPU over a run divided by the requests of that run includes its idle background "
              "(heartbeats, polls, the broker's own housekeeping), which dominates at low rates; *marginal* "
              "takes out what the same processes used while idle during the direct run at that rate.", ""]
    header = ("| rate | " + " | ".join(BATON_PROCS)
              + " | **Baton total** | **Baton marginal** | **LiteLLM total** | **LiteLLM marginal** |")
    lines += [header, "|" + "---:|" * (len(BATON_PROCS) + 5)]
    for run in data["runs"]:
        if run["target"] != "baton":
            continue
        by = {x["target"]: x["cpu"] for x in data["runs"] if x["rate"] == run["rate"]}
        per = _baton_cpu_ms(run["cpu"])
        baton_ms = sum(per.values())
        baton_marginal = _marginal_ms(by, "baton", _is_baton)
        lite = _marginal_ms(by, "litellm", lambda name: name == "litellm", total=True)
        lite_marginal = _marginal_ms(by, "litellm", lambda name: name == "litellm")
        lines.append(f"| {_fmt(run['rate'], 0)} | " + " | ".join(_fmt(per.get(p), 2) for p in BATON_PROCS)
                     + f" | **{_fmt(baton_ms, 2)}** | **{_fmt(baton_marginal, 2)}** | **{_fmt(lite, 2)}** | "
                     f"**{_fmt(lite_marginal, 2)}** |")
    lines.append("")
    if data.get("ttft"):
        lines += ["Time to first token: streaming requests one at a time, the stand-in pausing "
                  f"{data['ttft'][0].get('chunk_delay_ms', 20)} ms between chunks; with Baton only the last step "
                  "streams (here the only one), from the executor through Kafka to the gateway.", "",
                  "| target | requests | first token p50 ms | first token p95 ms | whole stream p50 ms | "
                  "first token p50 over direct ms |", "|:--|---:|---:|---:|---:|---:|"]
        for r in data["ttft"]:
            lines.append(f"| {r['target']} | {r['requests']} | {_fmt(r['ttft_p50_ms'])} | {_fmt(r['ttft_p95_ms'])} | "
                         f"{_fmt(r['stream_p50_ms'])} | {_fmt(r.get('ttft_p50_overhead_ms'))} |")
        lines.append("")
    if plt is not None:
        _plot_overhead(data, results / "overhead.png", plt)
        lines += ["![latency and overhead vs rate](overhead.png)", ""]
    return lines


def _plot_overhead(data: dict, path: Path, plt) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
    rates = sorted({r["rate"] for r in data["runs"]})
    for col, q in enumerate(("p50", "p95", "p99")):
        ax = axes[0][col]
        for target in data["targets"]:
            ys = [next((r["summary"][f"{q}_ms"] for r in data["runs"] if r["rate"] == x and r["target"] == target),
                       None) for x in rates]
            ax.plot(rates, ys, marker="o", label=target, color=COLOURS.get(target))
        ax.set_title(f"{q} latency")
        ax.set_yscale("log")  # one saturated target would flatten every other line
        ax.set_ylabel("ms (log)")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        ax = axes[1][col]
        rows = [r for r in data["overhead"] if r["percentile"] == q]
        for name in ("baton", "litellm"):
            ax.plot([r["rate"] for r in rows], [r[f"{name}_overhead_ms"] for r in rows], marker="o",
                    label=f"{name} overhead", color=COLOURS[name])
        ax.set_title(f"{q} overhead over direct")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("ms (log)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Latency through Baton and LiteLLM vs the provider called directly")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput(data: dict, results: Path, plt) -> list[str]:
    c = data["criterion"]
    lines = [
        "## 2. Throughput: highest sustained workflows per second, broker included",
        "",
        f"Open-loop Poisson load through the gateway (same one-step plan, stand-in at "
        f"{data['meta']['provider_latency_ms']} ms), stepping the offered rate up, {c['step_s']:g} s per step after "
        "a 1 s warm-up, until a step fails. **A step passes when** (1) " + c["all_answered"] + f"; (2) p99 latency "
        f"≤ {c['p99_limit_ms']:g} ms; and (3) the load generator kept its schedule (send lag p99 ≤ "
        f"{c['client_lag_limit_ms']:g} ms; otherwise the step is *client-bound* and says nothing about Baton). "
        "A step that fails is run once more (one burst from another tenant can spoil one window); the rate "
        "fails only if both tries do. A short step can pass at a rate the system cannot hold, its queue "
        f"having no time to grow: the highest step that passed is then held for {c.get('hold_s', 0):g} s, and "
        "15% less each time it fails. Max sustained = the rate that held.",
        "",
        f"**Max sustained: {_fmt(data['max_sustained_rps'], 0)} workflows/s** for {c.get('hold_s', 0):g} s "
        f"(achieved {_fmt(data['achieved_rps_at_max'])} answered/s); highest {c['step_s']:g} s step that passed: "
        f"{_fmt(data.get('step_max_rps'), 0)}/s; stepping up stopped by: {data['stopped_by']}.",
        "",
        "| offered/s | sent | answered | shed (429) | achieved/s | p50 ms | p95 ms | p99 ms | max ms | send lag p99 ms | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|",
    ]
    for st, held in [*((x, False) for x in data["steps"]), *((x, True) for x in data.get("holds", []))]:
        s = st["summary"]
        again = " (2nd)" if st.get("attempt", 1) > 1 else ""
        again += f" (held {st['seconds']:g} s)" if held else ""
        lines.append(f"| {_fmt(st['offered_rps'], 0)}{again} | {s['sent']} | {s['ok']} | {s.get('shed', 0)} | {_fmt(s['achieved_rps'])} | "
                     f"{_fmt(s['p50_ms'])} | {_fmt(s['p95_ms'])} | {_fmt(s['p99_ms'])} | {_fmt(s['max_ms'])} | "
                     f"{_fmt(s['lag_p99_ms'])} | {st['verdict']}: {st['why']} |")
    lines += ["", "Share of one core used by each process during each step (a Python service near 1.0 is "
              "saturated: one process runs on one core):", ""]
    names = sorted({n for st in data["steps"] for n in st["cpu"]["core_share"]})
    lines += ["| offered/s | " + " | ".join(names) + " | client | other tenants | machine busy |",
              "|" + "---:|" * (len(names) + 4)]
    for st in data["steps"]:
        cpu = st["cpu"]
        again = " (2nd)" if st.get("attempt", 1) > 1 else ""
        lines.append(f"| {_fmt(st['offered_rps'], 0)}{again} | "
                     + " | ".join(_fmt(cpu["core_share"].get(n), 2) for n in names)
                     + f" | {_fmt(cpu['client_cores'], 2)} | {_fmt(cpu['others_cores'], 2)} | "
                     f"{_fmt(cpu['machine_busy_share'] * 100, 0)}% |")
    runs = [(st, False) for st in data["steps"]] + [(st, True) for st in data.get("holds", [])]
    if any("rss_mb" in st["cpu"] for st, _ in runs):
        lines += ["", "Resident memory of each process at the end of each step (MB, from /proc; the goal is at most "
                  "200 MB for each Baton service under load):", "",
                  "| offered/s | " + " | ".join(names) + " |", "|" + "---:|" * (len(names) + 1)]
        for st, held in runs:
            rss = st["cpu"].get("rss_mb", {})
            label = _fmt(st["offered_rps"], 0) + (" (2nd)" if st.get("attempt", 1) > 1 else "")
            label += f" (held {st['seconds']:g} s)" if held else ""
            lines.append(f"| {label} | " + " | ".join(_fmt(rss.get(n), 0) for n in names) + " |")
    lines.append("")
    if plt is not None:
        _plot_throughput(data, results / "throughput.png", plt)
        lines += ["![throughput curve](throughput.png)", ""]
    return lines


def _plot_throughput(data: dict, path: Path, plt) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    # One point per rate: the try that decided it (the last one).
    steps = list({st["offered_rps"]: st for st in data["steps"]}.values())
    xs = [st["offered_rps"] for st in steps]
    ax1.plot(xs, xs, linestyle="--", color="#aaaaaa", label="offered (nominal)")
    # Poisson arrivals: the count actually sent in a step varies around the nominal rate.
    ax1.plot(xs, [st["summary"]["sent"] / data["criterion"]["step_s"] for st in steps], linestyle="none",
             marker="x", color="#555555", label="sent")
    ax1.plot(xs, [st["summary"]["achieved_rps"] for st in steps], marker="o", label="answered (200)",
             color=COLOURS["baton"])
    for verdict in ("fail", "client-bound"):
        failed = [st for st in steps if st["verdict"] == verdict]
        if failed:
            ax1.scatter([st["offered_rps"] for st in failed], [st["summary"]["achieved_rps"] for st in failed],
                        color="red" if verdict == "fail" else "orange", zorder=3, label=verdict)
    ax1.set_xlabel("offered workflows/s")
    ax1.set_ylabel("answered workflows/s")
    ax1.set_title("Throughput")
    ax1.grid(alpha=0.3)
    ax1.legend()
    for q, style in (("p50", "-"), ("p95", "-."), ("p99", "--")):
        ax2.plot(xs, [st["summary"][f"{q}_ms"] for st in steps], marker="o", linestyle=style, label=q)
    ax2.axhline(data["criterion"]["p99_limit_ms"], color="red", alpha=0.5, label="p99 bound")
    ax2.set_yscale("log")
    ax2.set_xlabel("offered workflows/s")
    ax2.set_ylabel("latency ms (log)")
    ax2.set_title("Latency through Baton")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _limits(data: dict, results: Path, plt) -> list[str]:
    lines = [
        "## 4. Limits: executor replicas sharing a provider's request limit",
        "",
        f"The stand-in allows {data['limit_per_s'] * data['window_s']:g} requests in any sliding "
        f"{data['window_s']:g} s window ({data['limit_per_s']:g}/s) and answers 429 beyond that; it answers "
        f"in {data['provider_latency_ms']} ms. The executors are configured with the same limit "
        f"(`rpm: {int(data['limit_per_s'] * 60)}`). Method: {data['method']}, at {data['overload']:g}× the "
        "limit. Observed rate = completions per second between the 10th and 80th percentile of completion "
        "times (the ends are start-up and partitions running dry); 429s are counted by the stand-in.",
        "",
        "| replicas | limit shares | offered | completed | failed | lost | observed/s | of limit | 429s | "
        "provider calls | drained in s |",
        "|---:|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        shares = ", ".join(f"{s:.3f}" for s in r["shares"])
        share = f"{r['share_of_limit'] * 100:.1f}%" if r["share_of_limit"] else "–"
        lines.append(f"| {r['replicas']} | {shares} | {r['offered']} | {r['completed']} | {r['failed']} | "
                     f"{r['lost']} | **{_fmt(r['observed_rps'], 2)}** | {share} | **{r['rate_limited_429']}** | "
                     f"{r['provider_calls']} | {_fmt(r['drained_s'])} |")
    lines.append("")
    if plt is not None:
        _plot_limits(data, results / "limits.png", plt)
        lines += ["![observed rate per replica count](limits.png)", ""]
    return lines


def _plot_limits(data: dict, path: Path, plt) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    runs = data["runs"]
    xs = [str(r["replicas"]) for r in runs]
    bars = ax.bar(xs, [r["observed_rps"] or 0 for r in runs], color=COLOURS["baton"])
    ax.axhline(data["limit_per_s"], color="red", linestyle="--", label=f"provider limit {data['limit_per_s']:g}/s")
    for bar, r in zip(bars, runs, strict=True):
        ax.annotate(f"{r['observed_rps']}/s\n429s: {r['rate_limited_429']}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height() / 2), ha="center", va="center",
                    fontsize=9, color="white")
    ax.set_ylim(0, data["limit_per_s"] * 1.5)
    ax.set_xlabel("executor replicas")
    ax.set_ylabel("completed calls/s")
    ax.set_title("Rate against a rate-limited provider")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _overload(data: dict, results: Path, plt) -> list[str]:
    dropped = data["expired_after_restart"]
    took = data["restart_s"]
    lines = [
        "## 5. Restarts, and an overload that ends well",
        "",
        f"Through the same stack ({data['path']} path, request deadline {data['request_timeout_s']:g} s): a modest "
        f"rate; again just after every service was restarted with nothing queued (in {took['clean']:g} s, stop to "
        "ready, as a rollout does); an overload, cut short by stopping every service as its last request is sent, "
        "which leaves requests, plans and tasks queued on the broker; and the modest rate again once every "
        f"service is back (in {took['backlog']:g} s, the broker's data kept). **A run passes when** every request "
        f"sent got an answer and p99 ≤ {data['p99_limit_ms']:g} ms. After the restart over the backlog, work whose "
        "deadline had passed is dropped at each hop before any provider call:",
        "",
        "| run | offered/s | seconds | sent | answered | shed (429) | errors | p50 ms | p99 ms | verdict |",
        "|:--|---:|---:|---:|---:|---:|:--|---:|---:|:--|",
    ]
    for r in data["runs"]:
        s = r["summary"]
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())) or "–"
        lines.append(f"| {r['run']} | {_fmt(r['offered_rps'], 0)} | {r['seconds']:g} | {s['sent']} | {s['ok']} | "
                     f"{s.get('shed', 0)} | {errors} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | {r['verdict']} |")
    lines += ["", "Dropped past their deadline after the restart: "
              + ", ".join(f"`{name}` {value:g}" for name, value in dropped.items()) + ".", ""]
    return lines


def _tracing(data: dict, results: Path, plt) -> list[str]:
    lines = [
        "## 6. What tracing costs",
        "",
        f"The same stack restarted for each setting and driven at {_fmt(data['rate'], 0)} workflows/s for "
        f"{data['seconds']:g} s, the settings in turn, {data['rounds']} round(s). CPU per workflow counts every "
        "Baton process and the broker (not the provider stand-in). *off*: no exporter, so no span is recorded; "
        "*10% (default)*: spans exported, the services' default sampler (`parentbased_traceidratio` at 0.1), under "
        "which a trace not sampled makes no span objects at any hop; *100%*: `parentbased_always_on`.",
        "",
        "| tracing | CPU ms / workflow | per round | answered / sent | p99 ms | per process (ms) |",
        "|:--|---:|:--|---:|---:|:--|",
    ]
    for row in data["settings"]:
        procs = ", ".join(f"{n} {v:g}" for n, v in sorted(row["per_process_ms"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {row['setting']} | {row['cpu_ms_per_workflow']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in row['per_round_ms'])} | {row['answered']} / {row['sent']} | "
                     f"{_fmt(row['p99_ms'])} | {procs} |")
    return lines + [""]


def _clients(data: dict, results: Path, plt) -> list[str]:
    lines = [
        "## 7. What one Kafka hop costs, by client",
        "",
        f"A relay process consumes a topic of {data['partitions']} partitions and publishes every record to another, "
        "as each service's hop does, at "
        f"{_fmt(data['rate'], 0)} records/s for {data['seconds']:g} s, the relays in turn, {data['rounds']} round(s) "
        "(`bench/kafka_clients.py`). Its CPU is the relay process's, client threads included, ÷ records sent; "
        "the broker's is beside it. Latency is from the driver's send to its read of the relayed record. Every "
        "producer is idempotent with acks=all and a 1 ms linger, as the services' are.",
        "",
        "| relay | relay CPU ms / record | per round | broker CPU ms / record | relayed / sent | p50 ms | p99 ms |",
        "|:--|---:|:--|---:|---:|---:|---:|",
    ]
    for row in data["relays"]:
        lines.append(f"| {row['relay']} | {row['relay_cpu_ms_per_record']:.3f} | "
                     f"{', '.join(f'{v:.3f}' for v in row['per_round_ms'])} | {row['broker_cpu_ms_per_record']:.3f} | "
                     f"{row['relayed']} / {row['sent']} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} |")
    return lines + [""]


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _profile(data: dict, results: Path, plt) -> list[str]:
    s, cpu, hops = data["summary"], data["cpu"], data["hops"]
    lines = [
        "## 3. Where the time goes: CPU profiles and per-hop latency",
        "",
        f"Steady open-loop load at **{_fmt(data['rate'], 0)} workflows/s** for {data['duration_s']:g} s (same plan and "
        f"stand-in as above): {s['sent']} sent, {s['ok']} answered, p50 {_fmt(s['p50_ms'])} ms, p99 "
        f"{_fmt(s['p99_ms'])} ms. Meanwhile py-spy sampled every service {data['py_spy_hz']} times a second "
        f"without pausing it (costing {_fmt(data['profiler_cores'], 2)} cores itself), and the services exported "
        f"the traces of {_pct(data['trace_sample'])} of workflows (`parentbased_traceidratio`) over OTLP/HTTP to "
        "a receiver in the bench process, as a deployment with tracing on would. Load average before and after: "
        + "; ".join(", ".join(f"{x:.2f}" for x in la) for la in data["load_average"]) + ".",
        "",
        "CPU per workflow (ms, from /proc: everything the process used over the run ÷ workflows answered, idle "
        "background included) and share of one core:",
        "",
    ]
    names = sorted(cpu["cpu_s"])
    lines += ["| | " + " | ".join(names) + " |", "|:--|" + "---:|" * len(names),
              "| CPU ms / workflow | " + " | ".join(_fmt(data["cpu_ms_per_workflow"][n], 2) for n in names) + " |",
              "| share of a core | " + " | ".join(_fmt(cpu["core_share"][n], 2) for n in names) + " |"]
    if "rss_mb" in cpu:
        lines.append("| resident MB at the end | " + " | ".join(_fmt(cpu["rss_mb"].get(n), 0) for n in names) + " |")
    lines.append("")
    lines += [
        f"**Per hop**, from {hops['workflows']} sampled workflows that took the usual path "
        f"({hops['traces']} traces, {hops['spans']} spans collected). *in X* runs from X starting to handle a "
        "message (the gateway: the HTTP request) to X starting to publish the next one; *X → Y (Kafka)* from X "
        "starting to publish to Y starting to process: the producer's send and batching, the broker and Y's "
        "poll. The last *in gateway* runs to the end of the HTTP span. *In executor* includes the provider "
        f"call ({data['meta']['provider_latency_ms']} ms at the stand-in), shown again below it.",
        "",
        "| hop | p50 ms | p99 ms | mean ms |",
        "|:--|---:|---:|---:|",
    ]
    for h in hops["hops"]:
        lines.append(f"| {h['hop']} | {_fmt(h['p50_ms'], 2)} | {_fmt(h['p99_ms'], 2)} | {_fmt(h['mean_ms'], 2)} |")
    lines += _capacity(data)
    lines += ["", "**Hot spots.** A share is of the samples in which that process was running (samples blocked in "
              "epoll, a condition wait, an idle worker thread or a blocking socket read are left out): "
              "*self* = that function was on top, *total* = anywhere on the stack. Time inside a C extension "
              "(protobuf, the JSON encoder, hashing) counts as self time of the Python function that called it. "
              "Raw stacks (`profile-<process>.txt`, flame graph collapsed format) sit beside this report. py-spy "
              "samples wall time: a thread the kernel preempted while it held the GIL (more runnable threads than "
              "cores) is sampled where it stopped, for as long as it waits, so busy samples can exceed the CPU "
              "/proc measured (each process shows both) and a share under ~5% from one short run may be a single "
              "preemption: pool the stacks of several runs before acting on it.", ""]
    for name, p in data["profiles"].items():
        measured = cpu["cpu_s"].get(name)
        lines += [f"### {name} — [flame graph]({p['flame_graph']}), {p['samples']} busy samples", "",
                  f"{p['waiting_samples']} samples were waits and are left out; the busy ones come to "
                  f"{_fmt(p['busy_s'], 2)} s against {_fmt(measured, 2)} s of CPU that /proc measured over the run, "
                  f"{_fmt(p['user_s'], 2)} s in user mode and {_fmt(p['system_s'], 2)} s in the kernel.", "",
                  "By library (standard-library frames counted to their caller; `asyncio` is the loop's own "
                  "work): " + ", ".join(f"{x['library']} {_pct(x['self'])}" for x in p["by_library"][:10]) + ".", "",
                  "| function (self) | self | total | most often called from |", "|:--|---:|---:|:--|"]
        for f in p["top_self"]:
            lines.append(f"| `{f['function']}` | {_pct(f['self'])} | {_pct(f['total'])} | `{f.get('via', '')}` |")
        lines += ["", "Baton's own functions by total time (what they called included): "
                  + "; ".join(f"`{f['function']}` {_pct(f['total'])}" for f in p["top_total"][:8]) + ".", ""]
    for name, err in data.get("profile_errors", {}).items():
        lines.append(f"- {name}: not profiled ({err})")
    return lines + [""]


def _capacity(data: dict) -> list[str]:
    rows = capacity.plan(data["cpu_ms_per_workflow"])
    lines = ["", f"**Capacity** for 1,000 one-step workflows/s from these figures (`bench/capacity.py`): cores = "
             f"1,000 × CPU ms per workflow ÷ 1,000; replicas (the broker: cores) = cores ÷ {capacity.UTILIZATION:g}, "
             "rounded up, as each service is one process using at most one core.", "",
             "| service | CPU ms / workflow | cores | replicas |", "|:--|---:|---:|---:|"]
    lines += [f"| {r['service']} | {r['cpu_ms_per_workflow']:.2f} | {r['cores']:.2f} | {r['replicas']} |" for r in rows]
    return lines + [""]


# The goals each bench figure is read against.
GOAL_CPU_MS = 3.0  # CPU per one-step workflow, every Baton process and the broker together
GOAL_HELD_RPS = 700.0  # workflows/s held with p99 under the limit
GOAL_RSS_MB = 200.0  # each service's resident memory at the highest rate
GOAL_RESTART_P99_MS = 1000.0  # p99 of the modest rate after a restart over an overload's backlog


def goals(present: dict) -> list[dict]:
    """Each goal the parts of this report measure: its figure, the goal and whether it is met."""
    out = []
    if "profile" in present:
        pr = present["profile"]
        total = sum(capacity.per_service(pr["cpu_ms_per_workflow"]).values())
        path = "direct" if pr["meta"].get("plan", {}).get("direct") else "synthesizer"
        out.append({"goal": f"CPU per one-step workflow at {_fmt(pr['rate'], 0)}/s ({path} path), every Baton "
                    "process and the broker", "figure": f"{total:.2f} ms", "target": f"≤ {GOAL_CPU_MS:g} ms", "met": total <= GOAL_CPU_MS})
        # Each service process on its own (an executor replica is one), the broker left out.
        rss = {n: v for n, v in pr["cpu"].get("rss_mb", {}).items() if capacity.service_of(n) not in (None, "kafka")}
        if rss:
            top = max(rss, key=lambda n: rss[n])
            out.append({"goal": f"resident memory of the largest service at {_fmt(pr['rate'], 0)}/s ({top})",
                        "figure": f"{rss[top]:.0f} MB", "target": f"≤ {GOAL_RSS_MB:g} MB",
                        "met": rss[top] <= GOAL_RSS_MB})
    if "throughput" in present:
        t = present["throughput"]
        held = t["max_sustained_rps"] or 0.0
        out.append({"goal": f"workflows/s held for {t['criterion'].get('hold_s', 0):g} s", "figure": f"{held:.0f}/s",
                    "target": f"≥ {GOAL_HELD_RPS:g}/s", "met": held >= GOAL_HELD_RPS})
    if "overload" in present:
        after = present["overload"]["runs"][-1]["summary"]
        p99 = after["p99_ms"]
        met = p99 is not None and p99 < GOAL_RESTART_P99_MS and after["ok"] == after["sent"]
        out.append({"goal": f"after an overload and a restart over its backlog ({present['overload']['path']} path)",
                    "figure": f"{after['ok']}/{after['sent']} answered, p99 {_fmt(p99, 0)} ms",
                    "target": f"all answered, p99 < {GOAL_RESTART_P99_MS:g} ms", "met": met})
    return out


def _goals(present: dict) -> list[str]:
    rows = goals(present)
    if not rows:
        return []
    lines = ["| goal | this run | target | met |", "|:--|---:|---:|:--|"]
    lines += [f"| {g['goal']} | {g['figure']} | {g['target']} | {'yes' if g['met'] else '**no**'} |" for g in rows]
    return lines + [""]


def _summary(present: dict) -> list[str]:
    lines = ["## Summary", ""] + _goals(present)
    if "overhead" in present:
        rows = present["overhead"]["overhead"]
        for rate in sorted({r["rate"] for r in rows}):
            parts = []
            for r in (x for x in rows if x["rate"] == rate):
                parts.append(f"{r['percentile']} {_fmt(r['baton_overhead_ms'])} vs {_fmt(r['litellm_overhead_ms'])} ms "
                             f"(×{_fmt(r['ratio'], 2)})")
            lines.append(f"- Overhead at {_fmt(rate, 0)} req/s, Baton vs LiteLLM: " + "; ".join(parts))
    if "throughput" in present:
        t = present["throughput"]
        lines.append(f"- Max sustained throughput: **{_fmt(t['max_sustained_rps'], 0)} workflows/s** held for "
                     f"{t['criterion'].get('hold_s', 0):g} s (highest short step that passed: "
                     f"{_fmt(t.get('step_max_rps'), 0)}/s; stopped by: {t['stopped_by']})")
        held = [h for h in t.get("holds", []) if h["verdict"] == "pass" and "rss_mb" in h["cpu"]]
        if held:
            rss = held[-1]["cpu"]["rss_mb"]
            lines.append(f"- Resident memory (MB) after the {_fmt(held[-1]['offered_rps'], 0)}/s hold: "
                         + ", ".join(f"{n} {_fmt(v, 0)}" for n, v in sorted(rss.items(), key=lambda kv: -kv[1])))
    if "profile" in present:
        pr = present["profile"]
        per = pr["cpu_ms_per_workflow"]
        lines.append(f"- CPU ms per workflow at {_fmt(pr['rate'], 0)}/s: "
                     + ", ".join(f"{n} {_fmt(v, 2)}" for n, v in sorted(per.items(), key=lambda kv: -kv[1])))
    if "limits" in present:
        lim = present["limits"]
        parts = [f"{r['replicas']} → {_fmt(r['observed_rps'], 2)}/s, {r['rate_limited_429']} × 429"
                 for r in lim["runs"]]
        lines.append(f"- Limit {lim['limit_per_s']:g}/s, replicas → observed rate: " + "; ".join(parts))
    return lines + [""]


# --- the report ----------------------------------------------------------------------------------


def render(results: Path, echo=print) -> Path | None:
    parts = {name: _load(results, name) for name in ("overhead", "throughput", "profile", "limits", "tracing",
                                                      "overload", "clients")}
    present = {k: v for k, v in parts.items() if v}
    if not present:
        echo(f"no results in {results}: run bench/run.py first")
        return None
    plt = _pyplot()
    meta = max((p["meta"] for p in present.values()), key=lambda m: m["date"])
    lines = [
        "# Baton benchmarks",
        "",
        f"Last run {meta['date']} · `{meta['command']}` · commit {meta['commit']}"
        + (" (with local changes)" if meta.get("worktree_dirty") else "") + f" · Python {meta['python']}",
        "",
        f"Machine: {meta['cpus']} CPUs ({meta['cpu_model']}); load average at start "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average_at_start'])}. Everything — Kafka, every Baton "
        "service, the LiteLLM proxy, the provider stand-in and the load generators — shares these cores, and "
        "other tenants' use of them during each run is shown (\"other tenants\"). Numbers from a busy "
        "two-core machine are noisy: compare figures from one run with each other, not across runs. "
        "This is a benchmark, not a test: nothing here gates CI.",
        "",
    ]
    lines += _summary(present)
    for name, build in (("overhead", _overhead), ("throughput", _throughput), ("profile", _profile),
                        ("limits", _limits), ("overload", _overload), ("tracing", _tracing), ("clients", _clients)):
        if name in present:
            section = build(present[name], results, plt)
            m = present[name]["meta"]
            # Sections may come from different runs (--only); each names its own.
            section[1:1] = ["", f"*Measured {m['date']} by `{m['command']}`; load average at start "
                            f"{', '.join(f'{x:.2f}' for x in m['load_average_at_start'])}, at end "
                            f"{', '.join(f'{x:.2f}' for x in m.get('load_average_at_end', []))}.*"]
            lines += section
    if plt is None:
        lines += ["(matplotlib is not installed: no plots drawn.)", ""]
    path = results / "REPORT.md"
    path.write_text("\n".join(lines))
    echo(f"report: {path}")
    return path
