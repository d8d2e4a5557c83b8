"""Terminal rendering (rich): the final report and a live per-rank view while a job runs.

Colour is used only on a TTY without ``NO_COLOR``; otherwise the output is plain
text fit for logs.  ``color=True``/``False`` overrides the detection.
"""
from __future__ import annotations

import os
import sys
import textwrap
import time
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ddp_doctor.evidence import rank_runs
from ddp_doctor.report import _view
from ddp_doctor.report.safe import clean_text
from ddp_doctor.utf8 import readable

VERDICT_STYLE = {"fail": "bold red", "ok": "bold green", "hang": "bold red", "crash": "bold red", "desync": "bold magenta", "interrupted": "bold yellow", "stalled": "bold yellow", None: "bold cyan"}
VERDICT_TEXT = {
    "ok": "OK: the job ran clean",
    "hang": "HANG: the job stopped making progress",
    "stalled": "STALLED: no rank has shown a sign of life for the limit; the job is still running, ddp-doctor watches on",
    "crash": "CRASH: a rank failed",
    "desync": "DESYNC: ranks disagreed",
    "interrupted": "INTERRUPTED: stopped by a signal; every rank's stack below",
    "fail": "FAIL: the pre-flight check found problems",
    None: "LINT",
}
SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _want_color(file: IO[str], color: bool | None) -> bool:
    if color is not None:
        return bool(color)
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


MIN_WIDTH, DEFAULT_WIDTH, MAX_WIDTH = 40, 100, 1000
MIN_HEIGHT, DEFAULT_HEIGHT = 5, 25


def _env_int(name: str) -> int | None:
    """A positive integer from the environment, else None: unset, empty, 0, negative and garbage all read as
    unset (Python's own ``shutil.get_terminal_size`` does the same with ``COLUMNS <= 0``)."""
    try:
        v = int(os.environ.get(name, "").strip())
    except ValueError:
        return None
    return v if v > 0 else None


def console_size(file: IO[str], tty: bool) -> tuple[int, int]:
    """The one decision of the width and height every terminal output is drawn in.

    ``COLUMNS`` / ``LINES`` when they hold a positive integer, else the terminal's own size when ``file`` is
    one, else 100 x 25; then at least 40 x 5 (and at most 1000 columns).  rich left to itself takes
    ``COLUMNS=0`` literally: a console 0 wide printed nothing at all (``report`` exited 0 with no output,
    ``run`` failed before its diagnosis)."""
    width, height = _env_int("COLUMNS"), _env_int("LINES")
    if tty and (width is None or height is None):
        try:
            size = os.get_terminal_size(file.fileno())
            width = width or (size.columns if size.columns > 0 else None)
            height = height or (size.lines if size.lines > 0 else None)
        except (AttributeError, ValueError, OSError):
            pass
    return (min(MAX_WIDTH, max(MIN_WIDTH, width or DEFAULT_WIDTH)), max(MIN_HEIGHT, height or DEFAULT_HEIGHT))


def make_console(file: IO[str] | None = None, color: bool | None = None) -> Console:
    """The console every command prints through (``run``, ``report``, ``check``, ``demo``), sized by
    :func:`console_size` whatever the terminal says (``TERM=dumb``, no TTY, odd ``COLUMNS``)."""
    file = file if file is not None else sys.stdout
    colored = _want_color(file, color)
    try:
        tty = bool(file.isatty())
    except (AttributeError, ValueError):
        tty = False
    width, height = console_size(file, tty)
    return Console(
        file=file, force_terminal=colored, no_color=not colored, color_system="auto" if colored else None,
        highlight=False, emoji=False, width=width, height=height, soft_wrap=False,
    )


# ---------------------------------------------------------------- final report
def print_report(report: dict[str, Any], file: IO[str] | None = None, color: bool | None = None) -> None:
    """Print a ``ddp-doctor/report/v1`` (or lint/v1) dict for people.  Never raises on odd data."""
    con = make_console(file, color)
    # no terminal control sequence from the job or a hostile file reaches the screen; long strings are cut
    report = _view.for_display(report, timelines=False)
    try:
        _print_report(con, report)
    except Exception as exc:  # a renderer bug must not hide the diagnosis: fall back to plain lines
        out = con.file
        print(f"ddp-doctor: verdict {report.get('verdict')} (exit {report.get('exit_code')})"
              f" [terminal renderer failed: {exc!r}]", file=out)
        for f in report.get("findings") or []:
            if isinstance(f, dict):
                loc = f.get("location") or {}
                print(f"  {f.get('code')} {f.get('severity')} ranks {f.get('ranks')} {loc.get('path')}:{loc.get('line')}"
                      f"\n    {f.get('message')}\n    fix: {f.get('fix')}", file=out)


