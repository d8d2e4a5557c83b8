"""Run a tests/fixes/scripts/ script on N real gloo ranks (forked by _launch.py) with a deadline."""
import json
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"


@dataclass
class RankRun:
    code: int
    rank_codes: list
    stdout: str
    stderr: str

    def results(self) -> dict:
        """{rank: obj} from the last line 'RESULT <rank> <json>' each rank printed."""
        out = {}
        for line in self.stdout.splitlines():
            if line.startswith("RESULT "):
                _, r, payload = line.split(" ", 2)
                out[int(r)] = json.loads(payload)
        return out


def free_port() -> int:
    for _ in range(100):
        port = random.randint(31000, 31999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 31000-31999")


def run_ranks(script: str, *args: str, nprocs: int = 2, timeout: float = 30.0, preload: str = "") -> RankRun:
    """Run tests/fixes/scripts/<script> on `nprocs` real gloo ranks (forked), killed after `timeout` s."""
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DDPD_PRELOAD=preload)
    cmd = [sys.executable, str(HERE / "_launch.py"), str(nprocs), str(free_port()), str(timeout),
           str(HERE / "scripts" / script), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 30)
    codes = []
    for line in p.stdout.splitlines():
        if line.startswith("RANKCODES "):
            codes = json.loads(line.split(" ", 1)[1])
    return RankRun(p.returncode, codes, p.stdout, p.stderr)
