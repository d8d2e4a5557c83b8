"""``ddp-doctor demo``: run a shipped buggy 2-rank job, diagnose it, then run the fixed one.

Needs nothing but this package and the CPU build of torch (gloo).  The scripts are
copied into the output directory so you can read, diff and re-run them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddp_doctor.report.terminal import make_console

VERDICT_WORD = {"ok": "OK", "hang": "HANG", "crash": "CRASH", "desync": "DESYNC"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor demo", description="Run the seed-000 bug (validation through the "
                                "DDP model on rank 0 only) on 2 CPU ranks, diagnose it, then run the fixed script.")
    p.add_argument("--out", metavar="DIR", help="where to put the scripts and reports (default: a new temp dir)")
    p.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                   help="seconds without progress before a hang is declared (default: ddp-doctor run's adaptive "
                        "limit, learned from the job's step times)")
    p.add_argument("--no-html", action="store_true", help="do not write the HTML reports")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    return p


def _lint(con, script: Path) -> list[dict[str, Any]]:
    """Lint the buggy script and print the findings; [] when the linter is not available."""
    try:
        from ddp_doctor.lint import lint_paths
    except ImportError:
        con.print("  (the linter is not part of this build)")
        return []
    from ddp_doctor.report import report_v1
    from ddp_doctor.report.snippets import attach_snippets
    from ddp_doctor.report.terminal import print_report

    res = lint_paths([str(script)])
    findings = [dict(f.to_report_dict(), source="lint") for f in res.findings]
    doc = attach_snippets(report_v1("ok", 0, findings, [], exit_code=1 if findings else 0), allowed={str(script)})
    if findings:
        print_report(doc, file=con.file, color=con.is_terminal and not con.no_color)
    else:
        con.print("  lint: no finding")
    return findings


def _run(con, script: Path, report: Path, hang_timeout: float | None) -> tuple[int, dict[str, Any] | None]:
    from ddp_doctor.cli import run as run_cli

    argv = (["--hang-timeout", f"{hang_timeout:g}"] if hang_timeout else []) + [
        "--report", str(report), "--nproc-per-node", "2", "--standalone", str(script)]
    con.print(f"$ ddp-doctor run {' '.join(argv)}", style="bold")
    try:
        rc = int(run_cli.main(argv) or 0)
    except SystemExit as exc:  # argparse
        rc = exc.code if isinstance(exc.code, int) else 2
    data = None
    if report.exists():
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
        except ValueError:
            data = None
    return rc, data


def _summary(data: dict[str, Any] | None, rc: int) -> str:
    if not data:
        return f"no report (exit {rc})"
    word = VERDICT_WORD.get(data.get("verdict"), str(data.get("verdict")).upper())
    s = f"{word} (exit {data.get('exit_code', rc)})"
    runtime = [f for f in data.get("findings") or [] if f.get("source") != "lint" and f.get("severity") == "error"]
    runtime = runtime or [f for f in data.get("findings") or [] if f.get("source") != "lint"]
    if runtime:
        f = runtime[0]
        loc = f.get("location") or {}
        where = f" at {Path(str(loc.get('path'))).name}:{loc.get('line')}" if loc.get("path") else ""
        ranks = f", rank{'s' if len(f.get('ranks') or []) > 1 else ''} {', '.join(map(str, f['ranks']))}" \
            if f.get("ranks") else ""
        s += f" - {f.get('code')} {f.get('name')}{where}{ranks}"
    return s


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    con = make_console(sys.stdout, {"auto": None, "always": True, "never": False}[args.color])
    try:
        from ddp_doctor.demo import SCRIPTS, script_source
    except ImportError as exc:  # pragma: no cover - broken install
        print(f"ddp-doctor demo: the demo scripts are missing from this install: {exc}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print("ddp-doctor demo needs torch (CPU is enough): pip install torch", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ddp-doctor-demo-"))
    from ddp_doctor.report.files import refuse_unwritable, save_reports, write_atomic

    try:
        out.mkdir(parents=True, exist_ok=True)
        scripts = {}
        for which, name in SCRIPTS.items():
            scripts[which] = out / name
            write_atomic(scripts[which], script_source(which))
    except OSError as exc:
        print(f"ddp-doctor demo: cannot write into --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    refused = refuse_unwritable("ddp-doctor demo", {"--out": str(out / "buggy-report.json")})
    if refused:
        print(refused, file=sys.stderr)
        return 2

    t0 = time.monotonic()
    con.rule("ddp-doctor demo", characters="=")
    con.print("The bug of seed 000: rank 0 validates through the DDP-wrapped model (which has BatchNorm), "
              "the other rank does not.\nEvery DDP forward broadcasts the BatchNorm buffers, so rank 0 issues "
              "collectives rank 1 never issues: on NCCL the next epoch hangs; on gloo the ranks' collectives "
              "pair up wrongly (desync) until the job dies.")
    con.print(f"Scripts and reports: {out}\n")

    con.rule("1/3  lint the buggy script (before spending a GPU)")
    lint_findings = _lint(con, scripts["buggy"])

    try:
        importlib.import_module("ddp_doctor.cli.run")
    except ImportError:
        con.print("\n`ddp-doctor run` is not part of this build; the demo cannot launch the ranks.", style="bold red")
        return 1

    results = {}
    for step, which in (("2/3", "buggy"), ("3/3", "fixed")):
        con.rule(f"{step}  run the {which} script on 2 ranks under ddp-doctor")
        report = out / f"{which}-report.json"
        rc, data = _run(con, scripts[which], report, args.hang_timeout)
        html = None
        if data and not args.no_html:
            from ddp_doctor.report.snippets import attach_snippets
            saved = save_reports(attach_snippets(data), None, str(out / f"{which}-report.html"))[0]
            html = Path(saved.path) if saved.path else None
            if not saved.ok:
                con.print(saved.notice(), markup=False, highlight=False)
        results[which] = (rc, data, report if data else None, html)
        con.print()

    con.rule("summary", characters="=")
    b_rc, b_data, _, _ = results["buggy"]
    f_rc, f_data, _, _ = results["fixed"]
    if lint_findings:
        codes = ", ".join(sorted({f"{f['code']} (line {(f.get('location') or {}).get('line')})" for f in lint_findings}))
        con.print(f"lint  train_buggy.py: {codes}")
    con.print(f"buggy train_buggy.py: {_summary(b_data, b_rc)}")
    con.print(f"fixed train_fixed.py: {_summary(f_data, f_rc)}")
    con.print("the fix (one line):  validate(model, val_loader)  ->  validate(model.module, val_loader)")
    con.print(f"files in {out}:")
    for which in ("buggy", "fixed"):
        _, _, rep, html = results[which]
        for p in (scripts[which], rep, html):
            if p:
                con.print(f"  {p}")
    b_html = results["buggy"][3]
    if b_html:
        con.print(f"open in a browser:   {b_html.resolve().as_uri()}")
    con.print(f"re-render a report:  ddp-doctor report {out / 'buggy-report.json'} --html buggy.html")
    con.print(f"(demo took {time.monotonic() - t0:.0f} s)")
    diagnosed = bool(b_data) and b_data.get("verdict") != "ok" and b_rc != 0
    clean = bool(f_data) and f_data.get("verdict") == "ok" and f_rc == 0
    if not (diagnosed and clean):
        con.print("the demo did not go as expected: see the output above", style="bold red")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
