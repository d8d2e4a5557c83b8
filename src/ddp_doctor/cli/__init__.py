"""``ddp-doctor`` command line: one module per subcommand, each with ``main(argv) -> int``.

Subcommand modules are imported only when chosen, so ``ddp-doctor lint`` never
pays for (or needs) torch.
"""
from __future__ import annotations

import importlib
import sys

from ddp_doctor.version import __version__

# name -> (module under ddp_doctor.cli, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "lint": ("lint", "statically check training code for distributed pitfalls"),
    "explain": ("explain", "show the documentation page of a finding code"),
    "run": ("run", "launch like torchrun, watch every rank, diagnose hangs and desyncs"),
    "check": ("check", "pre-flight self-test of the environment and every rank's links"),
    "attach": ("attach", "diagnose a running (hung) job started without ddp-doctor: which rank, which line"),
    "report": ("report", "re-render or merge saved JSON reports, or read Flight Recorder dumps"),
    "demo": ("demo", "run a shipped buggy 2-rank job, diagnose it, then run the fixed one"),
}

USAGE = "usage: ddp-doctor [--version] {" + ",".join(SUBCOMMANDS) + "} ..."


def _help() -> str:
    lines = [USAGE, "", "subcommands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines.append("\nRun 'ddp-doctor SUBCOMMAND --help' for its options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; exit codes: 0 ok, 1 findings/failure, 2 usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"ddp-doctor {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"{USAGE}\nddp-doctor: error: unknown subcommand {name!r}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"ddp_doctor.cli.{SUBCOMMANDS[name][0]}")
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # a `pip install ddp-doctor` without the runtime extra: say what to install
        hint = MISSING.get((e.name or "").split(".")[0])
        if hint is None:
            raise
        print(f"ddp-doctor {name}: needs {hint}", file=sys.stderr)
        return 2


# what a subcommand needs when an optional dependency is missing (lint and explain need none of them)
MISSING = {
    "torch": ("PyTorch, which is not installed in this Python (" + sys.executable + "): "
              "pip install 'ddp-doctor[run]'  (or install the torch build for your CUDA from https://pytorch.org)"),
}
