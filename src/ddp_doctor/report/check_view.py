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
    if console is not None:
        return console
    from ddp_doctor.report.terminal import make_console

    return make_console()


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


_NOWRAP = {"slowest", "time", "time/op", "status", "result", "pair", "size"}


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, title_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold", no_wrap=col in _NOWRAP)
    return t


def print_check(report: dict[str, Any], console: Console | None = None) -> None:
    """Render a check report: ranks, one table per test, bandwidth, audit, findings, verdict."""
    from ddp_doctor.report._view import for_display

    report = for_display(report, timelines=False)
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
    tests = report.get("tests", [])
    world = int(report.get("world_size") or 0)
    if tests and world:
        _print_summary(c, tests, world, report.get("deadline_s"))
        matrices = [t for t in tests if t.get("pairs") and 2 < world <= 16 and t["status"] != "skip"]
        for test in matrices[-1:]:   # every-pair when it ran (single node), else the ring
            _print_pair_matrix(c, test, world)
        for test in tests:
            if test["status"] == "fail":
                _print_test(c, test)
    bw = report.get("bandwidth") or []
    if bw:
        t = _table("all_reduce bandwidth (busbw = algbw x 2(n-1)/n)",
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


_SHORT = {"pass": "ok", "skip": "skip", "not-run": "-", "timeout": "TIMEOUT", "error": "ERROR", "fail": "WRONG",
          "hung": "HUNG", "exited": "EXITED"}


def _print_summary(c: Console, tests: list[dict[str, Any]], world: int, deadline: float | None = None) -> None:
    """One row per test: overall result, each rank's result (up to 16 ranks), the slowest rank."""
    per_rank = world <= 16
    cols = ["test", "result"] + ([f"r{r}" for r in range(world)] if per_rank else []) + ["slowest", "note"]
    t = _table(f"Tests ({world} rank{'s' if world != 1 else ''}" + (f", deadline {deadline:g} s per test)" if deadline else ")"), *cols)
    for test in tests:
        ranks = test.get("ranks", [])
        timed = [r for r in ranks if r.get("duration_s") is not None]
        slow = max(timed, key=lambda r: r["duration_s"]) if timed else None
        slowest = f"{_secs(slow['duration_s'])} r{slow['rank']}" if slow else "-"
        note = ""
        if test.get("pairs"):
            bad = [p for p in test["pairs"] if p["status"] != "pass"]
            note = f"{len(test['pairs']) - len(bad)}/{len(test['pairs'])} pairs ok"
        elif test["status"] == "skip":
            note = next((r.get("detail") or "" for r in ranks if r.get("detail")), "")
        cells = ([Text(_SHORT.get(r["status"], r["status"]), style=_STYLE.get(r["status"], "")) for r in ranks]
                 if per_rank else [])
        cells += [Text("")] * ((world if per_rank else 0) - len(cells))
        _row(t, test["name"], _status(test["status"]), *cells, slowest, note)
    c.print(t)


def _print_pair_matrix(c: Console, test: dict[str, Any], world: int) -> None:
    """Which pairs of ranks could exchange data: a bad link stands out as one cell pair."""
    status = {tuple(p["pair"]): p["status"] for p in test["pairs"]}
    t = _table(f"{test['name']}: send/recv", "", *[str(r) for r in range(world)])
    for a in range(world):
        cells = []
        for b in range(world):
            st = status.get((min(a, b), max(a, b)))
            cells.append(Text("." if a == b or st is None else _SHORT.get(st, st),
                              style=_STYLE.get(st or "", "dim") if a != b else "dim"))
        _row(t, str(a), *cells)
    c.print(t)


def _print_test(c: Console, test: dict[str, Any]) -> None:
    longest = max((r.get("duration_s") or 0 for r in test.get("ranks", [])), default=0)
    title = Text(f"{test['name']} failures  ")
    title.append_text(_status(test["status"]))
    title.append(f"  ({_secs(longest)})")
    pairs = test.get("pairs")
    if pairs:
        t = _table("", "pair", "status", "time", "detail")
        t.title = title
        for p in pairs:
            if p["status"] == "pass":
                continue
            _row(t, f"{p['pair'][0]} <-> {p['pair'][1]}", _status(p["status"]), _secs(p.get("time_s") or None),
                 "; ".join(p.get("details", [])))
        extra = [r for r in test["ranks"] if r["status"] in ("hung", "exited", "not-run", "skip")]
        for r in extra:
            _row(t, f"rank {r['rank']}", _status(r["status"]), "-", r.get("detail") or "")
        c.print(t)
        return
    t = _table("", "rank", "status", "time", "detail")
    t.title = title
    for r in test.get("ranks", []):
        if r["status"] in ("pass", "skip"):
            continue
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
        not_run = [t["name"] for t in tests if t["status"] == "not-run"]
        if failed:
            what = f"failed: {', '.join(failed)}"
        elif not_run and len(not_run) == len(tests):
            what = "no test ran"
        elif not_run:
            what = f"not run: {', '.join(not_run)}"
        else:
            what = f"{passed}/{len(tests)} tests passed, but the environment has errors"
        c.print(Text(f"FAIL: {what}; {errors} error(s), {warnings} warning(s){tail}", style="bold red"))
