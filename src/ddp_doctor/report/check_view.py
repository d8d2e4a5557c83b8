"""Terminal rendering of ``ddp-doctor check`` reports (schema ``ddp-doctor/check/v1``), with rich.

Owned by the check engineer; the only place that formats check results.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

_STYLE = {"pass": "green", "ok": "green", "skip": "dim", "not-run": "dim", "info": "cyan",
          "warn": "yellow", "fail": "bold red", "timeout": "bold red", "error": "bold red",
          "hung": "bold red", "exited": "bold red", "failed": "bold red", "not-started": "bold red"}
_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _console(console: Console | None) -> Console:
    return console or Console(highlight=False, soft_wrap=False)


def _status(s: str | None) -> Text:
    s = s or "-"
    label = {"pass": "pass", "ok": "ok"}.get(s, s.upper() if _STYLE.get(s, "").startswith("bold") else s)
    return Text(label, style=_STYLE.get(s, ""))


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def print_start(args, deadline: float, console: Console | None = None) -> None:
    """One line before the launch: what is being tested."""
    c = _console(console)
    c.print(f"[bold]ddp-doctor check[/]: nnodes={args.nnodes} nproc-per-node={args.nproc_per_node}, "
            f"deadline {deadline:g} s per test ...")


def _row(table: Table, *cells) -> None:
    """Add a row; plain strings are never read as rich markup (messages carry '[...]')."""
    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells))


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, title_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")
    return t


def print_check(report: dict[str, Any], console: Console | None = None) -> None:
    """Render a check report: ranks, one table per test, bandwidth, audit, findings, verdict."""
    c = _console(console)
    ranks = report.get("ranks", [])
    if ranks:
        t = _table(f"Ranks ({report.get('world_size')} on {report.get('nnodes')} node(s))",
                   "rank", "node", "host", "local", "pid", "device", "state")
        for r in ranks:
            _row(t, str(r["rank"]), str(r.get("node", "-")), str(r.get("host") or "-"), str(r.get("local_rank", "-")),
                 str(r.get("pid") or "-"), str(r.get("device_name") or r.get("device") or "-"), _status(r["state"]))
        c.print(t)
        versions = sorted({" ".join(f"{k} {v}" for k, v in (r.get("versions") or {}).items() if v)
                           + (f" backend {r['backend']}" if r.get("backend") else "") for r in ranks if r.get("versions")})
        for line in versions:
            c.print(Text("  " + line, style="dim"))
        if all((r.get("device") or "cpu") == "cpu" for r in ranks if r.get("device")):
            c.print("[dim]  GPU: none visible to torch — gloo on CPU; device and NCCL checks skipped.[/]")
    not_run = []
    for test in report.get("tests", []):
        if test["status"] == "not-run":
            not_run.append(test["name"])
            continue
        _print_test(c, test)
    if not_run:
        c.print(Text(f"not run (stopped after a failure): {', '.join(not_run)}", style="dim"))
    bw = report.get("bandwidth") or []
    if bw:
        t = _table(f"all_reduce bus bandwidth ({report.get('world_size')} ranks; busbw = algbw x 2(n-1)/n)",
                   "size", "time/op", "algbw GB/s", "busbw GB/s", "correct")
        for row in bw:
            _row(t, _size(row["bytes"]), _secs(row["time_s"]), f"{row['algbw_GBps']:.3f}", f"{row['busbw_GBps']:.3f}",
                      _status("pass" if row["ok"] else "fail"))
        c.print(t)
    for node in report.get("audit", []):
        t = _table(f"Environment of node {node.get('node')} ({node.get('host')}, {node.get('local_ranks')} ranks)",
                   "check", "status", "value", "detail")
        for chk in node.get("checks", []):
            _row(t, chk["check"], _status(chk["status"]), str(chk["value"]), chk.get("detail", ""))
        c.print(t)
    findings = report.get("findings", [])
    if findings:
        c.print(Text("Findings", style="bold"))
        for f in findings:
            head = Text()
            head.append(f"{f['code']} ", style=_SEV.get(f["severity"], ""))
            head.append(f"{f['name']} ", style="bold")
            ev = f.get("evidence") or {}
            where = []
            if f.get("ranks"):
                where.append(("rank " if len(f["ranks"]) == 1 else "ranks ") + ",".join(map(str, f["ranks"])))
            if ev.get("test"):
                where.append(f"test {ev['test']}")
            if where:
                head.append("[" + "; ".join(where) + "] ", style="magenta")
            head.append(f["message"])
            c.print(head)
            if f.get("fix"):
                c.print(Text("    try: " + f["fix"], style="dim"))
    for r in ranks:
        if r.get("log_tail"):
            c.print(Text(f"Last lines of rank {r['rank']} ({r['state']}):", style="bold"))
            for line in r["log_tail"]:
                c.print(Text("    " + line, style="dim"))
    for p in report.get("stopped_processes", []):
        c.print(Text(f"stopped pid {p['pid']} ({p['signal']})", style="dim"))
    _print_verdict(c, report)


def _print_test(c: Console, test: dict[str, Any]) -> None:
    longest = max((r.get("duration_s") or 0 for r in test.get("ranks", [])), default=0)
    title = Text(f"{test['name']}  ")
    title.append_text(_status(test["status"]))
    title.append(f"  ({_secs(longest)})")
    pairs = test.get("pairs")
    if pairs:
        t = _table("", "pair", "status", "time", "detail")
        t.title = title
        for p in pairs:
            _row(t, f"{p['pair'][0]} <-> {p['pair'][1]}", _status(p["status"]), _secs(p.get("time_s")),
                      "; ".join(p.get("details", [])))
        extra = [r for r in test["ranks"] if r["status"] in ("hung", "exited", "not-run", "skip")]
        for r in extra:
            _row(t, f"rank {r['rank']}", _status(r["status"]), "-", r.get("detail") or "")
        c.print(t)
        return
    t = _table("", "rank", "status", "time", "detail")
    t.title = title
    for r in test.get("ranks", []):
        _row(t, str(r["rank"]), _status(r["status"]), _secs(r.get("duration_s")), r.get("detail") or "")
    c.print(t)


def _print_verdict(c: Console, report: dict[str, Any]) -> None:
    tests = report.get("tests", [])
    passed = sum(1 for t in tests if t["status"] == "pass")
    failed = [t["name"] for t in tests if t["status"] == "fail"]
    errors = sum(1 for f in report.get("findings", []) if f["severity"] == "error")
    warnings = sum(1 for f in report.get("findings", []) if f["severity"] == "warning")
    dur = report.get("duration_s")
    tail = f" in {dur:.1f} s" if isinstance(dur, (int, float)) else ""
    if report.get("verdict") == "ok":
        c.print(Text(f"PASS: {passed}/{len(tests)} tests passed on {report.get('world_size')} ranks{tail}"
                     + (f"; {warnings} warning(s)" if warnings else ""), style="bold green"))
    else:
        what = f"failed: {', '.join(failed)}" if failed else "no test ran"
        c.print(Text(f"FAIL: {what}; {errors} error(s), {warnings} warning(s){tail}", style="bold red"))
