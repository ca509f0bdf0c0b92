"""CPU profiles of running services: py-spy samples each process's stacks, then this module draws a
flame graph (SVG) and ranks functions by self and total time.

py-spy reads another process's memory, which needs root or ptrace rights over it (on Linux,
`kernel.yama.ptrace_scope` 0, or CAP_SYS_PTRACE). It samples without pausing the target
(`--nonblocking`), and only threads holding the GIL (`--gil`): a thread's state in /proc says
"running" while it waits for a core on a busy machine, so without `--gil` a loopback socket write
that wakes its peer (and is then preempted) looked like a third of a service's time. With it, a
share is a share of the process's Python CPU time: time in a system call that releases the GIL (the
kernel side of socket I/O, which /proc reports apart) is not in it. `busy` drops the few samples that
are still waits; `busy_s` (busy samples ÷ rate) can be held against the CPU /proc measured.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

Stacks = Counter[tuple[str, ...]]

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")


def py_spy() -> str | None:
    """The py-spy next to this interpreter (the dev environment installs it), else one on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


class Recorder:
    """One `py-spy record` per process, all for the same number of seconds."""

    def __init__(self, out_dir: Path, pids: dict[str, int], seconds: float, rate: int) -> None:
        self.out_dir = out_dir
        self.files = {name: out_dir / f"profile-{name}.txt" for name in pids}
        self.children: dict[str, subprocess.Popen] = {}
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy not found: `make install` installs it into .venv")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--output", str(self.files[name]),
                   "--duration", str(max(1, round(seconds))), "--rate", str(rate), "--nonblocking", "--idle", "--gil",
                   "--nolineno", "--full-filenames"]
            self.children[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait(self, timeout: float = 60) -> dict[str, str]:
        """Waits for every recorder; returns an error line per process that could not be profiled."""
        errors = {}
        for name, child in self.children.items():
            try:
                _, err = child.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                _, err = child.communicate()
            if child.returncode != 0 or not self.files[name].exists():
                last = (err or "").strip().splitlines()
                errors[name] = last[-1] if last else f"py-spy exited {child.returncode}"
        return errors


# The last `baton*/` directory is the package's: a checkout is often itself named `baton`.
_SHORT = re.compile(r"^.*/site-packages/|^.*?/lib/python3\.\d+/|^.*/(?=baton(?:_\w+)?/)")


def _short(frame: str) -> str:
    """`func (/…/site-packages/aiokafka/conn.py)` → `func (aiokafka/conn.py)`; the workspace's own
    modules from their package directory (`baton_gateway/main.py`)."""
    m = _FRAME.match(frame)
    return f"{m.group('func')} ({_SHORT.sub('', m.group('file'))})" if m else frame


def read_collapsed(path: Path) -> Stacks:
    """py-spy's raw format: one `frame;frame;...;leaf count` line per distinct stack, root first."""
    stacks: Stacks = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(_short(f) for f in stack.split(";"))] += int(count)
    return stacks


# Innermost frames that mean the thread is blocked: the event loop waiting in epoll, a thread waiting
# on a condition, an executor thread waiting for work (its queue's get is C, so `_worker` is innermost),
# a blocking socket read (the span exporter's thread waiting for its answer).
_WAITS = (
    re.compile(r"^\w*\.?select \(selectors\.py\)$"),
    re.compile(r"^(Condition|Event|Semaphore)\.wait \(threading\.py\)$"),
    re.compile(r"^Thread\._wait_for_tstate_lock \(threading\.py\)$"),
    re.compile(r"^_worker \(concurrent/futures/thread\.py\)$"),
    re.compile(r"^SocketIO\.readinto \(socket\.py\)$"),
)


def busy(stacks: Stacks) -> tuple[Stacks, int]:
    """The samples of running code, and how many samples were waits."""
    running: Stacks = Counter()
    waiting = 0
    for frames, count in stacks.items():
        if frames and any(w.match(frames[-1]) for w in _WAITS):
            waiting += count
        else:
            running[frames] += count
    return running, waiting


def _package(frame: str) -> str:
    """The top-level module a frame's file belongs to: `aiokafka`, `opentelemetry`, `asyncio`..."""
    m = _FRAME.match(frame)
    path = m.group("file") if m else frame
    head = path.split("/")[0].removesuffix(".py")
    return head or "?"


