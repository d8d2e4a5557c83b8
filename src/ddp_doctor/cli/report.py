"""``ddp-doctor report REPORT.json [--html PATH] [--format text|json]``: re-render a saved report."""
from __future__ import annotations

import argparse
import json
import sys

from ddp_doctor.report import LINT_JSON_SCHEMA, LINT_SCHEMA_ID, REPORT_JSON_SCHEMA


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor report", description="Re-render a saved ddp-doctor JSON report "
                                "(from `ddp-doctor run --report` or `ddp-doctor lint --format json`).")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML page")
    p.add_argument("--format", choices=("text", "json"), default="text", help="terminal output (default: text)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--no-snippets", action="store_true", help="do not read source files for snippets")
    return p


def validate(data: object) -> list[str]:
    """Problems that make ``data`` not a report (empty when it is one)."""
    if not isinstance(data, dict):
        return ["the top level is not a JSON object"]
    schema = LINT_JSON_SCHEMA if data.get("schema") == LINT_SCHEMA_ID else REPORT_JSON_SCHEMA
    try:
        import jsonschema
    except ImportError:  # jsonschema is a test extra; check the contract's required keys by hand
        return [f"missing key {k!r}" for k in schema["required"] if k not in data] or \
            ([f"schema is {data.get('schema')!r}"] if data.get("schema") not in (LINT_SCHEMA_ID, "ddp-doctor/report/v1") else [])
    validator = jsonschema.Draft7Validator(schema)
    errs = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in errs[:10]]


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        with open(args.report, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        print(f"ddp-doctor report: cannot read {args.report}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"ddp-doctor report: {args.report} is not JSON: {exc}", file=sys.stderr)
        return 2
    problems = validate(data)
    if problems:
        print(f"ddp-doctor report: {args.report} is not a ddp-doctor report:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 2
    if not args.no_snippets:
        from ddp_doctor.report.snippets import attach_snippets
        attach_snippets(data)
    if args.format == "json":
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from ddp_doctor.report.terminal import print_report
        print_report(data, color={"auto": None, "always": True, "never": False}[args.color])
    if args.html:
        from ddp_doctor.report.html import write_html
        try:
            write_html(data, args.html)
        except OSError as exc:
            print(f"ddp-doctor report: cannot write {args.html}: {exc}", file=sys.stderr)
            return 2
        print(f"HTML report: {args.html}", file=sys.stderr if args.format == "json" else sys.stdout)
    return 0
