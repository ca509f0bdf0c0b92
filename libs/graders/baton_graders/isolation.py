"""Grading in a child process with a wall-clock limit.

The answer (model output) and even an operator's reference can make a grader slow: a regular
expression that backtracks, a number that parses into a huge integer, a parser that recurses. Run
in the caller's process such work holds the interpreter lock, and a service's event loop (Kafka
heartbeats included) stops with it. Here every grade runs in a child process; past the limit the
child is killed and replaced, and the caller gets a :class:`GradingError`, never a hang.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ._types import Grade, GradingError

_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}


class IsolatedGrader:
    """``grade(grader, answer, reference, **opts)`` in a child process, one grade at a time."""

    def __init__(self, timeout_s: float = 30.0, memory_mb: int = 4096) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._proc: subprocess.Popen | None = None
        self._scratch: str | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        # Its temporary files (code graders' working directories) go in a folder of its own, removed
        # when it is killed: a process killed mid-grade never cleans up after itself. Others may
        # pass through it (the code sandbox's uid must reach its own directory inside) but not list it.
        self._scratch = tempfile.mkdtemp(prefix="baton-grader-")
        os.chmod(self._scratch, 0o711)
        # A fresh interpreter, not a fork: the caller has threads (and an event loop) a fork would copy.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "baton_graders._worker", str(self.memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**_ENV, "TMPDIR": self._scratch},
            start_new_session=True, close_fds=True,
        )
        self._buffer = b""
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        scratch, self._scratch = self._scratch, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
        if scratch is not None:
            # The sandbox's processes die with the worker (their parent-death signal); what they
            # left goes now.
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> bytes | None:
        assert proc.stdout is not None  # started with stdout=PIPE
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def grade(self, grader: str, answer: str, reference: str, **opts) -> Grade:
        request = json.dumps({"grader": grader, "answer": answer, "reference": reference, "opts": opts}).encode() + b"\n"
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            deadline = time.monotonic() + self.timeout_s
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                line = self._read_line(proc, deadline)
            except (BrokenPipeError, EOFError, OSError):
                code = proc.poll()
                self._kill()
                self.restarts += 1
                raise GradingError(f"the grading process died (exit status {code}); it was restarted") from None
            if line is None:
                self._kill()
                self.restarts += 1
                raise GradingError(f"grading took longer than {self.timeout_s:g}s; the grading process was killed")
        reply = json.loads(line)
        if "score" in reply:
            return Grade(reply["score"], reply["detail"])
        if reply.get("kind") == "value":
            raise ValueError(reply["message"])
        raise GradingError(reply["message"])