def top_functions(stacks: Stacks, n: int = 10) -> list[dict]:
    """The n functions with the most self time (samples where the function was running), with
    their total time (samples where it was anywhere on the stack), as shares of all samples, and
    the caller they were most often running for."""
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    callers: dict[str, Counter[str]] = {}
    for frames, count in stacks.items():
        if frames:
            own[frames[-1]] += count
            if len(frames) > 1:
                callers.setdefault(frames[-1], Counter())[frames[-2]] += count
        for frame in set(frames):
            anywhere[frame] += count
    return [{"function": f, "self": round(c / total, 4), "total": round(anywhere[f] / total, 4),
             "via": callers[f].most_common(1)[0][0] if f in callers else ""}
            for f, c in own.most_common(n)]


_DISPATCH = ("BaseEventLoop._run_once (asyncio/base_events.py)", "Handle._run (asyncio/events.py)",
             "Thread.run (threading.py)", "_WorkItem.run (concurrent/futures/thread.py)")


def _work(frames: tuple[str, ...]) -> tuple[str, ...]:
    """The frames below the last dispatch (an event-loop callback, a thread's target): the frames
    above it (the loop, the server's start) are under every sample and say nothing."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i] in _DISPATCH:
            return frames[i + 1:]
    return frames


def top_total(stacks: Stacks, n: int = 10, *, prefix: str = "baton") -> list[dict]:
    """The n functions of modules named `prefix`... (Baton's own) with the most total time: which of
    its own steps the process's CPU went to, libraries below them included."""
    total = sum(stacks.values()) or 1
    anywhere: Counter[str] = Counter()
    for frames, count in stacks.items():
        for frame in set(_work(frames)):
            if _package(frame).startswith(prefix):
                anywhere[frame] += count
    return [{"function": f, "total": round(c / total, 4)} for f, c in anywhere.most_common(n)]


def _stdlib(package: str) -> bool:
    return package in sys.stdlib_module_names or package.startswith("<frozen")


def by_library(stacks: Stacks) -> list[dict]:
    """Self time per library, the standard library's frames counted to the library that called them:
    a queue's `Condition.notify` is the cost of whoever put into the queue, a `Mapping.get` that of
    whoever looked up. What is left to `asyncio` is the event loop's own work."""
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    for frames, count in stacks.items():
        work = _work(frames)
        packages = [_package(f) for f in work]
        # Nothing but the standard library below the dispatch: the loop (or a thread) running itself.
        owner = next((p for p in reversed(packages) if not _stdlib(p)), _package(frames[-1]) if frames else "?")
        own[owner] += count
    return [{"library": p, "self": round(c / total, 4)} for p, c in own.most_common()]


def summarise(path: Path, hz: int, title: str) -> dict:
    """One process's recording: its flame graph (written beside the recording) and its rankings."""
    stacks, waiting = busy(read_collapsed(path))
    flame = path.with_name(path.name.replace("profile-", "flame-", 1)).with_suffix(".svg")
    flame.write_text(flame_svg(stacks, title))
    return {"samples": sum(stacks.values()), "waiting_samples": waiting, "busy_s": round(sum(stacks.values()) / hz, 2),
            "flame_graph": flame.name, "collapsed": path.name, "top_self": top_functions(stacks),
            "top_total": top_total(stacks), "by_library": by_library(stacks)[:12]}


# --- flame graph --------------------------------------------------------------------------------

_WIDTH, _ROW = 1200, 16


def _colour(frame: str) -> str:
    h = sum(map(ord, _package(frame))) * 37 % 360
    return f"hsl({h},60%,70%)"


def flame_svg(stacks: Stacks, title: str) -> str:
    """An icicle-style flame graph (root at the top); hover a box for its function and share."""
    tree: dict = {}
    for frames, count in stacks.items():
        node = tree
        for frame in frames:
            child = node.setdefault(frame, [0, {}])
            child[0] += count
            node = child[1]
    total = sum(stacks.values()) or 1
    boxes: list[str] = []
    depth_max = 0

    def draw(node: dict, x: float, depth: int) -> None:
        nonlocal depth_max
        for frame, (count, children) in sorted(node.items()):
            w = count / total * _WIDTH
            if w >= 0.3:
                depth_max = max(depth_max, depth)
                y = 24 + depth * _ROW
                label = html.escape(frame)
                text = html.escape(frame[: int(w / 7)]) if w > 35 else ""
                boxes.append(f'<g><title>{label} — {count / total:.1%}</title>'
                             f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_ROW - 1}" fill="{_colour(frame)}"/>'
                             f'<text x="{x + 2:.1f}" y="{y + 12}">{text}</text></g>')
                draw(children, x, depth + 1)
            x += w

    draw(tree, 0.0, 0)
    height = 24 + (depth_max + 1) * _ROW + 8
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
            f'font-family="monospace" font-size="11">'
            f'<text x="4" y="16" font-size="13">{html.escape(title)} — {total} samples</text>'
            + "".join(boxes) + "</svg>\n")