def _print_report(con: Console, report: dict[str, Any]) -> None:
    report = _view.normalize(report)
    runtime, lint = _view.split_findings(report)
    _banner(con, report)
    is_lint_only = report.get("verdict") is None or (not report.get("ranks") and not runtime)
    if runtime:
        con.print(Text(f"Findings ({len(runtime)})", style="bold underline"))
        for f in runtime:
            _finding(con, f, also_lint=_view.lint_lines(report, f))
    elif report.get("verdict") not in (None, "ok") and not is_lint_only:
        con.print("No specific cause was identified; see where each rank stopped below.")
        con.print()
    for past in _view.restarts(report):
        con.print(Text(past["title"], style="bold underline"))
        for f in past["findings"]:
            _finding(con, f)
    if lint:
        path = (report.get("lint") or {}).get("path") if isinstance(report.get("lint"), dict) else None
        title = "Seen in the source" + (f" (lint of {path})" if path else "") + f": {len(lint)}"
        con.print(Text(title, style="bold underline"))
        if not is_lint_only:
            con.print(Text("static findings the run did not raise; they may still bite on other data or at scale",
                           style="dim"))
        for f in lint:
            _finding(con, f)
    if report.get("diagnosis_error"):
        con.print(Text(f"ddp-doctor could not word a diagnosis (its own error, please report it: "
                       f"{report['diagnosis_error']}). The verdict and each rank's state below are the watcher's.",
                       style="red"))
    for err in report.get("errors") or []:
        con.print(Text(f"error: {err.get('path')}: {err.get('message')}", style="red"))
    if report.get("ranks"):
        _rank_table(con, report)
    _side_channel(con, report)
    reports = [report.get(k) for k in ("report_path", "html_path") if report.get(k)]
    for p in reports:
        con.print(Text(f"written: {p}", style="dim"))


def _banner(con: Console, report: dict[str, Any]) -> None:
    verdict = report.get("verdict")
    style = VERDICT_STYLE.get(verdict, "bold")
    head = Text("ddp-doctor ", style="bold")
    head.append(VERDICT_TEXT.get(verdict, str(verdict).upper()), style=style)
    facts = []
    if verdict is not None:
        code = report.get("exit_code")
        facts.append("still running" if code is None else f"exit code {code}")
        ws = report.get("world_size")
        if ws is not None:
            n = _view.nnodes(report)
            facts.append(f"world size {ws}" + (f" on {n} nodes" if n > 1 else ""))
        if report.get("duration_s") is not None:
            facts.append(f"ran {_view.fmt_duration(report['duration_s'])}")
        if report.get("hang_timeout_s") is not None and verdict == "hang":
            facts.append(f"hang timeout {report['hang_timeout_s']} s")
    else:
        n = len(report.get("findings") or [])
        facts.append(f"{n} finding{'s' if n != 1 else ''}")
    line = Text(" | ".join(facts), style="dim")
    rule_style = style.replace("bold ", "")
    con.rule(style=rule_style, characters="=")
    con.print(head)
    con.print(line)
    if report.get("command"):
        con.print(Text("command: " + " ".join(map(str, report["command"])), style="dim"))
    where = [f"launcher: {report['launcher']}"] if report.get("launcher") else []
    if report.get("report_path"):
        where.append(f"report: {report['report_path']}")
    if where:
        con.print(Text(" | ".join(where), style="dim"))
    con.rule(style=rule_style, characters="=")
    con.print()


