"""The console's pages as HTML: a shared frame, then one function per page. Everything shown that
came from the dataset or the policy store is escaped; links carry only values the console chose or
the client sent."""

from __future__ import annotations

import json
import time
from collections import Counter
from html import escape
from urllib.parse import quote, urlencode

from baton_console import data, svg
from baton_console.live import LiveEpisodes
from baton_console.refusals import REASONS, Refusals
from baton_policy.decisions import KINDS

STYLE = """
body{font:14px system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header b{margin-right:12px}
main{padding:12px 16px}.grid{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{background:#fff;border:1px solid #ddd;margin:0;padding:6px}
figcaption{font-weight:600;margin-bottom:4px}.axis{stroke:#999}.mark{stroke:#c33;stroke-dasharray:4 3}
.mark.published{stroke:#2a7d2a;stroke-dasharray:none}.mark.refused{stroke:#888;stroke-dasharray:1 3}
.mark.rollback{stroke:#e08a00;stroke-dasharray:8 3}
.tick,.legend{font-size:11px;fill:#444}table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}
pre{white-space:pre-wrap;max-width:900px;margin:0}.muted{color:#777}
"""
NAV = [("/", "Overview"), ("/quality", "Quality and cost"), ("/workflows", "Workflows"), ("/workers", "Workers"),
       ("/tenants", "Tenants"), ("/episodes", "Episodes")]


def frame(title: str, body: str) -> str:
    links = "".join(f'<a href="{href}">{name}</a>' for href, name in NAV)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)} · Baton</title>"
            f"<style>{STYLE}</style></head><body><header><b>Baton console</b>{links}</header>"
            f"<main><h1>{escape(title)}</h1>{body}</main></body></html>")


def empty(rows: list[dict]) -> str | None:
    return None if rows else "<p class='muted'>No episodes yet: the reward logger writes them as answers are graded.</p>"


def choices(name: str, options: tuple[str, ...], chosen: str, path: str) -> str:
    return " · ".join(f"<b>{o}</b>" if o == chosen else f'<a href="{path}?{urlencode({name: o})}">{o}</a>'
                      for o in options)


def live_line(live: LiveEpisodes | None) -> str:
    """Where the newest episodes come from: the dataset alone, or also Kafka (and how that goes)."""
    if live is None:
        return "<p class='muted'>Live traffic is off (console.live): episodes appear once the reward logger writes them.</p>"
    skipped = f"; {live.skipped} records that are not responses skipped" if live.skipped else ""
    return (f"<p class='muted' id='live'>Live: {escape(live.status)}; {len(live.rows)} answers not yet in the dataset "
            f"(ungraded until they are){skipped}.</p>")


def overview(rows: list[dict], by: str, live: LiveEpisodes | None = None) -> str:
    if (msg := empty(rows)) is not None:
        return frame("Overview", msg + live_line(live))
    buckets, charts = data.overview(rows, by)
    figures = "".join(svg.lines(name, buckets.times(), buckets.width_ms, values) for name, values in charts.items())
    return frame("Overview", f"<p>{len(rows)} episodes. Split by {choices('by', data.SPLITS, by, '/')}</p>"
                             f"{live_line(live)}<div class='grid'>{figures}</div>")


def quality(rows: list[dict], decided: list[dict] | None = None, problem: str | None = None) -> str:
    """Quality over time with each rollout and gate decision marked, cost against quality, and the
    latest decisions; `decided` is None when no policy store is configured."""
    table = decision_table(decided, problem)
    if (msg := empty(rows)) is not None:
        return frame("Quality and cost", msg + table)
    b = data.Buckets.over(rows)
    per_version = data.series(rows, b, lambda r: [data.version_of(r)], data.mean_quality)
    marks = [svg.Mark(t, f"rollout {v}") for t, v in data.rollouts(rows)] + [decision_mark(d) for d in decided or []]
    return frame("Quality and cost", "<div class='grid'>"
                 + svg.lines("graded quality per policy version (red dashes: a version's first answer; green: "
                             "published, grey: refused by the gate, orange: rollback)", b.times(),
                             b.width_ms, per_version, marks)
                 + svg.scatter("cost and quality: each worker alone, each policy version", data.frontier(rows))
                 + "</div><p class='muted'>A worker's point counts the questions it answered alone; a policy's, "
                   "every graded episode it planned.</p>" + table)


