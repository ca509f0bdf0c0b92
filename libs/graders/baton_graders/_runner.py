"""Child-side harness for the code grader; run as root inside fresh namespaces by ``code.py``.

Kept free of imports from this package: the child runs it by path from its working directory,
without the package on ``sys.path``.

Order matters. While still root (inside the new mount, PID and network namespaces that
``unshare`` made) it reads its inputs, makes every mount read-only except the working directory,
shows the Python installation and nothing else of a home directory that others may not enter,
then drops to the sandbox uid for good (no groups, no capabilities, no-new-privileges). Only then
do limits and the audit hook go in place, and only then does candidate code run. The result line
goes to a duplicate of the original stdout, so prints from the candidate or its tests cannot be
confused with the verdict; it carries a nonce read from the config, so a candidate that simply
exits with status 0 does not count as passing.
"""

import builtins
import ctypes
import errno
import json
import os
import re
import resource
import sys
import traceback
import types
import unittest

_PROCESS_EVENTS = {
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
}


# Exit status when the sandbox could not be set up: the parent then refuses to grade (fails closed).
SETUP_FAILED = 97

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
# Flags a remount must repeat, or the kernel refuses it (they may be locked) or drops them.
_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
         "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME}
_PR_SET_NO_NEW_PRIVS = 38


class SetupError(Exception):
    def __init__(self, message, code=None):
        super().__init__(message)
        self.errno = code


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source, target, fstype, flags, data=None):
    def enc(v):
        return v.encode() if isinstance(v, str) else v

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"mount {target} (flags {flags:#x}): {os.strerror(err)}", err)


