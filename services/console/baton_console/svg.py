"""Charts as inline SVG, drawn on the server: lines over time, horizontal bars (stacked too) and a
cost-quality scatter. No script runs in the browser; every mark carries a <title> a pointer shows."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 220, 56, 150, 16, 28
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def number(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def clock(ms: int, width_ms: int) -> str:
    fmt = "%H:%M:%S" if width_ms < 60_000 else "%H:%M" if width_ms < 86_400_000 else "%m-%d"
    return time.strftime(fmt, time.gmtime(ms / 1000))


@dataclass(frozen=True)
class Mark:
    """A labelled vertical line at `at` (ms): a rollout, or one of the trainer's gate decisions. `kind`
    is its class (its colour in the page's style), `title` what a pointer shows, `row` its label's line."""

    at: int
    label: str
    kind: str = "rollout"
    title: str = ""
    row: int = 0


def _frame(body: list[str], title: str, height: int = H) -> str:
    return (f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" aria-label="{escape(title)}">'
            + "".join(body) + "</svg></figure>")


def _legend(names: list[str]) -> list[str]:
    x = W - RIGHT + 10
    return [f'<rect x="{x}" y="{TOP + 14 * i}" width="10" height="10" fill="{color(i)}"/>'
            f'<text x="{x + 14}" y="{TOP + 14 * i + 9}" class="legend">{escape(n[:22])}</text>'
            for i, n in enumerate(names[:12])]


def lines(title: str, times: list[int], width_ms: int, values: dict[str, list[float | None]],
          marks: Sequence[Mark] = ()) -> str:
    """One line per series over `times` (bucket starts, ms); a gap where a series has no value.
    `marks` are labelled vertical lines (rollouts, gate decisions)."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    top = max([v for vs in values.values() for v in vs if v is not None] + [0.0]) or 1.0
    n = max(1, len(times) - 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return LEFT + plot_w * i / n, TOP + plot_h * (1 - v / top)

    body = [f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" class="axis"/>',
            f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
            f'<text x="{LEFT - 6}" y="{TOP + 4}" class="tick" text-anchor="end">{number(top)}</text>',
            f'<text x="{LEFT - 6}" y="{TOP + plot_h}" class="tick" text-anchor="end">0</text>']
    if times:
        body += [f'<text x="{LEFT}" y="{H - 8}" class="tick">{clock(times[0], width_ms)}</text>',
                 f'<text x="{LEFT + plot_w}" y="{H - 8}" class="tick" text-anchor="end">{clock(times[-1], width_ms)} UTC</text>']
    for m in marks:
        if times and times[0] <= m.at <= times[-1] + width_ms:
            x = LEFT + plot_w * (m.at - times[0]) / max(1, times[-1] - times[0] or width_ms)
            body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" class="mark {escape(m.kind)}">'
                        f'<title>{escape(m.title or m.label)}</title></line>'
                        f'<text x="{x + 3:.1f}" y="{TOP + 10 + 12 * m.row}" class="tick">{escape(m.label[:18])}</text>')
    for i, (name, vs) in enumerate(values.items()):
        # Consecutive buckets with a value are one line; a bucket without one breaks it.
        runs: list[list[tuple[float, float]]] = [[]]
        for j, v in enumerate(vs):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(xy(j, v))
        for points in runs:
            if not points:
                continue
            if len(points) == 1:
                x, y = points[0]
                body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color(i)}"><title>{escape(name)}</title></circle>')
            else:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                body.append(f'<polyline points="{d}" fill="none" stroke="{color(i)}" stroke-width="2">'
                            f'<title>{escape(name)}</title></polyline>')
    return _frame(body + _legend(list(values)), title)


def bars(title: str, items: list[tuple[str, float]], unit: str = "") -> str:
    """One horizontal bar per (label, value), largest first as given."""
    items = items[:15]
    height = TOP + 20 * max(1, len(items)) + 8
    top = max([v for _, v in items] + [0.0]) or 1.0
    label_w, plot_w = 250, W - 250 - 70
    body = []
    for i, (label, v) in enumerate(items):
        y = TOP + 20 * i
        body.append(f'<text x="{label_w - 6}" y="{y + 12}" class="tick" text-anchor="end">{escape(label[:40])}</text>'
                    f'<rect x="{label_w}" y="{y}" width="{max(1.0, plot_w * v / top):.1f}" height="15" fill="{color(0)}">'
                    f'<title>{escape(label)}: {number(v)}{unit}</title></rect>'
                    f'<text x="{label_w + plot_w * v / top + 4:.1f}" y="{y + 12}" class="tick">{number(v)}{unit}</text>')
    return _frame(body, title, height)


def stacked(title: str, items: list[tuple[str, dict[str, float]]], parts: list[str]) -> str:
    """One horizontal bar per (label, {part: value}), its parts side by side in `parts`' order and
    colours, their total at its end."""
    items = items[:15]
    height = max(TOP + 20 * max(1, len(items)) + 8, TOP + 14 * min(12, len(parts)) + 8)
    top = max([sum(v.values()) for _, v in items] + [0.0]) or 1.0
    label_w, plot_w = 120, W - 120 - RIGHT - 40
    body = []
    for i, (label, values) in enumerate(items):
        y, x = TOP + 20 * i, float(label_w)
        body.append(f'<text x="{label_w - 6}" y="{y + 12}" class="tick" text-anchor="end">{escape(label[:18])}</text>')
        for j, part in enumerate(parts):
            if v := values.get(part, 0.0):
                w = max(1.0, plot_w * v / top)
                body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="15" fill="{color(j)}">'
                            f'<title>{escape(label)}, {escape(part)}: {number(v)}</title></rect>')
                x += w
        body.append(f'<text x="{x + 4:.1f}" y="{y + 12}" class="tick">{number(sum(values.values()))}</text>')
    return _frame(body + _legend(parts), title, height)


def scatter(title: str, points: list[tuple[str, float, float, int]]) -> str:
    """Cost (x) against quality (y), one labelled point per (name, cost, quality, count)."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    most_cost = max([c for _, c, _, _ in points] + [0.0]) or 1.0
    body = [f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" class="axis"/>',
            f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
            f'<text x="{LEFT - 6}" y="{TOP + 4}" class="tick" text-anchor="end">1</text>',
            f'<text x="{LEFT - 6}" y="{TOP + plot_h}" class="tick" text-anchor="end">0</text>',
            f'<text x="{LEFT + plot_w}" y="{H - 8}" class="tick" text-anchor="end">${number(most_cost)} per query</text>']
    for i, (name, cost, quality, count) in enumerate(points):
        x, y = LEFT + plot_w * cost / most_cost, TOP + plot_h * (1 - quality)
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color(i)}"><title>{escape(name)}: quality '
                    f'{quality:.3f}, ${cost:.6f} per query, {count} episodes</title></circle>')
    return _frame(body + _legend([p[0] for p in points]), title)
