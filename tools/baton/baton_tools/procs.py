"""Process control for everything the tools start: services, the broker, stand-ins, LiteLLM.

Every child leads its own process group (a new session): a terminal's Ctrl-C does not reach it, a
detached one outlives the shell that started it, and stopping the group stops what it started too
(vLLM's engine and worker processes). Stopping is SIGTERM to the group, a wait, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class Child:
    """A process started in its own session, its output appended to `log`."""

    def __init__(self, name: str, cmd: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None,
                 stdout_pipe: bool = False) -> None:
        self.name, self.log = name, Path(log)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE if stdout_pipe else out,
                                         stderr=subprocess.STDOUT if not stdout_pipe else out,
                                         start_new_session=True, close_fds=True, text=stdout_pipe or None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the group: no drain, no commit, as a crash."""
        signal_group(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        stop_groups([self.pid], timeout)
        self.proc.poll()
        if self.proc.stdout:
            self.proc.stdout.close()


def stop_groups(pids: list[int], timeout: float = 20) -> None:
    """SIGTERM each process group, then SIGKILL what is still there after `timeout`.

    A group outlives its leader while any child is left, so the group is what is waited on."""
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        if not any(group_alive(p) for p in pids):
            break
        time.sleep(0.05)
    for pid in pids:
        if group_alive(pid):
            signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(group_alive(p) for p in pids) and time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        time.sleep(0.05)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int | None) -> bool:
    """Whether `pid` runs: reaped if it is our exited child, and a zombie counts as gone."""
    if not pid:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child (a detached stack): fall back to signal 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _state(pid) != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left, zombies aside (a dead child nobody reaps yet)."""
    if alive(pgid):
        return True
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(_state(p) not in ("Z", "") for p in _group_members(pgid))


def cmdline(pid: int) -> bytes | None:
    """The process's command line, or None when it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return members


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# --- ports and readiness ------------------------------------------------------------------------


def _ephemeral_start() -> int:
    """The first port the kernel hands out to outgoing connections and to bind(0) (Linux's default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PICKED: set[int] = set()


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that are free now and that this process never handed out before.

    They are drawn at random below the kernel's ephemeral range: a port bind(0) chose could be chosen
    again by the next call, or taken as the local port of some outgoing connection, before the server
    it was picked for binds it (a stack whose two services got one port ran with one of them exited)."""
    import random

    low, high = 10000, _ephemeral_start()
    if high - low < 1000:
        low, high = 1024, 65536
    ports: list[int] = []
    for _ in range(50 * count + 1000):
        if len(ports) == count:
            return ports
        port = random.randrange(low, high)
        if port in _PICKED or port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        _PICKED.add(port)
    if len(ports) < count:
        raise RuntimeError(f"no {count} free loopback ports found in {low}-{high - 1}")
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_http_ok(url: str, pid: int, name: str, log: Path | str, timeout: float) -> None:
    """Until `url` answers 200; fails early, with the log's tail, when the process exits."""
    deadline = time.monotonic() + timeout
    while not http_ok(url):
        if not alive(pid):
            raise RuntimeError(f"{name} exited during start; its log ({log}) ends:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready at {url} after {timeout:g} s; its log ({log}) ends:\n{tail(log, 10)}")
        time.sleep(0.3)


def tail(path: Path | str, lines: int = 40, offset: int = 0) -> str:
    """The last `lines` lines of a log, read from byte `offset`."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
