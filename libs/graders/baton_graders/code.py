"""Code grader: run the candidate against reference tests the way code-benchmark judges do.

Both the candidate (model output) and the tests are treated as untrusted. Each run is a separate
process tree (Linux, root needed to build it):

- ``setpriv --pdeathsig KILL`` then ``unshare --net --pid --mount --ipc --uts --fork --kill-child
  --mount-proc``: a network namespace with no interface up (no network at all), its own PID
  namespace (it sees only its own processes: ``/proc/1`` is its own runner, the grader's and every
  service's environment are out of sight), its own mounts, killed if the grader dies;
- the runner (``_runner.py``, ``python -I -S``, an empty environment) makes every mount read-only
  except a fresh temporary working directory, hides a private home directory that holds the
  interpreter (only the interpreter stays visible); it stays the namespace's root-owned PID 1 that
  only reaps, and forks the test process, which drops to uid/gid 65534 (``nobody``) with no groups,
  no capabilities and no-new-privileges, under a seccomp filter refusing new namespaces, mounts,
  keyrings, BPF, perf events and userfaultfd; ``/tmp``, ``/var/tmp``, ``/run`` and ``/dev/shm`` are
  empty (no other service's Unix socket in reach);
- limits: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (largest file), ``RLIMIT_NPROC``
  (processes of the sandbox uid: a fork bomb stops there), ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0;
- an audit hook (PEP 578) refuses ``socket.*`` events and process creation, for clearer errors
  (the kernel-level limits above hold even when ``ctypes`` gets past it);
- a wall-clock limit kills the whole process group, and with it the PID namespace.

When this cannot be set up (not root, no ``unshare``/``setpriv``, a mount that cannot be made
read-only), grading raises :class:`SandboxUnavailable`: code never runs outside the sandbox.

Not defended: the candidate runs in the same process as the tests, so determined code could
forge a passing verdict (a wrong reward, not an escape); files others may read stay readable.
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

from ._types import Grade, GradingError

_RUNNER = Path(__file__).with_name("_runner.py")
# The runner's exit status when it could not build the sandbox (kept in step with _runner.py).
_SETUP_FAILED = 97
SANDBOX_UID = 65534  # nobody


class SandboxUnavailable(GradingError):
    """The code sandbox cannot be built here; code is not run at all."""


def _sandbox_tools() -> tuple[str, str]:
    if not hasattr(os, "geteuid") or not sys.platform.startswith("linux"):
        raise SandboxUnavailable("the code sandbox needs Linux namespaces")
    if os.geteuid() != 0:
        raise SandboxUnavailable("the code sandbox needs root (to create namespaces and drop to the sandbox uid); "
                                 "code grading is refused")
    unshare, setpriv = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin"), shutil.which(
        "setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not unshare or not setpriv:
        raise SandboxUnavailable("the code sandbox needs util-linux `unshare` and `setpriv`; code grading is refused")
    return unshare, setpriv
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
    max_processes: int = 32,
    block_network: bool = True,
    block_processes: bool = True,
    entry_point: str | None = None,
    extract: bool = True,
    uid: int = SANDBOX_UID,
) -> Grade:
    """Score 1 when the candidate's code passes ``reference`` (test code), else 0.

    ``reference`` may hold top-level asserts, ``test_*`` functions, ``unittest.TestCase``
    classes, or a HumanEval-style ``check(candidate)`` (pass ``entry_point``). The tests run in
    the candidate's namespace, and ``from solution import f`` works as well. Raises
    :class:`SandboxUnavailable` when the sandbox cannot be built.
    """
    code, origin = extract_code(answer) if extract else (answer, "whole answer")
    if not code.strip():
        return Grade(0.0, "no code found in the answer")
    unshare, setpriv = _sandbox_tools()
    if uid == 0:
        raise SandboxUnavailable("the sandbox uid must not be root")
    python = os.path.realpath(sys.executable)
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
            "workdir": str(workdir.resolve()),
            "uid": uid,
            "gid": uid,
            "candidate_path": str(candidate_path),
            "tests_path": str(tests_path),
            "log_path": str(log_path),
            "nonce": nonce,
            "memory_bytes": int(memory_mb) * 1024 * 1024 if memory_mb else None,
            "cpu_seconds": max(1, int(timeout) + 1),
            "file_bytes": int(file_size_mb) * 1024 * 1024 if file_size_mb else None,
            "max_processes": max(1, int(max_processes)),
            "max_open_files": 256,
            "block_network": block_network,
            "block_processes": block_processes,
            "entry_point": entry_point,
        }
        config_path = workdir / "config.json"
        # Written before the directory is handed over: the runner reads it as root, then deletes it.
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        verdict_path = workdir / "verdict.out"
        command = [
            setpriv, "--pdeathsig", "KILL", "--",  # the sandbox dies with the grader, whatever kills it
            unshare, "--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc",
            "--", python, "-I", "-S", "-X", "utf8", str(runner_path), str(config_path),
        ]
        started = time.monotonic()
        fd = os.open(verdict_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as verdict_out:
            proc = subprocess.Popen(
                command,
                cwd=workdir,
                env={},
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
                if parsed.get("setup_failed"):
                    break  # nothing after a failed set-up is the runner's
        if returncode == _SETUP_FAILED or (verdict is not None and verdict.get("setup_failed")):
            why = verdict["detail"] if verdict else _tail(verdict_path)[-300:]
            raise SandboxUnavailable(f"the code sandbox could not be set up ({why}); code grading is refused")
        if verdict is None:
            # The namespace's PID 1 reports the test process's death by signal N as 128 + N.
            if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL):
                why = "CPU time limit exceeded" if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) else "killed"
            elif returncode == 0:
                why = "candidate exited before the tests finished"
            else:
                why = f"exit code {returncode}"
            tail = _tail(log_path) or _tail(verdict_path)
            return Grade(0.0, f"no verdict from the test run ({why}); output tail: {tail[-200:]!r}")
        if verdict.get("uid") != uid:
            raise SandboxUnavailable("the test run did not drop to the sandbox uid; code grading is refused")
        detail = f"{verdict['detail']} [{origin}, {elapsed:.2f}s]"
        if "MemoryError" in verdict["detail"]:
            detail += f" (memory limit {memory_mb} MiB)"
        return Grade(1.0 if verdict["ok"] else 0.0, detail)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
