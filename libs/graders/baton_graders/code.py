"""Code grader: run the candidate against reference tests in a restricted subprocess.

What the sandbox does (Linux/POSIX):

- a fresh temporary directory is the child's working directory and ``HOME``, removed afterwards;
- the child is ``python -I`` (no user site-packages, no ``PYTHON*`` variables, script directory not
  on ``sys.path``) with a minimal environment and stdin from ``/dev/null``;
- ``RLIMIT_AS`` (address space, default 1 GiB), ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_FSIZE``
  (largest file it may write, default 16 MiB) and ``RLIMIT_CORE`` = 0 are set inside the child
  before candidate code runs;
- an audit hook (PEP 578) refuses every ``socket.*`` event (socket creation, connect, bind,
  DNS look-ups) and, by default, process creation (``subprocess``, ``os.system``, ``fork``,
  ``exec``, ``spawn``);
- the child runs in its own session; on the wall-time limit the whole process group is killed
  with SIGKILL, and it is killed after a normal exit too, to reap anything left behind.

What it does not do: audit hooks are not a security boundary. Code that uses ``ctypes`` or
loads a native extension can bypass them, the file system outside the working directory is
readable (and writable where permissions allow), and a determined candidate could forge the
verdict from inside the process. Use it for grading model output in trusted pipelines; run
untrusted code inside a container, VM or seccomp/namespace jail as well.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._types import Grade

_RUNNER = Path(__file__).with_name("_runner.py")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(answer: str) -> tuple[str, str]:
    """Return ``(code, where it came from)``: the last ```python block, else the last bare
    ``` block, else the whole answer."""
    blocks = _FENCE.findall(answer)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1], "last python block"
    bare = [body for lang, body in blocks if not lang]
    if bare:
        return bare[-1], "last fenced block"
    return answer, "whole answer"


def _tail(path: Path, limit: int = 400) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def grade_code(
    answer: str,
    reference: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    block_network: bool = True,
    block_processes: bool = True,
    entry_point: str | None = None,
    python: str | None = None,
    extract: bool = True,
) -> Grade:
    """Score 1 when the candidate's code passes ``reference`` (test code), else 0.

    ``reference`` may hold top-level asserts, ``test_*`` functions, ``unittest.TestCase``
    classes, or a HumanEval-style ``check(candidate)`` (pass ``entry_point``). The tests run in
    the candidate's namespace, and ``from solution import f`` works as well.
    """
    code, origin = extract_code(answer) if extract else (answer, "whole answer")
    if not code.strip():
        return Grade(0.0, "no code found in the answer")
    workdir = Path(tempfile.mkdtemp(prefix="baton-grade-"))
    nonce = secrets.token_hex(16)
    try:
        candidate_path = workdir / "solution.py"
        tests_path = workdir / "tests.py"
        log_path = workdir / "output.log"
        runner_path = workdir / "_runner.py"
        candidate_path.write_text(code, encoding="utf-8")
        tests_path.write_text(reference, encoding="utf-8")
        shutil.copyfile(_RUNNER, runner_path)
        config = {
            "candidate_path": str(candidate_path),
            "tests_path": str(tests_path),
            "log_path": str(log_path),
            "nonce": nonce,
            "memory_bytes": int(memory_mb) * 1024 * 1024 if memory_mb else None,
            "cpu_seconds": max(1, int(timeout) + 1),
            "file_bytes": int(file_size_mb) * 1024 * 1024 if file_size_mb else None,
            "block_network": block_network,
            "block_processes": block_processes,
            "entry_point": entry_point,
        }
        config_path = workdir / "config.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        verdict_path = workdir / "verdict.out"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        started = time.monotonic()
        with open(verdict_path, "wb") as verdict_out:
            proc = subprocess.Popen(
                [python or sys.executable, "-I", str(runner_path), str(config_path)],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=verdict_out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                return Grade(0.0, f"timed out after {timeout:g}s wall time; process group killed")
            finally:
                _kill_group(proc.pid)
        elapsed = time.monotonic() - started
        verdict = None
        for line in verdict_path.read_text("utf-8", "replace").splitlines():
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and parsed.get("nonce") == nonce:
                verdict = parsed
        if verdict is None:
            if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
                why = "CPU time limit exceeded" if returncode == -signal.SIGXCPU else "killed"
            elif returncode == 0:
                why = "candidate exited before the tests finished"
            else:
                why = f"exit code {returncode}"
            tail = _tail(log_path) or _tail(verdict_path)
            return Grade(0.0, f"no verdict from the test run ({why}); output tail: {tail[-200:]!r}")
        detail = f"{verdict['detail']} [{origin}, {elapsed:.2f}s]"
        if "MemoryError" in verdict["detail"]:
            detail += f" (memory limit {memory_mb} MiB)"
        return Grade(1.0 if verdict["ok"] else 0.0, detail)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
