"""Capacity planning from the bench's CPU per workflow: replicas of each service, and broker cores,
for a given rate of one-step workflows.

Each Baton service is one asyncio process, so it uses at most one core: a replica is planned as one
core, run at `UTILIZATION` of it, and the broker's cores likewise. Past that, queueing grows
steeply (the bench's latency rises well before a core is full). For a process that used `ms` of CPU
per workflow in the profile run:

    cores    = rate x ms / 1000
    replicas = ceil(cores / UTILIZATION)       (at least 1)

The profile run measures one provider's executors together; with several providers, each
provider's executors take the share of the rate that its steps are. The rate is the workflows
answered; a plan of k steps costs the executor k times its one-step figure.
"""

from __future__ import annotations

import math

UTILIZATION = 0.6
# The processes that scale with the workflow rate, as the profile names them; executors are summed.
SERVICES = ("gateway", "router", "synthesizer", "executor", "reward-logger", "console", "kafka")


def service_of(process: str) -> str | None:
    """The one of SERVICES a bench process belongs to (`executor-<provider>-<i>` is an executor), or None
    (the stand-in, the load generator)."""
    key = "executor" if process.startswith("executor-") else process
    return key if key in SERVICES else None


def per_service(cpu_ms_per_workflow: dict[str, float]) -> dict[str, float]:
    """CPU ms per workflow of each of SERVICES (executor replicas added together) that the run had."""
    out: dict[str, float] = {}
    for name, ms in cpu_ms_per_workflow.items():
        key = service_of(name)
        if key is not None:
            out[key] = out.get(key, 0.0) + ms
    return out


def plan(cpu_ms_per_workflow: dict[str, float], rate: float = 1000.0, utilization: float = UTILIZATION) -> list[dict]:
    """One row per service: its CPU ms per workflow, the cores `rate` workflows/s need, and the replicas
    (for the broker: cores) that keep each at `utilization`."""
    if rate <= 0 or not 0 < utilization <= 1:
        raise ValueError("the rate must be positive and the utilization in (0, 1]")
    rows = []
    for name, ms in sorted(per_service(cpu_ms_per_workflow).items(), key=lambda kv: SERVICES.index(kv[0])):
        cores = rate * ms / 1000
        rows.append({"service": name, "cpu_ms_per_workflow": round(ms, 3), "cores": round(cores, 2),
                     "replicas": max(1, math.ceil(round(cores / utilization, 6)))})
    return rows
