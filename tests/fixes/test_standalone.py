"""ddp_doctor.fixes stands alone: importing it pulls in nothing else of ddp-doctor (nor rich/psutil; torch itself imports pynvml)."""
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_fixes_import_alone():
    code = ("import sys; import ddp_doctor.fixes; "
            "bad = sorted(m for m in sys.modules if (m.startswith('ddp_doctor') and not m.startswith('ddp_doctor.fixes')"
            " and m not in ('ddp_doctor', 'ddp_doctor.version')) or m.split('.')[0] in ('rich', 'psutil')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
