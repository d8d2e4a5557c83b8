"""``ddp-doctor attach [PID ...]``: diagnose a running (hung) job started without ddp-doctor."""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor attach", description=(
        "Find the training processes on this node (or the given PIDs: a rank, a DataLoader worker or the "
        "launcher), read every thread's Python stack with py-spy without stopping them, and say which rank is "
        "not where the others are, at which line, and what to change. Never stops the job unless --stop."))
    p.add_argument("pids", nargs="*", type=int, metavar="PID")
    p.add_argument("--report", metavar="PATH", help="write the JSON report (ddp-doctor/report/v1; on several "
                   "nodes, merge with `ddp-doctor report a.json b.json`)")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report")
    p.add_argument("--samples", type=int, default=3, help="stack samples per process (default 3)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--stop", action="store_true", help="after diagnosing, stop the job (SIGTERM its launcher, "
                   "then SIGKILL after 3 s)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ddp_doctor.attach import AttachError, attach, stop_job
    from ddp_doctor.report.files import refuse_unwritable, save_reports

    refused = refuse_unwritable("ddp-doctor attach", {"--report": args.report, "--html": args.html})
    if refused:
        print(refused, file=sys.stderr)
        return 2

    try:
        report = attach(args.pids or None, samples=args.samples, interval_s=args.interval)
    except AttachError as e:
        print(f"ddp-doctor attach: {e}", file=sys.stderr)
        return 2
    from ddp_doctor.report.snippets import attach_snippets

    attach_snippets(report)
    for key, path in (("report_path", args.report), ("html_path", args.html)):
        if path:
            report[key] = path
    saved = save_reports(report, args.report, args.html)
    for s in saved:
        key = "html_path" if s.what == "HTML report" else "report_path"
        if s.path:
            report[key] = s.path  # "written: ..." names where it really went
        else:
            report.pop(key, None)
    from ddp_doctor.report.terminal import print_report

    print_report(report, color={"auto": None, "always": True, "never": False}[args.color])
    for s in saved:
        if not s.ok:
            print(s.notice(), file=sys.stderr)
    if args.stop:
        how = stop_job(report)
        print("stopped: " + ", ".join(f"{pid} ({h})" for pid, h in sorted(how.items())))
    return int(report["exit_code"])