def _finding(con: Console, f: dict[str, Any], also_lint: list[int] | None = None) -> None:
    sev = str(f.get("severity") or "info")
    head = Text()
    head.append(str(f.get("code", "")), style=SEV_STYLE.get(sev, "bold"))
    head.append(f" {f.get('name', '')}", style="bold")
    head.append(f"  [{sev}]", style=SEV_STYLE.get(sev, ""))
    ranks = f.get("ranks") or []
    if ranks:
        head.append(f"  rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}", style="bold")
    if f.get("source") and f.get("source") != "runtime":
        head.append(f"  ({f['source']})", style="dim")
    if also_lint:
        head.append(f"  (also seen in the source by lint: line {', '.join(map(str, also_lint))})", style="dim")
    con.print(head)
    if f.get("title"):
        con.print(Text("  " + str(f["title"]), style="bold"))
    if f.get("message"):
        con.print(Text(_wrap(con, str(f["message"]))))
    loc = f.get("location")
    if isinstance(loc, dict) and loc.get("path"):
        where = _view.frame_text(loc, short=False)
        con.print(Text("  at " + where, style="cyan"))
        snip = _view.snippet_of(f)
        if snip:
            _snippet(con, snip, loc.get("line"))
    ev = _view.evidence_items(f.get("evidence"), width=max(40, (con.width or 100) * 2))
    if ev:
        con.print(Text("  evidence:", style="dim"))
        for k, v in ev:
            t = Text(_wrap(con, v, 6, k + ": ")[2:])
            t.stylize("dim", 4, 4 + len(k) + 1)
            con.print(t)
    if f.get("fix"):
        body = _wrap(con, str(f["fix"]), 2, "fix: ")
        t = Text(body)
        t.stylize("bold green", 2, 6)
        con.print(t)
    con.print()


def _side_channel(con: Console, report: dict[str, Any]) -> None:
    """Say what went unwatched or was refused on the side channel (nothing when all was well)."""
    side = report.get("side_channel")
    if not isinstance(side, dict):
        return
    notes = []
    for t in side.get("tampered") or []:
        if isinstance(t, dict) and t.get("renewed"):
            notes.append(f"the side channel was tampered with at {_clock(t.get('at'))}: its store dropped the "
                         "launcher's connection (a value someone else wrote); connected afresh at once, no rank "
                         "went unwatched")
    if side.get("lost_at") is not None:
        ranks = ", ".join(map(str, side.get("unwatched_ranks") or [])) or "every rank"
        notes.append(f"rank{'s' if ',' in ranks else ''} {ranks} unwatched from {_clock(side['lost_at'])}: the side "
                     "channel was tampered with (its store dropped the launcher's connection and a new one failed); "
                     "what the ranks did after that is not known, and no verdict rests on it")
    elif side.get("lost"):
        notes.append(f"{', '.join(map(str, side.get('unwatched_nodes') or ['this node']))} never reached the side "
                     "channel: its ranks trained unwatched (recorded locally, not diagnosed)")
    elif side.get("unwatched_ranks"):
        notes.append(f"{'; '.join(map(str, side.get('unwatched_nodes') or []))}: no state ever arrived on the side "
                     "channel, so those ranks went unwatched")
    rejected = side.get("rejected") or {}
    by_key = side.get("rejected_by_key") if isinstance(side.get("rejected_by_key"), dict) else {}
    if rejected or by_key:
        if by_key:
            items = sorted(by_key.items())
            what = "; ".join(f"under {k}: " + ", ".join(f"{n} {why}" for why, n in sorted(by.items()))
                             for k, by in items[:6] if isinstance(by, dict)) + ("; ..." if len(items) > 6 else "")
        else:
            what = ", ".join(f"{n} {why}" for why, n in sorted(rejected.items())) + \
                "; under " + ", ".join(map(str, (side.get("rejected_keys") or [])[:3]))
        notes.append(f"dropped side-channel values not written by this job ({what}): someone else can reach the "
                     "side-channel port; the job was not stopped by them")
    if not notes:
        return
    con.print(Text("Side channel", style="bold underline"))
    for n in notes:
        con.print(_wrap(con, n, indent=2), style="yellow", markup=False, highlight=False)
    con.print()


