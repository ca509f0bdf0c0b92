"""Child-side harness for the code grader; run as ``python -I _runner.py CONFIG.json``.

Kept free of imports from this package: the child runs it by path from a temporary directory,
without the package on ``sys.path``.

Order matters: limits and the audit hook go in place before any candidate code runs, and the
result line is written to a duplicate of the original stdout, so prints from the candidate or
its tests cannot be confused with the verdict. The verdict carries a nonce read from the config,
so a candidate that simply exits with status 0 does not count as passing.
"""

import builtins
import json
import os
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


def _set_limits(cfg):
    limits = [
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
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
                except BaseException as exc:  # noqa: BLE001
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
            except BaseException as exc:  # noqa: BLE001
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


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        cfg = json.load(fh)
    verdict = os.fdopen(os.dup(1), "w", encoding="utf-8")
    log = os.open(cfg["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    with open(cfg["candidate_path"], encoding="utf-8") as fh:
        candidate_src = fh.read()
    with open(cfg["tests_path"], encoding="utf-8") as fh:
        tests_src = fh.read()
    nonce = cfg["nonce"]
    os.remove(sys.argv[1])

    def report(ok, passed, detail):
        verdict.write(json.dumps({"nonce": nonce, "ok": ok, "passed": passed, "detail": detail}) + "\n")
        verdict.flush()

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
    except BaseException as exc:  # noqa: BLE001
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
    except BaseException as exc:  # noqa: BLE001
        report(False, 0, f"tests failed: {_short_error(exc)}")
        return
    try:
        passed, failures = _run_checks(namespace, cfg)
    except BaseException as exc:  # noqa: BLE001
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