def _mounts():
    """(mount point, per-mount options) of every mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, set(fields[5].split(","))))
    return out


def _expose_python(libc):
    """Let the sandbox uid read the interpreter's standard library even under a private home.

    When the installation sits below a directory others may not enter (``/root``), that directory
    is covered with an empty tmpfs holding only the installation, bound back in: the rest of it
    (credentials, caches) stays invisible.
    """
    prefix = os.path.realpath(sys.base_prefix)
    chain = [prefix]
    while chain[-1] != "/":
        chain.append(os.path.dirname(chain[-1]))
    blocked = next((d for d in reversed(chain) if not os.stat(d).st_mode & 0o001), None)
    if blocked is None:
        return
    if blocked == prefix:
        raise SetupError(f"the Python installation {prefix} is closed to other users")
    fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _mount(libc, "tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", prefix, None, _MS_BIND | _MS_REC)
    finally:
        os.close(fd)


# Shared scratch and runtime directories: beside world-writable files they hold Unix sockets of other
# services (a socket on a read-only mount still accepts connections). The sandbox gets empty ones.
_HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm")


def _inside(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _hide_shared_dirs(libc, workdir):
    prefix = os.path.realpath(sys.base_prefix)
    for folder in _HIDDEN:
        if os.path.islink(folder) or not os.path.isdir(folder) or _inside(prefix, folder):
            continue
        keep = workdir if _inside(workdir, folder) else None
        fd = os.open(keep, os.O_RDONLY | os.O_DIRECTORY) if keep else None
        try:
            _mount(libc, "tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=64k")
            if keep:
                # Folders on the way stay passable for the sandbox uid, whatever the umask.
                parent = folder
                for part in os.path.relpath(keep, folder).split(os.sep):
                    parent = os.path.join(parent, part)
                    os.makedirs(parent, exist_ok=True)
                    os.chmod(parent, 0o755)
                _mount(libc, f"/proc/self/fd/{fd}", keep, None, _MS_BIND)
        finally:
            if fd is not None:
                os.close(fd)


def _enter_jail(cfg):
    """Read-only file system except the working directory (for every process of the namespace)."""
    if os.getuid() != 0:
        raise SetupError("the runner must start as root inside its namespaces")
    libc = _libc()
    workdir = cfg["workdir"]
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
    _hide_shared_dirs(libc, workdir)
    _expose_python(libc)
    _mount(libc, workdir, workdir, None, _MS_BIND)
    for point, opts in reversed(_mounts()):
        if point == workdir:
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
        for name, bit in _KEEP.items():
            if name in opts:
                flags |= bit
        try:
            _mount(libc, None, point, None, flags)
        except SetupError as exc:
            if exc.errno == errno.ENOENT:
                # Its path no longer resolves from this root: it lies under a folder covered above
                # (a container runtime's mounts below /run or /tmp) or was deleted. Nothing here can reach it.
                continue
            if "ro" not in opts:
                raise  # a mount the sandbox could still write to: refuse to grade
    _mount(libc, None, workdir, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)


# A seccomp filter for what a test process never needs and what widens the kernel surface it can
# reach: new namespaces (a user namespace would make it "root" there, free to mount a tmpfs and
# fill memory outside every rlimit), mounts, keyrings, BPF, perf events, userfaultfd.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED_SYSCALLS = {
    # unshare, setns, mount, umount2, pivot_root, keyctl, add_key, request_key, bpf, userfaultfd,
    # perf_event_open, open_tree, move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr
    "x86_64": [272, 308, 165, 166, 155, 250, 248, 249, 321, 323, 298, 428, 429, 430, 431, 432, 433, 442],
    "aarch64": [97, 268, 40, 39, 41, 219, 217, 218, 280, 282, 241, 428, 429, 430, 431, 432, 433, 442],
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435  # its flags sit in memory a filter cannot read: refused with ENOSYS, so libc uses clone
_NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME


def _install_seccomp(libc):
    machine = os.uname().machine
    if machine not in _AUDIT_ARCH:
        raise SetupError(f"no seccomp filter for this architecture ({machine})")
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        prog.append((jge, 0, 1, 0x40000000))  # the x32 ABI's numbers
        prog.append((ret, 0, 0, eperm))
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, enosys)]
    for nr in _DENIED_SYSCALLS[machine]:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 3, _CLONE[machine]), (ld, 0, 0, 16), (jset, 0, 1, _NAMESPACE_FLAGS), (ret, 0, 0, eperm)]
    prog.append((ret, 0, 0, allow))

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(prog))(*[Filter(*f) for f in prog])
    program = Program(len(prog), filters)
    # PR_SET_SECCOMP, SECCOMP_MODE_FILTER; needs no-new-privileges, set just before.
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        raise SetupError(f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")


def _drop_privileges(cfg):
    """The sandbox uid for good: no groups, no capabilities, no way back through setuid programs."""
    libc = _libc()
    workdir = cfg["workdir"]
    uid, gid = cfg["uid"], cfg["gid"]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # real, effective and saved: root cannot be taken back, capabilities are gone
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    _install_seccomp(libc)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid or os.getgroups():
        raise SetupError("could not drop to the sandbox uid")
    os.chdir(workdir)


def _set_limits(cfg):
    limits = [
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_NPROC, cfg.get("max_processes")),
        (resource.RLIMIT_NOFILE, cfg.get("max_open_files")),
        (resource.RLIMIT_CORE, 0),
    ]
    for res, value in limits:
        if value is None:
            continue
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            # A hard limit already lower than ours stays in force, which is stricter.
            pass


def _install_audit_hook(block_network, block_processes):
    def hook(event, args):
        if block_network and event.startswith("socket."):
            raise PermissionError(f"network access is disabled in the grading sandbox ({event})")
        if block_processes and event in _PROCESS_EVENTS:
            raise PermissionError(f"starting processes is disabled in the grading sandbox ({event})")

    sys.addaudithook(hook)


def _short_error(exc):
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text.splitlines()[-1][:300] if text else type(exc).__name__


def _run_checks(namespace, cfg):
    """Run HumanEval-style check(), test_* functions and unittest cases found in namespace."""
    passed, failures = 0, []
    entry_point = cfg.get("entry_point")
    check = namespace.get("check")
    if callable(check) and not isinstance(check, type):
        if entry_point:
            target = namespace.get(entry_point)
            if target is None:
                failures.append(f"entry point {entry_point!r} is not defined by the candidate")
            else:
                try:
                    check(target)
                    passed += 1
                except BaseException as exc:  # noqa: BLE001 - any failure of user code counts
                    failures.append(f"check({entry_point}): {_short_error(exc)}")
        else:
            names = [k for k, v in cfg["candidate_names"].items() if v == "function" and k in namespace]
            if len(names) == 1:
                try:
                    check(namespace[names[0]])
                    passed += 1
                except BaseException as exc:  # noqa: BLE001 - the candidate's code may raise anything, SystemExit included
                    failures.append(f"check({names[0]}): {_short_error(exc)}")
            else:
                failures.append("tests define check() but no entry_point was given and it is ambiguous")
    for name, value in list(namespace.items()):
        if name.startswith("test") and callable(value) and isinstance(value, types.FunctionType):
            if value.__code__.co_argcount:
                continue
            try:
                value()
                passed += 1
            except BaseException as exc:  # noqa: BLE001 - the candidate's code may raise anything, SystemExit included
                failures.append(f"{name}: {_short_error(exc)}")
    cases = [
        v
        for v in namespace.values()
        if isinstance(v, type) and issubclass(v, unittest.TestCase) and v is not unittest.TestCase
    ]
    if cases:
        loader = unittest.TestLoader()
        suite = unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in cases)
        result = unittest.TestResult()
        suite.run(result)
        passed += result.testsRun - len(result.failures) - len(result.errors)
        for test, tb in result.failures + result.errors:
            failures.append(f"{test.id().split('.')[-1]}: {tb.strip().splitlines()[-1][:300]}")
    return passed, failures


def _reap(child):
    """Wait for ``child`` as init does (reaping every orphan); its exit status, 128+N for signal N."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        cfg = json.load(fh)
    verdict = os.fdopen(os.dup(1), "w", encoding="utf-8")
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    with open(cfg["candidate_path"], encoding="utf-8") as fh:
        candidate_src = fh.read()
    with open(cfg["tests_path"], encoding="utf-8") as fh:
        tests_src = fh.read()
    nonce = cfg["nonce"]
    os.remove(sys.argv[1])

    def report(ok, passed, detail, **extra):
        verdict.write(json.dumps({"nonce": nonce, "ok": ok, "passed": passed, "detail": detail,
                                  "uid": os.getuid(), **extra}) + "\n")
        verdict.flush()

    try:
        _enter_jail(cfg)
    except (SetupError, OSError) as exc:
        report(False, 0, f"sandbox setup failed: {exc}", setup_failed=True)
        sys.exit(SETUP_FAILED)
    # This process stays root and stays the namespace's PID 1, running nothing but wait(): unshare
    # --kill-child kills it when the grader goes, and with it every process of the namespace. (The
    # candidate could neither clear that parent-death signal nor signal a root process; in the
    # process that drops to the sandbox uid, the kernel clears it anyway.)
    child = os.fork()
    if child:
        verdict.close()
        sys.exit(_reap(child))
    try:
        _drop_privileges(cfg)
    except (SetupError, OSError) as exc:
        report(False, 0, f"sandbox setup failed: {exc}", setup_failed=True)
        os._exit(SETUP_FAILED)
    # Opened only now: a file open for writing on a mount keeps it from being made read-only.
    log = os.open(cfg["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    _set_limits(cfg)
    _install_audit_hook(cfg["block_network"], cfg["block_processes"])

    try:
        candidate_code = compile(candidate_src, "solution.py", "exec")
    except SyntaxError as exc:
        report(False, 0, f"candidate does not compile: {_short_error(exc)}")
        return
    try:
        tests_code = compile(tests_src, "tests.py", "exec")
    except SyntaxError as exc:
        report(False, 0, f"reference tests do not compile: {_short_error(exc)}")
        return

    module = types.ModuleType("solution")
    module.__dict__["__builtins__"] = builtins
    sys.modules["solution"] = module
    try:
        exec(candidate_code, module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - the candidate's code may raise anything, SystemExit included
        report(False, 0, f"candidate raised while loading: {_short_error(exc)}")
        return
    cfg["candidate_names"] = {
        k: ("function" if isinstance(v, types.FunctionType) else "other")
        for k, v in module.__dict__.items()
        if not k.startswith("__")
    }
    namespace = dict(module.__dict__)
    namespace["__name__"] = "tests"
    try:
        exec(tests_code, namespace)
    except BaseException as exc:  # noqa: BLE001 - the candidate's code may raise anything, SystemExit included
        report(False, 0, f"tests failed: {_short_error(exc)}")
        return
    try:
        passed, failures = _run_checks(namespace, cfg)
    except BaseException as exc:  # noqa: BLE001 - the candidate's code may raise anything, SystemExit included
        report(False, 0, f"test harness error: {_short_error(exc)}")
        return
    if failures:
        report(False, passed, f"{len(failures)} failed, {passed} passed; first: {failures[0]}")
    elif passed:
        report(True, passed, f"{passed} test(s) passed")
    else:
        report(True, 0, "test code ran without assertion errors")


if __name__ == "__main__":
    main()
