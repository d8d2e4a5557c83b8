"""One self-contained HTML file per report: no network, no CDN; CSS, JS and SVG are inline.

The static parts (verdict, findings with source, rank table with stacks) are written
here, escaped with :func:`html.escape`, so the page reads even with scripts off; the
timeline and the step-time chart are drawn by the inline script from embedded JSON
(escaped so no ``</script>`` can end the block).
"""
from __future__ import annotations

import datetime as _dt
import json
from html import escape
from importlib import resources
from typing import Any

from ddp_doctor.report import _view

VERDICT_TEXT = {
    "ok": ("OK", "the job ran clean"),
    "hang": ("HANG", "the job stopped making progress"),
    "stalled": ("STALLED", "no rank has shown a sign of life for the limit; the job was still running"),
    "crash": ("CRASH", "a rank failed"),
    "desync": ("DESYNC", "ranks disagreed on what to run"),
    "interrupted": ("INTERRUPTED", "stopped by a signal (Ctrl-C, SIGTERM, SIGHUP)"),
    "fail": ("FAIL", "the pre-flight check found problems"),
    None: ("LINT", "static findings"),
}


def _asset(name: str) -> str:
    return resources.files("ddp_doctor.report").joinpath("assets", name).read_text(encoding="utf-8")


def json_for_script(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, ``<!--``, U+2028/9)."""
    s = json.dumps(data, default=str, ensure_ascii=False, separators=(",", ":"))
    return (s.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _e(v: Any) -> str:
    return escape("" if v is None else str(v), quote=True)


def _view_data(report: dict[str, Any]) -> dict[str, Any]:
    ranks = []
    tmax = 0.0
    cap = _view.timeline_cap(len(report.get("ranks") or []))
    for r in sorted(report.get("ranks") or [], key=lambda r: r.get("rank", 0)):
        tl = [ev for ev in (r.get("timeline") or []) if isinstance(ev, dict)][-cap:]
        stop_t = None
        for ev in tl:
            try:
                end = float(ev.get("t") or 0) + float(ev.get("dur") or 0)
            except (TypeError, ValueError):
                continue
            tmax = max(tmax, end)
            if ev.get("kind") == "stop":
                stop_t = float(ev.get("t") or 0)
        timing = r.get("timing") if isinstance(r.get("timing"), dict) else None
        ranks.append({
            "rank": r.get("rank"), "state": r.get("state"), "epoch": r.get("epoch"), "step": r.get("step"),
            "bad": _view.rank_is_bad(r), "where": _view.frame_text(_view.stopped_at(r)),
            "timeline": tl, "timing": timing, "stop_t": stop_t,
        })
    try:
        tmax = max(tmax, float(report.get("duration_s") or 0))
    except (TypeError, ValueError):
        pass
    return {"tmax": tmax or 1.0, "ranks": ranks}


def render_html(report: dict[str, Any]) -> str:
    """The whole page as a string (it shows and embeds ``_view.for_display(report)``)."""
    report = _view.normalize(_view.for_display(report))
    runtime, lint = _view.split_findings(report)
    verdict = report.get("verdict")
    word, sub = VERDICT_TEXT.get(verdict, (str(verdict).upper(), ""))
    is_check = report.get("schema") == "ddp-doctor/check/v1"
    if is_check and verdict == "ok":
        sub = "the pre-flight check passed"
    ws = report.get("world_size")
    facts = []
    if verdict is not None:
        facts.append(f"exit code {_e(report.get('exit_code'))}")
        facts.append(f"{_e(ws)} rank{'s' if ws != 1 else ''}")
        if _view.nnodes(report) > 1:
            facts.append(f"{_view.nnodes(report)} nodes")
        if report.get("duration_s") is not None:
            facts.append("ran " + _e(_view.fmt_duration(report["duration_s"])))
        if report.get("hang_timeout_s") is not None and verdict == "hang":
            facts.append(f"hang timeout {_e(report['hang_timeout_s'])} s")
        if report.get("started_at"):
            facts.append("started " + _e(report["started_at"]))
        if report.get("launcher"):
            facts.append("launched by " + _e(report["launcher"]))
    n_err = sum(1 for f in runtime + lint if f.get("severity") == "error")
    facts.append(f"{len(runtime) + len(lint)} finding{'s' if len(runtime) + len(lint) != 1 else ''}"
                 + (f" ({n_err} error{'s' if n_err != 1 else ''})" if n_err else ""))
    cmd = report.get("command")
    title = f"ddp-doctor: {word}" + (f" - {ws} ranks" if verdict is not None else "")
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # no network at all: everything is inline
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_e(title)}</title>", f"<style>{_asset('report.css')}</style></head>",
        f'<body class="verdict-{_e(verdict or "lint")}">',
        f'<header class="banner v-{_e(verdict or "lint")}"><h1>ddp-doctor &mdash; {_e(word)}</h1><p>{_e(sub)}</p>',
        '<ul class="facts">' + "".join(f"<li>{x}</li>" for x in facts) + "</ul>",
    ]
    if cmd:
        out.append(f'<code class="cmd">$ {_e(" ".join(map(str, cmd)))}</code>')
    out.append("</header>")
    has_ranks = bool(report.get("ranks"))
    # a check report (or any report whose ranks carry no timing at all, from a producer that never records
    # them) gets no charts; a run report always shows them, with "not recorded" notes where data is missing
    charts = has_ranks and (report.get("schema") != "ddp-doctor/check/v1"
                            or any(r.get("timeline") or r.get("timing") for r in report.get("ranks") or []))
    toc = ([("timeline", "Timeline"), ("breakdown", "Step time")] if charts else []) + [("findings", "Findings")]
    past = _view.restarts(report)
    if past:
        toc.append(("restarts", "Earlier attempts"))
    if lint and runtime:
        toc.append(("lint", "Seen in the source"))
    if has_ranks:
        toc.append(("ranks", "Ranks"))
    out.append('<nav class="toc">' + "".join(f'<a href="#{a}">{t}</a>' for a, t in toc) + "</nav><main>")
    if charts:
        out.append('<section id="timeline"><h2>Timeline</h2><p class="hint">One lane per rank: steps, collectives and '
                   "data-loader waits over time; a red, hatched lane is a rank that stopped, with the line it stopped on; a "
                   "dashed, hatched band is a stall (no rank showed a sign of life), its cause in its tooltip.</p>"
                   '<div id="timeline-range" class="range"></div>'
                   '<div id="timeline-chart" class="chart"><noscript><p class="empty">Enable JavaScript to draw the timeline.'
                   "</p></noscript></div><div class=\"legend\"><span style=\"--c:var(--step)\">step</span>"
                   '<span style="--c:var(--coll)">collective</span><span style="--c:var(--wait)">data wait</span>'
                   '<span style="--c:var(--stop)">stopped</span><span style="--c:var(--epoch)">epoch</span></div></section>')
        out.append('<section id="breakdown"><h2>Step time per rank</h2><p class="hint">Average time per step, split into '
                   "waiting for data, compute and collectives.</p><div id=\"breakdown-chart\" class=\"chart\"></div>"
                   '<div class="legend"><span style="--c:var(--wait)">data wait</span><span style="--c:var(--compute)">'
                   'compute</span><span style="--c:var(--coll)">collective</span><span style="--c:var(--other)">other</span>'
                   "</div></section>")
    if is_check and isinstance(report.get("tests"), list):
        out.append(_check_tests_html(report))
    if runtime or not lint:
        out.append(f'<section id="findings"><h2>Findings ({len(runtime)})</h2>')
        if not runtime:
            out.append('<p class="empty">' + ("No finding: nothing went wrong that ddp-doctor knows of."
                                             if verdict == "ok" else "No specific cause was identified; see where each "
                                             "rank stopped in the timeline and the rank table.") + "</p>")
        out += [_finding_html(f, i, _view.lint_lines(report, f)) for i, f in enumerate(runtime)]
        out.append("</section>")
    if past:
        out.append('<section id="restarts"><h2>Earlier attempts</h2><p class="hint">Attempts that failed and that '
                   "torch's agent restarted (--max-restarts); the sections above describe the last attempt.</p>")
        n = len(runtime) + len(lint)
        for p in past:
            out.append(f"<h3>{_e(p['title'])}</h3>")
            out += [_finding_html(f, n + i) for i, f in enumerate(p["findings"])]
            n += len(p["findings"])
        out.append("</section>")
    if lint:
        sec_id = "lint" if runtime or has_ranks else "findings"
        path = (report.get("lint") or {}).get("path") if isinstance(report.get("lint"), dict) else None
        out.append(f'<section id="{sec_id}"><h2>Seen in the source{" (" + _e(path) + ")" if path else ""}: '
                   f"{len(lint)}</h2>")
        if has_ranks:
            out.append('<p class="hint">Static findings the run did not raise; they may still bite on other data or at scale.</p>')
        out += [_finding_html(f, len(runtime) + i) for i, f in enumerate(lint)]
        out.append("</section>")
    for err in report.get("errors") or []:
        out.append(f'<p class="empty">error: {_e(err.get("path"))}: {_e(err.get("message"))}</p>')
    if has_ranks:
        out.append(_ranks_html(report))
    from ddp_doctor.version import __version__
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out.append(f"</main><footer>ddp-doctor {_e(__version__)} &middot; report written {stamp}</footer>")
    out.append(f'<script type="application/json" id="ddp-report">{json_for_script(report)}</script>')
    out.append(f'<script type="application/json" id="ddp-view">{json_for_script(_view_data(report))}</script>')
    out.append(f"<script>{_asset('report.js')}</script></body></html>")
    return "\n".join(out) + "\n"


def _check_tests_html(report: dict[str, Any]) -> str:
    rows = ['<section id="tests"><h2>Tests</h2><table class="ranks"><thead><tr><th>test</th><th>status</th>'
            "<th>time</th></tr></thead><tbody>"]
    for t in report.get("tests") or []:
        if not isinstance(t, dict):
            continue
        st = str(t.get("status") or "")
        dur = t.get("duration_s")
        rows.append(f'<tr class="{"good" if st in ("pass", "ok") else "bad"}" data-test="{_e(t.get("name"))}">'
                    f'<td>{_e(t.get("name"))}</td><td class="state">{_e(st)}</td>'
                    f'<td>{_e(_view.fmt_duration(dur) if isinstance(dur, (int, float)) else "")}</td></tr>')
    bw = [b for b in report.get("bandwidth") or [] if isinstance(b, dict)]
    rows.append("</tbody></table>")
    if bw:
        rows.append('<h3>all_reduce bandwidth</h3><table class="ranks"><thead><tr><th>size</th><th>time</th>'
                    "<th>algbw GB/s</th><th>busbw GB/s</th></tr></thead><tbody>")
        for b in bw:
            rows.append(f"<tr><td>{_e(b.get('bytes'))} B</td><td>{_e(_view.fmt_duration(b.get('time_s')))}</td>"
                        f"<td>{_e(_num(b.get('algbw_GBps')))}</td><td>{_e(_num(b.get('busbw_GBps')))}</td></tr>")
        rows.append("</tbody></table>")
    rows.append("</section>")
    return "".join(rows)


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else ""


def _finding_html(f: dict[str, Any], idx: int, also_lint: list[int] | None = None) -> str:
    sev = str(f.get("severity") or "info")
    ranks = f.get("ranks") or []
    h = [f'<article class="finding sev-{_e(sev)}" id="finding-{idx}" data-code="{_e(f.get("code"))}">',
         f'<h3><span class="code">{_e(f.get("code"))}</span> <span class="name">{_e(f.get("name"))}</span>'
         f'<span class="badge sev-{_e(sev)}">{_e(sev)}</span>']
    if ranks:
        h.append(f'<span class="badge ranks">rank{"s" if len(ranks) > 1 else ""} {_e(", ".join(map(str, ranks)))}</span>')
    if f.get("source") and f.get("source") != "runtime":
        h.append(f'<span class="badge src">{_e(f["source"])}</span>')
    if also_lint:
        h.append('<span class="badge src" title="lint flagged this before the run">also seen by lint: line '
                 f'{_e(", ".join(map(str, also_lint)))}</span>')
    h.append("</h3>")
    if f.get("title"):
        h.append(f'<div class="title">{_e(f["title"])}</div>')
    if f.get("message"):
        h.append(f'<div class="msg">{_e(f["message"])}</div>')
    loc = f.get("location")
    if isinstance(loc, dict) and loc.get("path"):
        h.append(f'<div class="where mono">{_e(_view.frame_text(loc, short=False))}</div>')
        snip = _view.snippet_of(f)
        if snip:
            start = int(snip.get("start") or 1)
            lines = []
            for i, src in enumerate(snip.get("lines") or []):
                no = start + i
                cls = ' class="hit"' if no == loc.get("line") else ""
                lines.append(f'<span{cls}><span class="ln">{no:>4}</span>{_e(str(src).expandtabs(4))}</span>')
            h.append('<pre class="snippet">' + "".join(lines) + "</pre>")
    ev = _view.evidence_items(f.get("evidence"), limit=20, width=300)
    if ev:
        h.append('<dl class="evidence">' + "".join(f"<dt>{_e(k)}</dt><dd class=\"mono\">{_e(v)}</dd>" for k, v in ev) + "</dl>")
    if f.get("fix"):
        h.append(f'<div class="fix"><b>Fix:</b> {_e(f["fix"])}</div>')
    h.append("</article>")
    return "".join(h)


def _ranks_html(report: dict[str, Any]) -> str:
    rows = ['<section id="ranks"><h2>Ranks</h2><table class="ranks"><thead><tr><th>rank</th><th>state</th><th>epoch</th>'
            "<th>step</th><th>last collective</th><th>stopped at</th><th>exit</th><th>host / pid</th></tr></thead><tbody>"]
    for r in sorted(report.get("ranks") or [], key=lambda r: r.get("rank", 0)):
        bad = _view.rank_is_bad(r)
        stack = r.get("stack") or []
        fr = _view.stopped_at(r)
        host = " / ".join(str(x) for x in (r.get("host"), r.get("pid")) if x is not None)
        rows.append(f'<tr class="{"bad" if bad else "good"}" id="rank-{_e(r.get("rank"))}" data-rank="{_e(r.get("rank"))}">'
                    f'<td>{_e(r.get("rank"))}</td><td class="state">{_e(r.get("state"))}</td>'
                    f'<td>{_e(_dash(r.get("epoch")))}</td><td>{_e(_dash(r.get("step")))}</td>'
                    f'<td class="mono">{_e(_view.collective_text(r.get("last_collective")))}</td>'
                    f'<td class="mono">{_e(_view.frame_text(fr))}</td><td>{_e(_view.exit_text(r))}</td>'
                    f"<td>{_e(host)}</td></tr>")
        blocks = []
        if stack:
            blocks.append(_stack_html("Python stack", stack, _view.user_frame(stack), open_=bad))
        for w in r.get("workers") or []:
            if isinstance(w, dict) and w.get("stack"):
                blocks.append(_stack_html(f"data-loader worker pid {w.get('pid')}", w["stack"],
                                          _view.user_frame(w["stack"]), open_=False))
        if blocks:
            rows.append(f'<tr class="stackrow"><td></td><td colspan="7">{"".join(blocks)}</td></tr>')
    rows.append("</tbody></table></section>")
    return "".join(rows)


def _stack_html(label: str, stack: list[dict[str, Any]], user: dict[str, Any] | None, open_: bool) -> str:
    items = []
    for fr in stack:
        if not isinstance(fr, dict):
            continue
        cls = "user" if fr is user else ("lib" if _view.is_library_frame(fr.get("path")) else "")
        items.append(f'<li class="{cls} mono">{_e(_view.frame_text(fr, short=False))}</li>')
    return (f'<details{" open" if open_ else ""}><summary>{_e(label)} ({len(items)} frames, innermost last)</summary>'
            f'<ol class="stack">{"".join(items)}</ol></details>')


def _dash(v: Any) -> Any:
    return "-" if v is None else v

