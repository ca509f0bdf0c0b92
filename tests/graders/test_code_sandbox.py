"""The code grader's sandbox against code that tries to get out of it.

Each reference below passes (score 1) only when the escape it tries fails, so a pass is evidence
that the kernel-level layer held; every escape goes through `ctypes` where that gets past the
audit hook. The grader runs as root here (namespaces need it); where it cannot, code grading must
refuse to run (tested at the end).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import textwrap
import threading
import time

import pytest
from testbed import sandbox_available

from baton_graders import grade
from baton_graders.code import SANDBOX_UID, SandboxUnavailable

# A developer's machine without root may skip these; CI (root, util-linux) never does, so a sandbox
# that stops building there fails the run instead of hiding behind a skip.
jailed = pytest.mark.skipif(not sandbox_available() and not os.environ.get("CI"),
                            reason="the code sandbox needs root and util-linux here")

SECRET = "baton-test-secret-7d1e0c"
LIBC = "import ctypes, ctypes.util, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def passes(tests: str, **opts) -> None:
    result = grade("code", "x = 1\n", textwrap.dedent(tests), **opts)
    assert result.score == 1.0, result.detail


def sandbox_processes() -> set[int]:
    out = subprocess.run(["ps", "-u", str(SANDBOX_UID), "-o", "pid="], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def no_new_sandbox_processes(before: set[int], within: float = 5.0) -> bool:
    """The kernel tears a PID namespace down just after its first process dies: give it a moment."""
    deadline = time.monotonic() + within
    while sandbox_processes() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    return not sandbox_processes() - before


@jailed
def test_the_candidate_runs_as_nobody_with_an_empty_environment(monkeypatch):
    monkeypatch.setenv("BATON_TEST_SECRET", SECRET)
    passes(f"""
        import os
        assert os.getuid() == os.geteuid() == {SANDBOX_UID} and os.getgroups() == []
        assert "{SECRET}" not in repr(dict(os.environ)), os.environ
        # Its parent is the namespace's PID 1 (the runner's root reaper); the grader is out of sight.
        assert os.getpid() == 2 and os.getppid() == 1
    """)


@jailed
def test_no_process_environment_outside_the_sandbox_can_be_read(monkeypatch):
    monkeypatch.setenv("BATON_TEST_SECRET", SECRET)
    grader_pid = os.getpid()
    passes(f"""
        import os
        seen = []
        for path in ["/proc/1/environ", "/proc/%d/environ" % os.getppid(), "/proc/{grader_pid}/environ"] + [
                "/proc/%s/environ" % p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open(path, "rb") as fh:
                    seen.append(fh.read())
            except OSError:
                pass
        assert not any(b"{SECRET}" in data for data in seen)
        # Only the sandbox's own processes exist for it.
        assert sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == [1, 2], os.listdir("/proc")
    """)


@jailed
def test_no_socket_reaches_anything_even_past_the_audit_hook():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                continue

    t = threading.Thread(target=accept)
    t.start()
    try:
        passes(LIBC + f"""
import socket, struct
fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM, straight from libc: no audit event
assert fd >= 0
addr = struct.pack("=H", 2) + struct.pack("!H4s8x", {port}, bytes([127, 0, 0, 1]))  # sockaddr_in
rc = libc.connect(fd, addr, len(addr))
err = ctypes.get_errno()
assert rc == -1 and err in (101, 111, 113), (rc, err)  # unreachable: no network in the namespace
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
except PermissionError:
    pass
else:
    raise AssertionError("a Python socket connected")
""")
    finally:
        done.set()
        t.join()
        listener.close()
    assert accepted == [], "nothing connected to the host"


@jailed
def test_no_unix_socket_of_the_host_is_reachable():
    import tempfile

    folder = tempfile.mkdtemp(prefix="baton-socket-", dir="/tmp")
    os.chmod(folder, 0o777)
    path = os.path.join(folder, "service.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)  # anyone may connect: only the sandbox's own /tmp stands in the way
    server.listen(1)
    server.settimeout(0.1)
    try:
        passes(LIBC + f"""
import struct
fd = libc.socket(1, 1, 0)  # AF_UNIX, SOCK_STREAM through libc
addr = struct.pack("=H", 1) + {path.encode()!r}.ljust(108, b"\\0")
assert fd >= 0 and libc.connect(fd, addr, len(addr)) == -1, "connected to a host socket"
assert not os.path.exists({folder!r}), "the host's /tmp is out of sight"
""")
        with pytest.raises(OSError):
            server.accept()
    finally:
        server.close()
        os.unlink(path)
        os.rmdir(folder)


@jailed
def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing_behind():
    before = sandbox_processes()
    passes(LIBC + """
import time
forks = 0
for _ in range(1000):
    pid = libc.fork()  # past the audit hook
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    if pid < 0:
        break
    forks += 1
assert forks < 32, forks
""", max_processes=16)
    started = time.monotonic()
    result = grade("code", "x = 1\n", LIBC + "while True:\n    libc.fork()\n", timeout=3)
    assert result.score == 0.0 and time.monotonic() - started < 15, result.detail
    assert no_new_sandbox_processes(before), "every process of the sandbox is gone"


@jailed
def test_nothing_outside_the_working_directory_can_be_written(tmp_path):
    os.chmod(tmp_path, 0o777)  # writable for anyone: only the sandbox's read-only mounts stand in the way
    target = tmp_path / "escaped"
    passes(LIBC + f"""
import errno
for path in ["{target}", "/tmp/baton-escape", "/dev/shm/baton-escape", "/var/tmp/baton-escape"]:
    try:
        open(path, "w").write("x")
    except OSError as e:
        assert e.errno in (errno.EROFS, errno.EACCES, errno.ENOENT), (path, e)
    else:
        raise AssertionError("wrote " + path)
    fd = libc.open(path.encode(), 0o101, 0o666)  # O_WRONLY | O_CREAT through libc
    assert fd == -1, path
libc.system(b"echo x > {target}; echo x > /tmp/baton-escape")  # a shell, past the audit hook
open("inside.txt", "w").write("the working directory is writable")
""")
    assert not target.exists()
    assert not os.path.exists("/tmp/baton-escape")


@jailed
def test_host_mounts_below_a_covered_folder_neither_stop_grading_nor_show():
    # A container runtime on the grader's host keeps its mounts below /run or /tmp: the sandbox
    # covers those folders, so it cannot remount what lies under them, and needs not.
    folder = tempfile.mkdtemp(prefix="baton-host-mount-", dir="/tmp")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], check=True)
    try:
        with open(os.path.join(folder, "secret"), "w") as fh:
            fh.write(SECRET)
        passes(f"import os\nassert not os.path.exists({folder!r})\n")
    finally:
        subprocess.run(["umount", folder], check=True)
        os.rmdir(folder)


@jailed
def test_ctypes_cannot_get_root_back_or_remount(tmp_path):
    os.chmod(tmp_path, 0o777)
    target = tmp_path / "escaped"
    passes(LIBC + f"""
assert libc.setuid(0) == -1 and libc.setgid(0) == -1
assert libc.mount(None, b"/", None, 32, None) == -1  # MS_REMOUNT read-write
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
# No user namespace (where it would be "root", free to mount a tmpfs and fill memory), no new
# namespace of any kind, neither through unshare nor through a raw clone.
assert libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == -1 and ctypes.get_errno() == 1
import platform
clone = {{"x86_64": 56, "aarch64": 220}}[platform.machine()]
assert libc.syscall(clone, CLONE_NEWUSER | 17, 0, 0, 0, 0) == -1  # 17: SIGCHLD
# Threads still start (glibc falls back from clone3 to clone).
import threading
ran = []
t = threading.Thread(target=lambda: ran.append(1))
t.start(); t.join()
assert ran == [1]
try:
    open("{target}", "w").write("x")
except OSError:
    pass
else:
    raise AssertionError("wrote outside after unshare")
""")
    assert not target.exists()


@jailed
def test_memory_and_file_size_limits_hold():
    assert grade("code", "x = bytearray(3 * 1024 ** 3)\n", "assert True", memory_mb=512).score == 0.0
    big = grade("code", "open('big', 'wb').write(b'x' * 4 * 1024 * 1024)\n", "assert True", file_size_mb=1)
    assert big.score == 0.0


@jailed
def test_a_sleeping_candidate_is_killed_at_the_wall_clock_limit():
    before = sandbox_processes()
    started = time.monotonic()
    result = grade("code", "import time\ntime.sleep(60)\n", "assert True", timeout=1.0)
    assert result.score == 0.0 and "timed out" in result.detail and time.monotonic() - started < 10
    assert no_new_sandbox_processes(before)


@jailed
def test_killing_the_grader_kills_the_sandbox_even_when_the_candidate_clears_its_death_signal():
    import glob
    import tempfile

    from baton_graders import GradingError, IsolatedGrader

    before = sandbox_processes()
    grader = IsolatedGrader(timeout_s=2)
    scratch_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "baton-grade*")))
    try:
        with pytest.raises(GradingError, match="longer than 2s"):
            grader.grade("code", "x = 1\n", LIBC + """
import time
libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0: this process alone would outlive its parent
libc.fork()
time.sleep(120)
""", timeout=60)
    finally:
        grader.close()
    assert no_new_sandbox_processes(before), "the namespace died with the grading process"
    left = set(glob.glob(os.path.join(tempfile.gettempdir(), "baton-grade*"))) - scratch_before
    assert not left, "the killed grader's working directories are gone"


def test_without_root_code_grading_refuses_to_run(monkeypatch):
    def no_process(*a, **k):
        raise AssertionError("code ran outside the sandbox")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable, match="needs root"):
        grade("code", "x = 1\n", "assert True")


def test_without_unshare_code_grading_refuses_to_run(monkeypatch):
    import shutil

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(SandboxUnavailable, match="unshare"):
        grade("code", "x = 1\n", "assert True")


@jailed
def test_a_sandbox_that_cannot_be_built_refuses_to_grade(monkeypatch):
    # The runner refuses a root sandbox uid; the grader refuses before even starting it.
    with pytest.raises(SandboxUnavailable):
        grade("code", "x = 1\n", "assert True", uid=0)
