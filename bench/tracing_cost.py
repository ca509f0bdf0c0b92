"""What tracing costs: CPU per workflow, every Baton process and the broker together, with tracing
off, at the default sampling of a tenth of traces, and with every trace recorded.

Each setting is the same stack restarted with its OTEL_* variables and driven at one rate. The
settings take turns in rounds, so a change in what else the machine does lands on all of them
alike; each setting's figure is its rounds' CPU over their requests together.
"""

from __future__ import annotations

import time

from loadgen import Load, generate, procs_for

# The sampler variables of each setting, over the stack's export to the bench's span receiver.
SETTINGS: dict[str, dict[str, str]] = {
    "off": {"OTEL_TRACES_EXPORTER": "none"},
    # The services' default once spans are exported, named here so that older services measure alike.
    "10% (default)": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    "100%": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}
_SAMPLER_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")


def bench(plan, stack, meter, metered, echo, emit) -> dict:
    """`metered(meter, load)` runs a load and reads `meter` around it (bench/run.py's)."""
    exporting = {k: v for k, v in stack.extra_env.items() if k not in _SAMPLER_VARIABLES}
    readings: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for round_ in range(plan.tracing_rounds):
        for name, variables in SETTINGS.items():
            stack.stop()
            stack.extra_env = {**exporting, **variables}
            stack.start(echo=lambda *_: None)
            meter.roots.update({s.name: s.pid for s in stack.services if s.pid})
            load = dict(url=stack.base_url, model="baton", rate=plan.tracing_rps, timeout_s=plan.request_timeout_s + 5,
                        procs=procs_for(plan.tracing_rps))
            generate(Load(**load, duration_s=plan.warm_s, warmup_s=0.0, seed=800 + round_))  # imports, caches
            echo(f"tracing bench, round {round_ + 1}, tracing {name}: {plan.tracing_rps:g} workflows/s for "
                 f"{plan.tracing_s:g} s ...")
            out, cpu = metered(meter, Load(**load, duration_s=plan.tracing_s, warmup_s=1.0, seed=810 + round_))
            readings[name].append({"summary": out["summary"], "cpu_s": cpu["cpu_s"], "requests": cpu["requests"],
                                   "wall_s": cpu["wall_s"]})
    stack.stop()
    stack.extra_env = {**exporting}
    stack.start(echo=echo)
    rows = [_row(name, runs, exclude=("standin",)) for name, runs in readings.items()]
    for row in rows:
        emit({"bench": "tracing", "kind": "setting", **{k: v for k, v in row.items() if k != "runs"}})
    return {"rate": plan.tracing_rps, "seconds": plan.tracing_s, "rounds": plan.tracing_rounds,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "settings": rows}


def _row(name: str, runs: list[dict], exclude: tuple[str, ...]) -> dict:
    """One setting's CPU per workflow: every process but `exclude` (the provider stand-in), summed
    over its rounds, and the same per process; with the rounds' own totals, to show their spread."""
    requests = sum(r["requests"] for r in runs) or 1
    names = sorted({n for r in runs for n in r["cpu_s"] if n not in exclude})
    per_process = {n: round(sum(r["cpu_s"].get(n, 0.0) for r in runs) * 1000 / requests, 3) for n in names}
    per_round = [round(sum(v for n, v in r["cpu_s"].items() if n not in exclude) * 1000 / max(r["requests"], 1), 3)
                 for r in runs]
    return {"setting": name, "cpu_ms_per_workflow": round(sum(per_process.values()), 3),
            "per_round_ms": per_round, "per_process_ms": per_process,
            "answered": sum(r["summary"]["ok"] for r in runs), "sent": sum(r["summary"]["sent"] for r in runs),
            "p99_ms": max((r["summary"]["p99_ms"] or 0) for r in runs), "runs": runs}
