"""``ddp-doctor run [--hang-timeout S] [--report PATH] [--html PATH] [torchrun options] SCRIPT [ARGS...]``.

A drop-in for torchrun.  This module only parses the command line (ddp-doctor's own options before
the script, torchrun's for the rest); :class:`ddp_doctor.session.Job` runs the job.  Exit code: the
job's own when it is healthy (also after a stall it came out of, or ended in by itself); non-zero when
ddp-doctor diagnosed a failure; 1 when it stopped the job (a proof, the process group's timeout ahead, or
a stall with ``--stop-on-stall``).
"""
from __future__ import annotations

import sys
from typing import Any

OWN_USAGE = """usage: ddp-doctor run [--hang-timeout S] [--stop-on-stall] [--report PATH] [--html PATH] [--no-lint]
                      [--watch-port PORT] [--watch-group N] [torchrun options] SCRIPT|-m MODULE [ARGS...]

ddp-doctor options (before the script; everything else is torchrun's):
  --hang-timeout S   diagnose a stall when no rank shows a sign of life for S seconds (default 90):
                     the diagnosis is printed and written, and the job keeps running
  --stop-on-stall    stop the job at that limit (exit 1) instead of watching on
  --report PATH      write the JSON report (ddp-doctor/report/v1) to PATH
  --html PATH        write the HTML report to PATH
  --no-lint          do not lint the script before launching
  --watch-port PORT  port of the side-channel store (multi-node; default: rdzv port + 1)
  --watch-group N    a tree of watchers (very large jobs): nodes report to a leader per N nodes, the
                     leaders to the root (docs/scale.md); each node hosts a group store on PORT + 1
  --stop-grace S     seconds between SIGTERM and SIGKILL when stopping the job (default 3)
"""

OWN_VALUE_OPTS = {"--hang-timeout", "--report", "--html", "--watch-port", "--watch-group", "--stop-grace"}
OWN_FLAGS = {"--no-lint", "--quiet", "--stop-on-stall"}


def split_argv(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Separate ddp-doctor's options from torchrun's (ours are recognised before the script only)."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    no_value = set()
    for action in parser._actions:
        if action.nargs == 0:
            no_value.update(action.option_strings)
    own: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name, eq, val = tok.partition("=")
        if name in OWN_VALUE_OPTS:
            if eq:
                own[name] = val
                i += 1
            else:
                if i + 1 >= len(argv):
                    raise SystemExit(f"ddp-doctor run: {name} needs a value")
                own[name] = argv[i + 1]
                i += 2
            continue
        if tok in OWN_FLAGS:
            own[tok] = True
            i += 1
            continue
        if not tok.startswith("-") or tok == "--":
            rest += argv[i:]
            break
        rest.append(tok)
        if tok in ("-m", "--module"):
            i += 1
            rest += argv[i:]
            break
        if eq or tok in no_value:
            i += 1
        else:
            if i + 1 < len(argv):
                rest.append(argv[i + 1])
            i += 2
    return own, rest



def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(OWN_USAGE)
        print("torchrun options: see `torchrun --help`.")
        return 0 if argv else 2
    from ddp_doctor import launch

    own, rest = split_argv(argv)
    from ddp_doctor.report.files import refuse_unwritable

    refused = refuse_unwritable("ddp-doctor run", {"--report": own.get("--report"), "--html": own.get("--html")})
    if refused:  # before any rank runs: a diagnosis with nowhere to go is found out now, not at the end
        print(refused, file=sys.stderr)
        return 2
    try:
        args = launch.parse_torchrun_args(rest)
    except SystemExit as e:
        return 2 if e.code else 0
    from ddp_doctor.session import Job

    return Job(own, args, argv).run()
