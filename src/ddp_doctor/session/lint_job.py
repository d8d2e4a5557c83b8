"""lint of the training script for a watcher inside a rank (``ddp_doctor.watch()``), run beside the job.

``ddp-doctor run`` lints the script before launching; the embedded watcher cannot (the job has started), and
linting in rank 0's own process would take its interpreter lock from the training thread.  So rank 0 starts
one low-priority child process (``python -m ddp_doctor.session.lint_job SCRIPT``) when its watcher starts,
and the report takes what it printed, if it has finished by then: the same lint-assisted decision lines as
``run`` (the `continue` lint located, the rank-conditional side of a mismatch).  ``DDP_DOCTOR_NO_LINT=1``
skips it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

WAIT_S = 10.0  # at most this long, at report time, for a lint still running


class LintJob:
    """A lint of one script running in a child process; its findings once it has finished."""

    def __init__(self, script: str | None):
        self.proc: subprocess.Popen | None = None
        if not script or not script.endswith(".py") or not os.path.isfile(script) \
                or os.environ.get("DDP_DOCTOR_NO_LINT", "") not in ("", "0"):
            return
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "ddp_doctor.session.lint_job", script],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                         preexec_fn=lambda: os.nice(10), close_fds=True)
        except (OSError, ValueError):
            self.proc = None

    def findings(self, wait_s: float = WAIT_S) -> list:
        """lint's findings (``Finding``), or none when it failed or has not finished within ``wait_s``."""
        if self.proc is None:
            return []
        from ddp_doctor.findings import Finding

        try:
            out, _ = self.proc.communicate(timeout=wait_s)
            return [Finding.from_report_dict(d) for d in json.loads(out or b"[]")] if self.proc.returncode == 0 else []
        except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            self.proc.kill()
            return []


def main(argv: list[str]) -> int:
    from ddp_doctor.lint import lint_paths

    findings = [f.to_report_dict() for f in lint_paths(argv[:1]).findings]
    sys.stdout.write(json.dumps(findings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
