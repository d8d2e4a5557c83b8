"""``ddp-doctor lint``: static checks of training code.  Exit 0: clean, 1: findings or unreadable files, 2: usage."""
from __future__ import annotations

import argparse
import os
import sys

from ddp_doctor.findings import CATALOGUE, Severity

EPILOG = """\
examples:
  ddp-doctor lint train.py
  ddp-doctor lint --select DDP1,DDP2 --format github src/
  ddp-doctor lint --fix train.py          # DDP103, DDP301, DDP403
  ddp-doctor explain DDP201

Configuration: [tool.ddp-doctor] in the nearest pyproject.toml (select, ignore, exclude, fail-on).
Suppress one line with `# noqa: DDP201` (or a bare `# noqa`).
"""


def _codes(value: str) -> list[str]:
    return [v.strip().upper() for v in value.replace(" ", ",").split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor lint", description=__doc__.split("\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (default: .)")
    p.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text")
    p.add_argument("--select", type=_codes, default=None, metavar="CODES",
                   help="comma-separated codes or prefixes to report (e.g. DDP1,DDP201)")
    p.add_argument("--ignore", type=_codes, default=None, metavar="CODES",
                   help="comma-separated codes or prefixes not to report")
    p.add_argument("--exclude", action="append", default=None, metavar="GLOB",
                   help="skip files/directories matching this glob (repeatable)")
    p.add_argument("--fail-on", choices=("error", "warning", "info"), default=None,
                   help="lowest severity that makes the exit code 1 (default: warning, or the config's)")
    p.add_argument("--fix", action="store_true", help="apply the safe fixes (DDP103, DDP301, DDP403) in place")
    p.add_argument("--config", default=None, metavar="PYPROJECT", help="read [tool.ddp-doctor] from this file")
    p.add_argument("--no-config", action="store_true", help="ignore pyproject.toml")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write the report to FILE")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    return p


def _check_codes(codes: list[str] | None, flag: str) -> str | None:
    for c in codes or []:
        if c == "ALL":
            continue
        if not any(code.startswith(c) for code in CATALOGUE):
            return f"{flag}: {c!r} matches no finding code (codes look like DDP201; prefixes like DDP2 work)"
    return None


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: 0 for --help, 2 for usage errors
        return int(e.code or 0)
    from ddp_doctor.lint import engine, output
    from ddp_doctor.lint.config import Config, ConfigError, load_config

    paths = args.paths or ["."]
    for flag, codes in (("--select", args.select), ("--ignore", args.ignore)):
        msg = _check_codes(codes, flag)
        if msg:
            print(f"ddp-doctor lint: error: {msg}", file=sys.stderr)
            return 2
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        print(f"ddp-doctor lint: error: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        cfg = Config() if args.no_config else load_config(paths, args.config)
    except ConfigError as e:
        print(f"ddp-doctor lint: error: {e}", file=sys.stderr)
        return 2
    for flag, codes in (("select", cfg.select), ("ignore", cfg.ignore)):
        msg = _check_codes(codes, f"{cfg.path} {flag}")
        if msg:
            print(f"ddp-doctor lint: error: {msg}", file=sys.stderr)
            return 2
    select = args.select if args.select is not None else (cfg.select or None)
    ignore = (args.ignore or []) + cfg.ignore
    exclude = (args.exclude or []) + cfg.exclude
    fail_on = Severity(args.fail_on or cfg.fail_on)

    result = engine.lint_paths(paths, select=select, ignore=ignore or None, exclude=exclude)
    fixed = 0
    if args.fix and result.fixes:
        from ddp_doctor.lint.fix import apply_fixes
        fixed, notes = apply_fixes(result.fixes, select=select, ignore=ignore or None)
        for note in notes:
            print(note, file=sys.stderr)
        # report what is left
        result = engine.lint_paths(paths, select=select, ignore=ignore or None, exclude=exclude)

    if args.format == "text":
        color = args.color == "always" or (args.color == "auto" and not args.output and sys.stdout.isatty()
                                           and "NO_COLOR" not in os.environ)
        text = output.format_text(result, color=color, fixed=fixed)
    else:
        text = output.FORMATTERS[args.format](result)
    from ddp_doctor.utf8 import readable

    text = readable(text)  # a file name that is not UTF-8: shown as \xNN (JSON and SARIF carry it escaped too)
    if args.output:
        from ddp_doctor.atomic import write_atomic

        try:
            write_atomic(args.output, text)  # whole or not at all (a CI step may read it as it lands)
        except OSError as exc:
            print(f"ddp-doctor lint: could not write {args.output} ({exc.strerror or exc})", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    failing = [f for f in result.findings if f.severity.rank >= fail_on.rank]
    return 1 if failing or result.errors else 0
