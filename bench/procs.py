"""The processes a benchmark runs besides Baton: the provider stand-in, the LiteLLM proxy (in its
own virtual environment), and a CPU meter that reads what each of them used from /proc."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

from loadgen import favour

from baton_tools import procs
from baton_tools.procs import Child, free_port
from baton_tools.standins.server import READY_MARKER

REPO = Path(__file__).resolve().parents[1]
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = REPO / ".tools" / "litellm"


def wait_http_ok(url: str, child: Child, timeout: float) -> None:
    procs.wait_http_ok(url, child.pid, child.name, child.log, timeout)


# --- the provider stand-in ------------------------------------------------------------------------


def start_standin(log_dir: Path, name: str = "standin", **options) -> tuple[Child, str]:
    """An OpenAI stand-in in its own interpreter; returns it and its base URL (ending in /v1).

    Started here rather than with `run_standin` because the CPU meter needs its pid.
    """
    cmd = [sys.executable, "-m", "baton_tools.standins", "openai", "--port", "0"]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    child = Child(name, cmd, log=log_dir / f"{name}.log", stdout_pipe=True)
    favour(child.pid)
    deadline = time.monotonic() + 30
    with selectors.DefaultSelector() as sel:
        sel.register(child.proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not child.alive():
                child.stop()
                raise RuntimeError(f"stand-in did not start; see {child.log}")
            if sel.select(timeout=left):
                line = child.proc.stdout.readline()
                if line.startswith(READY_MARKER):
                    return child, line[len(READY_MARKER):].strip()


# --- LiteLLM, the peer ------------------------------------------------------------------------------


def find_uv() -> str:
    """The uv the Makefile builds, else one on PATH."""
    local = REPO / ".tools" / "uv" / "bin" / "uv"
    found = str(local) if local.exists() else shutil.which("uv")
    if not found:
        raise RuntimeError("uv not found: run `make install` (it builds .tools/uv) or put uv on PATH")
    return found


def ensure_litellm(echo) -> Path:
    """LiteLLM's proxy in .tools/litellm: its dependencies conflict with the workspace's lock."""
    marker = LITELLM_VENV / f".litellm-{LITELLM_VERSION}"
    if marker.exists() and (LITELLM_VENV / "bin" / "litellm").exists():
        return LITELLM_VENV
    uv = find_uv()
    echo(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...")
    subprocess.run([uv, "venv", "--quiet", "--allow-existing", "--python", "3.11", str(LITELLM_VENV)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(LITELLM_VENV / "bin" / "python"),
                    f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    marker.touch()
    return LITELLM_VENV


def start_litellm(venv: Path, standin_url: str, work_dir: Path, log_dir: Path) -> tuple[Child, str, str]:
    """The proxy in front of the stand-in, as one model `standin`; returns it, its base URL and the model."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: standin\n"
        "    litellm_params:\n"
        "      model: openai/standin-model\n"
        f"      api_base: {standin_url}\n"
        "      api_key: unused\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_TELEMETRY": "False",
        # The proxy otherwise fetches a price list from the internet at start.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # No master key: local use only, as for Baton without BATON_API_KEYS.
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        # Baton's services log at WARNING with no access log; the peer gets the same.
        "LITELLM_LOG": "WARNING",
    }
    env.pop("VIRTUAL_ENV", None)
    # One worker, its default. (With --num_workers 2 this version never answered here within 4 minutes.)
    cmd = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    child = Child("litellm", cmd, log=log_dir / "litellm.log", env=env, cwd=work_dir)
    return child, f"http://127.0.0.1:{port}/v1", "standin"


def litellm_ready_url(base_url: str) -> str:
    return base_url.removesuffix("/v1") + "/health/liveliness"


# --- CPU accounting ---------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (utime is field 14 and stime 15 of stat(5))."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def user_system_s(pid: int) -> tuple[float, float]:
    """CPU seconds a process has spent in user mode and in the kernel (its own threads, not children)."""
    fields = _stat(pid)
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def _proc_table() -> dict[int, tuple[int, float, int]]:
    """pid -> (parent pid, CPU seconds used, resident bytes) for every process visible in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(entry)
        except OSError:
            continue
        # rss is field 24 of stat(5), in pages
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE)
    return table


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return (total - idle) / _TICK, total / _TICK


class CpuMeter:
    """CPU seconds used by named process trees between two readings, and by the machine as a whole."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self._start: dict[str, float] = {}
        self._machine = (0.0, 0.0)
        self._t0 = 0.0

    def _read(self) -> tuple[dict[str, float], dict[str, int]]:
        """Per process tree: CPU seconds used so far, and resident bytes now."""
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        used, resident = {}, {}
        for name, root in self.roots.items():
            total, rss, stack = 0.0, 0, [root]
            while stack:
                pid = stack.pop()
                if pid in table:
                    total += table[pid][1]
                    rss += table[pid][2]
                    stack.extend(children.get(pid, ()))
            used[name], resident[name] = total, rss
        return used, resident

    def start(self) -> None:
        self._start, _ = self._read()
        self._machine = _machine_cpu()
        self._t0 = time.monotonic()

    def stop(self) -> dict:
        """Per process tree: CPU seconds and share of one core over the interval, and resident memory
        at its end (under the load just measured); the machine's busy share."""
        end, resident = self._read()
        busy, total = _machine_cpu()
        wall = max(time.monotonic() - self._t0, 1e-9)
        procs = {name: round(end[name] - self._start.get(name, 0.0), 3) for name in end}
        ours = sum(procs.values())
        machine_busy = busy - self._machine[0]
        cores = (total - self._machine[1]) / wall
        return {
            "wall_s": round(wall, 2),
            "cpu_s": procs,
            "core_share": {name: round(v / wall, 3) for name, v in procs.items()},
            "rss_mb": {name: round(v / 2**20, 1) for name, v in resident.items()},
            "machine_busy_share": round(machine_busy / max(total - self._machine[1], 1e-9), 3),
            # What other tenants of the machine used meanwhile (the load generator is counted there).
            "others_cores": round(max(0.0, machine_busy - ours) / wall, 2),
            "cores": round(cores, 2),
        }
