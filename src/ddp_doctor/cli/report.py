"""``ddp-doctor report REPORT.json [--html PATH] [--format text|json]``: re-render a saved report.

Also ``report a.json b.json ...`` (merge the per-node reports of ``ddp-doctor attach``) and
``report --flight-recorder DIR`` (diagnose PyTorch Flight Recorder dumps, one per rank).
"""
from __future__ import annotations

import argparse
import sys

from ddp_doctor.report import CHECK_SCHEMA_ID
from ddp_doctor.report.validate import validate


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor report", description="Re-render a saved ddp-doctor JSON report "
                                "(from `ddp-doctor run --report`, `ddp-doctor check --report` or "
                                "`ddp-doctor lint --format json`).")
    p.add_argument("report", metavar="REPORT.json", nargs="*", help="a saved report; several `ddp-doctor attach` "
                   "reports (one per node) are merged into one diagnosis of the whole job")
    p.add_argument("--flight-recorder", metavar="DIR", help="diagnose the PyTorch Flight Recorder dumps in DIR "
                   "(one file per rank, e.g. from TORCH_FR_DUMP_TEMP_FILE) instead of reading a report")
    p.add_argument("--output", "-o", metavar="PATH", help="write the (merged / Flight Recorder) report as JSON")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML page")
    p.add_argument("--format", choices=("text", "json"), default="text", help="terminal output (default: text)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--no-snippets", action="store_true", help="do not read source files for snippets")
    return p


def _load(path: str, lean: bool = False, timelines: bool = True) -> dict | None:
    """A validated report, or None after saying why on stderr (one line: odd input never gives a traceback).
    ``lean``: only what rendering shows is kept of long timelines (``report.load``)."""
    from ddp_doctor.report.load import TooLarge, load
    from ddp_doctor.report.safe import MAX_DEPTH, clean_text, depth

    try:
        data = load(path, lean=lean, timelines=timelines)
    except TooLarge as exc:
        print(f"ddp-doctor report: {exc}", file=sys.stderr)
        return None
    except OSError as exc:
        print(f"ddp-doctor report: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"ddp-doctor report: {path} is not JSON: {exc}", file=sys.stderr)
        return None
    except RecursionError:
        print(f"ddp-doctor report: {path} is nested too deeply to be a report", file=sys.stderr)
        return None
    if depth(data) > MAX_DEPTH:
        print(f"ddp-doctor report: {path} is nested deeper than {MAX_DEPTH} levels: not a ddp-doctor report",
              file=sys.stderr)
        return None
    problems = validate(data, limit=3)
    if problems:  # one line: the file and its first problems, first first
        print(f"ddp-doctor report: {path} is not a ddp-doctor report: {clean_text('; '.join(problems))}",
              file=sys.stderr)
        return None
    return data


def _gather(args) -> dict | None:
    """The report to show: one file, several attach reports merged, or Flight Recorder dumps diagnosed."""
    if args.flight_recorder:
        if args.report:
            print("ddp-doctor report: give either REPORT.json files or --flight-recorder DIR", file=sys.stderr)
            return None
        from ddp_doctor.flightrec import FlightRecorderError, dumps_report, read_dir

        try:
            return dumps_report(args.flight_recorder, read_dir(args.flight_recorder))
        except FlightRecorderError as exc:
            print(f"ddp-doctor report: {exc}", file=sys.stderr)
            return None
    if not args.report:
        print("ddp-doctor report: give a REPORT.json (or several attach reports, or --flight-recorder DIR)",
              file=sys.stderr)
        return None
    lean = len(args.report) == 1 and args.format == "text" and not args.output  # only rendered, never re-written
    loaded = [_load(p, lean, timelines=bool(args.html)) for p in args.report]
    if any(d is None for d in loaded):
        return None
    if len(loaded) == 1:
        return loaded[0]
    from ddp_doctor.attach.merge import MergeError, merge

    try:
        return merge(loaded, list(args.report))
    except MergeError as exc:
        print(f"ddp-doctor report: {exc}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ddp_doctor.report.files import refuse_unwritable

    refused = refuse_unwritable("ddp-doctor report", {"--output": args.output, "--html": args.html})
    if refused:
        print(refused, file=sys.stderr)
        return 2
    data = _gather(args)
    if data is None:
        return 2
    what = args.flight_recorder or " ".join(args.report)
    try:
        return _render(args, data)
    except BrokenPipeError:  # `... | head`
        return 0
    except Exception as exc:  # odd but schema-valid input: one clear line, never a traceback
        from ddp_doctor.report.safe import clean_text

        print(f"ddp-doctor report: cannot render {what}: {type(exc).__name__}: {clean_text(str(exc))[:200]}",
              file=sys.stderr)
        return 2


def _render(args: argparse.Namespace, data: dict) -> int:
    from ddp_doctor.report.files import save_reports

    failed = [s for s in save_reports(data, args.output, None) if not s.ok]
    if not args.no_snippets:
        from ddp_doctor.report.snippets import attach_snippets
        attach_snippets(data)
    if args.format == "json":
        from ddp_doctor.report import report_json

        try:
            sys.stdout.write(report_json(data))
            sys.stdout.flush()
        except BrokenPipeError:  # `... | head`
            return 0
    else:
        color = {"auto": None, "always": True, "never": False}[args.color]
        if data.get("schema") == CHECK_SCHEMA_ID:
            from ddp_doctor.report.check_view import print_check
            from ddp_doctor.report.terminal import make_console
            print_check(data, console=make_console(sys.stdout, color))
        else:
            from ddp_doctor.report.terminal import print_report
            print_report(data, color=color)
    if args.html:
        html = save_reports(data, None, args.html)[0]
        if html.ok:
            print(f"HTML report: {args.html}", file=sys.stderr if args.format == "json" else sys.stdout)
        else:
            failed.append(html)
    for s in failed:
        print(s.notice(), file=sys.stderr)
    return 2 if failed else 0