def _gate(d: dict, key: str) -> float | None:
    """One of the gate's numbers in a decision, None when it has none (a rollback) or it is not a number."""
    gate = d.get("gate")
    v = gate.get(key) if isinstance(gate, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _signed(v: float | None) -> str:
    return "" if v is None else f"{v:+.4f}"


def decision_mark(d: dict) -> svg.Mark:
    """A gate decision on the time axis, coloured by its kind, on the line under the rollouts' labels."""
    kind = str(d.get("kind")) if d.get("kind") in KINDS else "decision"
    version, lower = str(d.get("version", "?")), _gate(d, "lower")
    bound = f"gate lower bound {lower:+.4f}" if lower is not None else "no gate"
    title = f"{kind} {version} (serving before: {d.get('previous', '?')}); {bound}; {d.get('reason', '')}"
    return svg.Mark(d["unix_ms"], f"{kind} {version}", kind, title, row=1)


def decision_table(decided: list[dict] | None, problem: str | None, most: int = 20) -> str:
    """The latest gate decisions, newest first, or why there are none to show."""
    if decided is None:
        return "<p class='muted'>The trainer's gate decisions appear here when router.policy_store is set.</p>"
    if problem:
        return f"<p class='muted'>No gate decisions shown: {escape(problem)}.</p>"
    if not decided:
        return "<p class='muted'>No gate decisions recorded in the policy store yet.</p>"
    rows = "".join(
        f"<tr><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(d['unix_ms'] / 1000))}</td>"
        f"<td>{escape(str(d.get('kind', '')))}</td><td>{escape(str(d.get('version', '')))}</td>"
        f"<td>{escape(str(d.get('previous', '')))}</td><td>{_signed(_gate(d, 'difference'))}</td>"
        f"<td>{_signed(_gate(d, 'lower'))}</td><td>{escape(str(d.get('reason', '')))}</td></tr>"
        for d in reversed(decided[-most:]))
    return ("<h2>Gate decisions</h2><table id='decisions'><tr><th>time (UTC)</th><th>decision</th><th>version</th>"
            "<th>serving before</th><th>estimate difference</th><th>lower bound</th><th>reason</th></tr>"
            f"{rows}</table>")


def workflows(rows: list[dict], per_eval: bool) -> str:
    if (msg := empty(rows)) is not None:
        return frame("Workflows", msg)
    mix = data.workflow_mix(rows, per_eval)
    figures = "".join(svg.bars(f"plans written{'' if group == 'all' else ' for ' + group} ({sum(c.values())})",
                               c.most_common(), "") for group, c in mix.items())
    toggle = choices("per", ("all", "eval"), "eval" if per_eval else "all", "/workflows")
    return frame("Workflows", f"<p>Plans by shape: workers in order; <code>&lt;- 1</code> reads step 1's output. "
                              f"Grouped: {toggle}</p><div class='grid'>{figures}</div>")


def workers(rows: list[dict]) -> str:
    if (msg := empty(rows)) is not None:
        return frame("Workers", msg)
    b = data.Buckets.over(rows)
    share = data.series(rows, b, data.workers_of, lambda rs: float(len(rs)), 0.0)
    per_bucket = Counter(b.index(r) for r in rows if r.get("completed_unix_ms"))
    totals = [per_bucket[i] for i in range(b.count)]
    share = {w: [None if v is None or not totals[i] else v / totals[i] for i, v in enumerate(vs)]
             for w, vs in share.items()}
    alone = data.series(rows, b, lambda r: [w] if (w := data.sole_worker(r)) else [], data.mean_quality)
    return frame("Workers", "<div class='grid'>"
                 + svg.lines("share of requests each worker took part in", b.times(), b.width_ms, share)
                 + svg.lines("graded quality of each worker answering alone, as it is learned", b.times(),
                             b.width_ms, alone) + "</div>")


def tenants(rows: list[dict], budgets: dict[str, float | None], refused: Refusals) -> str:
    spent: dict[str, float] = {}
    for r in rows:
        spent[r.get("tenant") or "-"] = spent.get(r.get("tenant") or "-", 0.0) + (r["cost_usd"] or 0)
    names = sorted(set(spent) | {t for t, b in budgets.items() if b})
    body = "<table><tr><th>tenant</th><th>spent in the episodes shown (USD)</th><th>budget (USD)</th><th>share</th></tr>"
    for t in names:
        budget = budgets.get(t)
        share = f"{spent.get(t, 0) / budget:.0%}" if budget else ""
        body += f"<tr><td>{escape(t)}</td><td>{spent.get(t, 0):.6f}</td><td>{budget or ''}</td><td>{share}</td></tr>"
    body += "</table>"
    b = data.Buckets.over(rows)
    chart = svg.lines("cost per minute by tenant (USD)", b.times(), b.width_ms,
                      data.series(rows, b, lambda r: [r.get("tenant") or "-"],
                                  lambda rs: sum(r["cost_usd"] or 0 for r in rs) / (b.width_ms / 60_000), 0.0)) if rows else ""
    note = "<p class='muted'>A gateway counts a budget from the answers it received since it started.</p>"
    return frame("Tenants", f"<div class='grid'>{chart}</div>{body}{note}<h2>Refused requests</h2>{refusals(refused)}")


def refusals(refused: Refusals) -> str:
    """The requests the gateway refused, by tenant and reason: a stacked bar each, and their counts."""
    where = f"{escape(refused.source)}, {escape(refused.span)}"
    if refused.error is not None:
        return f"<p id='refusals-source' class='muted'>Could not read the refusals from {where}: {escape(refused.error)}.</p>"
    source = f"<p id='refusals-source' class='muted'>Read from {where}.</p>"
    if not refused.counts:
        return f"<p>No request was refused.</p>{source}"
    parts = refused.reasons()
    labels = [REASONS.get(p, p) for p in parts]
    by_total = sorted(refused.counts.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    chart = svg.stacked("refused requests by tenant and reason", [
        (t or "-", {REASONS.get(p, p): n for p, n in by.items()}) for t, by in by_total], labels)
    table = "<table id='refusals'><tr><th>tenant</th>" + "".join(
        f"<th title='{escape(p)}'>{escape(label)}</th>" for p, label in zip(parts, labels)) + "<th>total</th></tr>"
    for t, by in by_total:
        table += f"<tr><td>{escape(t or '-')}</td>" + "".join(f"<td>{by.get(p, 0):.0f}</td>" for p in parts) + \
                 f"<td>{sum(by.values()):.0f}</td></tr>"
    return (f"<div class='grid'>{chart}</div>{table}</table>{source}<p class='muted'>Rate limit: a key over its "
            "requests or tokens per minute; budget spent: the tenant's budget_usd; at capacity: the replica had too "
            "many requests waiting; other rejections: a request refused for what it asked (unknown model, too large, "
            "no scope).</p>")


def episodes(found: list[dict], query: dict[str, str]) -> str:
    def field(name: str, label: str) -> str:
        return f'<label>{label} <input name="{name}" value="{escape(query.get(name, ""))}"></label> '

    outcomes = "".join(f'<option{" selected" if query.get("result") == o else ""}>{o}</option>' for o in data.OUTCOMES)
    form = (f'<form method="get" action="/episodes">{field("request_id", "request id")}{field("tenant", "tenant")}'
            f'{field("worker", "worker")}<label>outcome <select name="result"><option value="">any</option>{outcomes}'
            f'</select></label> <button>Search</button></form>')
    table = "<table id='episodes'><tr><th>request</th><th>finished (UTC)</th><th>tenant</th><th>plan</th>" \
            "<th>outcome</th><th>cost (USD)</th><th>latency (ms)</th></tr>"
    for r in found:
        table += (f'<tr><td><a href="/episodes/{quote(r["request_id"], safe="")}">{escape(r["request_id"])}</a></td>'
                  f'<td>{svg.clock(r["completed_unix_ms"] or 0, 1000)}</td><td>{escape(r.get("tenant") or "-")}</td>'
                  f'<td>{escape(data.workflow_shape(r))}</td><td>{data.outcome(r)}</td>'
                  f'<td>{(r["cost_usd"] or 0):.6f}</td><td>{(r["latency_ms"] or 0):.0f}</td></tr>')
    return frame("Episodes", f"{form}<p>{len(found)} shown, newest first.</p>{table}</table>")


def _rows(pairs: list[tuple[str, object]]) -> str:
    return "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)


def episode(r: dict, feedback: list[dict], trace_url: str | None) -> str:
    plan = "".join(f"<tr><td>{i + 1}</td><td>{escape(s.get('worker', '?'))}</td><td>{escape(data.reads(s) or '-')}</td>"
                   f"<td><pre>{escape(s.get('instruction', ''))}</pre></td></tr>"
                   for i, s in enumerate(data.plan_steps(r)))
    steps = "".join(
        f"<tr class='step'><td>{s['step'] + 1}</td><td>{escape(s.get('worker') or '')}</td><td>{escape(s.get('model') or '')}"
        f"</td><td>{s.get('attempt') or 1}</td><td>{s.get('input_tokens') or 0} / {s.get('output_tokens') or 0}</td>"
        f"<td>{(s.get('cost_usd') or 0):.6f}</td><td>{(s.get('latency_ms') or 0):.0f}</td>"
        f"<td><pre>{escape(s.get('error') or s.get('output') or '')}</pre></td></tr>" for s in r.get("steps") or [])
    ratings = "".join(f"<tr><td>{escape(f.get('source') or '')}</td><td>{escape(f.get('tenant') or '-')}</td>"
                      f"<td>{f['score']:+.2f}</td><td>{escape(f.get('comment') or '')}</td></tr>" for f in feedback)
    trace = (f'<a href="{escape(trace_url.replace("{request_id}", quote(r["request_id"], safe="")))}">its trace</a>'
             if trace_url else "<span class='muted'>no tracing UI configured (console.trace_url)</span>")
    summary = _rows([
        ("tenant", escape(r.get("tenant") or "-")), ("policy", escape(r.get("policy") or "")),
        ("planned by", escape(" ".join(dict.fromkeys(filter(None, (r.get("plan_backend"), r.get("plan_policy_version"))))))
         + (" (fallback: " + escape(r.get("plan_invalid_reason") or "") + ")" if r.get("plan_fallback") else "")),
        ("question", f"<pre>{escape(r.get('query') or '')}</pre>"),
        ("answer", f"<pre>{escape(r.get('answer') or r.get('error_message') or '')}</pre>"),
        ("outcome", data.outcome(r) + (f" ({escape(r['error_code'])})" if r.get("error_code") else "")),
        ("grade", escape(f"quality {r['quality']}, reward {r['reward']} by {r.get('grader') or '-'}")
         if r.get("quality") is not None else "ungraded"),
        ("why", f"<pre>{escape(r.get('reward_detail') or '')}</pre>"),
        ("total", f"{r.get('calls') or 0} calls, {r.get('input_tokens') or 0} / {r.get('output_tokens') or 0} tokens, "
                  f"${(r.get('cost_usd') or 0):.6f}, {(r.get('latency_ms') or 0):.0f} ms"),
        ("trace", trace), ("metadata", f"<pre>{escape(json.dumps(json.loads(r.get('metadata_json') or '{}')))}</pre>"),
    ])
    return frame(f"Episode {r['request_id']}",
                 f"<table>{summary}</table><h2>Plan</h2><table id='plan'><tr><th>step</th><th>worker</th>"
                 f"<th>reads</th><th>instruction</th></tr>{plan}</table><h2>Steps run</h2><table id='steps'><tr>"
                 f"<th>step</th><th>worker</th><th>model</th><th>attempt</th><th>tokens in / out</th>"
                 f"<th>cost (USD)</th><th>latency (ms)</th><th>output</th></tr>{steps}</table><h2>Feedback</h2>"
                 f"<table><tr><th>source</th><th>tenant</th><th>score</th><th>comment</th></tr>{ratings}</table>")


def login(message: str = "") -> str:
    note = f"<p style='color:#b00'>{escape(message)}</p>" if message else ""
    return frame("Sign in", f"{note}<form method='post' action='/login'><label>API key with the admin scope "
                            "<input type='password' name='key' autocomplete='off'></label> <button>Sign in</button></form>")
