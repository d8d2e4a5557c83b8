"""``ddp-doctor explain [CODE]``: print a finding code's page (what it does, why it is bad, example, use instead)."""
from __future__ import annotations

import sys
from importlib import resources

from ddp_doctor.findings import CATALOGUE


def page(code: str) -> str:
    return resources.files("ddp_doctor").joinpath("pages", f"{code}.md").read_text(encoding="utf-8")


def _static_codes() -> set[str]:
    from ddp_doctor.lint.rules import RULE_CODES
    return set(RULE_CODES)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: ddp-doctor explain [CODE]\n\nPrint the page of a finding code (e.g. DDP201); "
              "without a code, list every code.")
        return 0
    if not argv:
        static = _static_codes()
        print(f"{'code':<7} {'severity':<8} {'lint':<4} {'name':<36} title")
        for code, entry in CATALOGUE.items():
            print(f"{code:<7} {entry.severity.value:<8} {'yes' if code in static else '-':<4} "
                  f"{entry.name:<36} {entry.title}")
        print("\nRun 'ddp-doctor explain CODE' for a code's page.")
        return 0
    if len(argv) > 1:
        print("usage: ddp-doctor explain [CODE]", file=sys.stderr)
        return 2
    code = argv[0].strip().upper()
    if code not in CATALOGUE:
        # accept the kebab-case name too
        by_name = {e.name: c for c, e in CATALOGUE.items()}
        code = by_name.get(argv[0].strip().lower(), code)
    if code not in CATALOGUE:
        print(f"ddp-doctor explain: unknown code {argv[0]!r}; run 'ddp-doctor explain' for the list",
              file=sys.stderr)
        return 2
    try:
        text = page(code)
    except (FileNotFoundError, OSError):
        entry = CATALOGUE[code]
        text = f"# {code} {entry.name}\n\n{entry.title}\n"
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