def _clock(t: Any) -> str:
    """A report's wall-clock time as this machine's HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "?"


def _wrap(con: Console, s: str, indent: int = 2, first: str = "") -> str:
    """Wrap ``s`` to the console width with a hanging indent, keeping its own line breaks (no trailing blanks)."""
    pad = " " * indent
    width = max(40, (con.width or 100) - 1)
    out = []
    for i, para in enumerate(str(s).splitlines() or [""]):
        init = pad + (first if i == 0 else "")
        out.append(textwrap.fill(para, width=width, initial_indent=init, subsequent_indent=pad,
                                 break_long_words=True, break_on_hyphens=False, replace_whitespace=False) or init)
    return "\n".join(out)


def _snippet(con: Console, snip: dict[str, Any], line: Any) -> None:
    start = int(snip.get("start") or 1)
    lines = list(snip.get("lines") or [])
    width = len(str(start + len(lines)))
    for i, src in enumerate(lines):
        no = start + i
        mark = no == line
        t = Text("  ")
        t.append(">" if mark else " ", style="bold red" if mark else "")
        t.append(f" {no:>{width}} | ", style="bold" if mark else "dim")
        t.append(str(src).expandtabs(4).rstrip(), style="bold" if mark else "")
        t.rstrip()
        con.print(t, overflow="ellipsis", no_wrap=True, crop=True)


def _rank_table(con: Console, report: dict[str, Any]) -> None:
    table = Table(title="Ranks", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("rank", "state", "epoch", "step", "exit"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("rank", "epoch", "step") else "left")
    table.add_column("stopped at / last collective", overflow="fold", ratio=1)
    for r in sorted(report.get("ranks") or [], key=lambda r: r.get("rank", 0)):
        bad = _view.rank_is_bad(r)
        where = Text(_view.frame_text(_view.stopped_at(r)) or "-", style="bold" if bad else "")
        coll = _view.collective_text(r.get("last_collective"))
        if coll:
            where.append("\n" + coll, style="dim")
        table.add_row(
            str(r.get("rank")),
            Text(str(r.get("state") or ""), style="bold red" if bad else "green"),
            _na(r.get("epoch")), _na(r.get("step")), _view.exit_text(r) or "-", where,
        )
    con.print(table)
    con.print()


def _na(v: Any) -> str:
    return "-" if v is None else str(v)


# ---------------------------------------------------------------- live view
class LiveView:
    """A compact live line per rank while the job runs.

    On a TTY: a rich Live table redrawn on each :meth:`update`.  Elsewhere (logs,
    CI): one plain summary line at most every ``log_interval_s`` seconds.
    Rows: ``{"rank", "state", "epoch", "step", "steps_per_s", "data_wait_pct", "where"}``.
    """

    def __init__(self, world_size: int, file: IO[str] | None = None, color: bool | None = None,
                 log_interval_s: float = 60.0) -> None:
        self.world_size = world_size
        self.file = file if file is not None else sys.stderr
        self.console = make_console(self.file, color)
        try:
            self.is_tty = bool(self.file.isatty()) if color is None else bool(color)
        except (AttributeError, ValueError):
            self.is_tty = False
        self.log_interval_s = log_interval_s
        self._live: Live | None = None
        self._t0 = time.monotonic()
        self._last_log = self._t0
        self.rows: list[dict[str, Any]] = []
        self.warning: str | None = None
        self._warned: tuple | None = None
        self._warned_t = 0.0

    def __enter__(self) -> "LiveView":
        self._t0 = self._last_log = time.monotonic()
        if self.is_tty:
            try:
                self._live = Live(self._render(), console=self.console, auto_refresh=False, transient=False)
                self._live.__enter__()
            except Exception:
                self._live = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            try:
                self._live.update(self._render(), refresh=True)
                self._live.__exit__(*exc)
            except Exception:
                pass
            self._live = None

    def update(self, rows: list[dict[str, Any]]) -> None:
        """Replace the per-rank rows; never raises (a display must not kill the watcher)."""
        try:
            self.rows = sorted((dict(r) for r in rows or []), key=lambda r: r.get("rank", 0))
            if self._live is not None:
                self._live.update(self._render(), refresh=True)
            elif not self.is_tty:
                now = time.monotonic()
                if now - self._last_log >= self.log_interval_s:
                    self._last_log = now
                    print(self.plain_line(), file=self.file, flush=True)
        except Exception:
            pass

    def warn(self, suspicion: Any, repeat_s: float = 15.0, stall: Any = None) -> None:
        """Show the live warning (an ``evidence.Suspicion``, or None when it is over; ``stall``: the
        ``evidence.Stall`` the job is in, said in its words).  Off a TTY a line is printed when the warning
        starts or changes, and at most every ``repeat_s`` seconds meanwhile."""
        try:
            if suspicion is None:
                if self._warned is not None and not self.is_tty:
                    print("[ddp-doctor] progress again: warning over", file=self.file, flush=True)
                self.warning, self._warned = None, None
                return
            self.warning = suspicion_text(suspicion) if stall is None else stall_text(stall, suspicion)
            now = time.monotonic()
            if self._live is not None:
                self._live.update(self._render(), refresh=True)
            elif suspicion.key() != self._warned or now - self._warned_t >= repeat_s:
                print(f"[ddp-doctor] WARNING {self.warning}", file=self.file, flush=True)
                self._warned_t = now
            self._warned = suspicion.key()
        except Exception:
            pass

    def plain_line(self) -> str:
        el = time.monotonic() - self._t0
        parts = []
        for r in self.rows:
            s = f"r{r.get('rank')} e{_na(r.get('epoch'))} s{_na(r.get('step'))}"
            if r.get("steps_per_s") is not None:
                s += f" {float(r['steps_per_s']):.1f}/s"
            if r.get("data_wait_pct") is not None:
                s += f" dw {float(r['data_wait_pct']):.0f}%"
            s += f" {r.get('state') or ''}".rstrip()
            parts.append(s)
        return f"[ddp-doctor {el:5.0f}s] " + " | ".join(parts)

    def _render(self) -> Any:
        el = time.monotonic() - self._t0
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left",
                      title=Text(f"ddp-doctor watching {self.world_size} rank{'s' if self.world_size != 1 else ''}"
                                 f" - {_view.fmt_duration(el)}", style="bold"))
        for col, just in (("rank", "right"), ("epoch", "right"), ("step", "right"), ("steps/s", "right"),
                          ("data wait", "right"), ("state", "left"), ("where", "left")):
            table.add_column(col, justify=just, no_wrap=True, overflow="ellipsis")
        for r in self.rows:
            state = str(r.get("state") or "")
            bad = _view.rank_is_bad({"state": state})
            dw = r.get("data_wait_pct")
            dws = "" if dw is None else f"{float(dw):.0f}%"
            table.add_row(
                str(r.get("rank")), _na(r.get("epoch")), _na(r.get("step")),
                "" if r.get("steps_per_s") is None else f"{float(r['steps_per_s']):.1f}",
                Text(dws, style="yellow" if dw is not None and float(dw) >= 30 else ""),
                Text(state, style="bold red" if bad else "green"),
                escape(readable(str(r.get("where") or ""))),
            )
        if self.warning:
            return Group(table, Text("WARNING " + self.warning, style="yellow"))
        return Group(table)


def _at(site: Any) -> str:
    return f"{os.path.basename(site.path)}:{site.line}" if site is not None else "an unknown line"


def stall_text(st: Any, s: Any) -> str:
    """One line while the job is stalled (``evidence.Stall``, with the live ``Suspicion`` for the clock): who is
    blocked on what, who waits for it, and that the job runs on."""
    parts = []
    for r, site in sorted(st.where.items()):
        o = st.outside.get(r)
        on = ""
        if o is not None:
            peer = o.peer()
            on = f", blocked in {o.call}()" + (f" on {peer}, outside the job" if peer else "")
        parts.append(f"rank {r} has shown no sign of life for {s.stalled_s:.0f}s at {_at(site)}{on}")
    waits = "; ".join(f"rank {r} waits in {c.op} at {_at(c.site)}" for r, c in sorted(st.waiting.items()))
    text = "STALLED: " + ("; ".join(parts) or f"no rank has progressed for {s.stalled_s:.0f}s")
    text += (f", while {waits}" if waits else "") + ". Nothing proves it stuck: watching on (a stop only on proof, " \
        "at the process group's timeout, or with --stop-on-stall)"
    return clean_text(text)


def suspicion_text(s: Any) -> str:
    """One line for a live warning (``evidence.Suspicion``): who waits where, who is where and how long."""
    parts = [f"no rank has progressed for {s.stalled_s:.0f}s"]
    if s.waiting:
        by: dict[str, list[int]] = {}
        for r, c in sorted(s.waiting.items()):
            by.setdefault(f"in {c.op} (#{c.seq} on {c.group}) at {_at(c.site)}", []).append(r)
        if all(len(rs) <= 8 for rs in by.values()):
            parts.append("; ".join(f"rank {r} waits in {c.op} (#{c.seq} on {c.group}) at {_at(c.site)}"
                                   for r, c in sorted(s.waiting.items())))
        else:  # a large job: one phrase per collective ("ranks 0-5006, 5008-9999 wait in ...")
            parts.append("; ".join(f"ranks {rank_runs(rs)} wait {w}" if len(rs) > 8 else
                                   "; ".join(f"rank {r} waits {w}" for r in rs) for w, rs in by.items()))
    for r, site in sorted(s.outside.items()):
        idle = s.idle_s.get(r)
        life = (f"no sign of life for {idle:.0f}s" if idle is not None and idle >= 2 else "working")
        parts.append(f"rank {r} is outside collectives at {_at(site)} ({life})")
    if s.limit_s:
        parts.append(f"a full diagnosis if no rank shows any sign of life (CPU, I/O, stack) for {s.limit_s:g}s; "
                     "the job is stopped only on proof")
    return readable(clean_text(parts[0] + (": " + "; ".join(parts[1:]) if len(parts) > 1 else "")))
