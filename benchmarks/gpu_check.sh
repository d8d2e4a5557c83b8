#!/usr/bin/env bash
# Real-GPU checks of ddp-doctor in one run (issue 26): on one GPU, no network, under 8 minutes.
#
#   PYTHON=python3 bash benchmarks/gpu_check.sh OUTDIR          # on a GPU machine (OUTDIR or $OUT)
#   bash benchmarks/gpu_check.sh --cpu-dry-run OUTDIR           # here and in CI: every step's CPU variant
#   bash benchmarks/gpu_check.sh --steps tests,ddp401 OUTDIR    # only some steps (a rerun of what failed)
#
# Steps, each under its own time limit (timeout), run in order; a failing step does not stop the others:
#   env       the GPU's name (NVML, nvidia-smi), torch / CUDA / NCCL versions
#   tests     the real-GPU tests (pytest -m gpu): NVML, the CUDA prefetcher, the probe under NCCL with world
#             size 1, 2 ranks sharing the GPU over gloo with CUDA tensors (NCCL refuses 2 ranks per GPU)
#   overhead  the probe's per-collective cost under NCCL (benchmarks/overhead.py --backend nccl --nproc 1)
#   prefetch  CUDAPrefetcher's speed-up on a loader-bound loop (benchmarks/data_wait.py --device cuda)
#   check     ddp-doctor check --nproc-per-node 1 on the GPU
#   ddp401    a data-bound job under ddp-doctor run (DDP401) with the GPU utilisation NVML reports, and its
#             fed twin (no DDP401)
# OUTDIR gets summary.txt (pass/fail per step, one line of figures each), summary.json (every figure),
# log.txt (every step's output) and artefacts.tar.gz (the steps' JSON).  Exit 1 if any step failed.
# --cpu-dry-run runs the same steps on the CPU with tiny sizes (the GPU tests then skip visibly): it checks
# the script, and none of its figures is a GPU figure.
# Python: $PYTHON, else .venv/bin/python, else python3; the code is taken from src/ (PYTHONPATH), not installed.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

DRY=0
ONLY=""
OUTDIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-dry-run) DRY=1 ;;
        --steps) ONLY="${2:-}"; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) OUTDIR="$1" ;;
    esac
    shift
done
OUTDIR="${OUTDIR:-${OUT:-}}"
if [ -z "$OUTDIR" ]; then
    echo "gpu_check.sh: give the output folder as argument (or set OUT)" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUTDIR" && OUTDIR="$(cd "$OUTDIR" && pwd)" || exit 2
cd "$ROOT" || exit 2

if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi
if ! "$PY" -c 'import sys' 2>/dev/null; then
    echo "gpu_check.sh: no working Python at '$PY' (set PYTHON)" >&2
    exit 2
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STARTED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/status.tsv"
rm -f "$OUTDIR/summary.txt" "$OUTDIR/summary.json" "$OUTDIR/log.txt" "$OUTDIR/artefacts.tar.gz"

# the test files holding the gpu-marked tests (tests/perf/test_gpu_check.py checks that none is missing)
GPU_TEST_FILES="tests/perf/test_perf_gpu.py tests/perf/test_perf_gpu_e2e.py tests/fixes/test_prefetcher.py tests/run/test_probe_gpu.py"
H=benchmarks/gpu_check.py
if [ "$DRY" = 1 ]; then
    MODE=cpu-dry-run
    # name | limit (s) | command; the limits only guard against a hang on a loaded box
    STEPS=(
        "env|60|$PY $H env $WORK/env.json --dry-run"
        "tests|90|$PY $H tests $WORK/tests.json --dry-run $GPU_TEST_FILES"
        "overhead|90|$PY benchmarks/overhead.py --backend gloo --nproc 1 --reps 1 --n 50 --steps 30 --variants a_doctor --micro-calls 2000 --json $WORK/overhead.json"
        "prefetch|60|$PY benchmarks/data_wait.py --device cpu --prefetch-only --prefetch-samples 128 --prefetch-side 8 --prefetch-batch 16 --prefetch-workers 0 --prefetch-epochs 1 --json $WORK/prefetch.json"
        "check|90|$PY $H check $WORK/check.json --dry-run --timeout 80"
        "ddp401|90|$PY $H starved $WORK/ddp401.json --dry-run --device cpu --seconds 0.5 --min-steps 15 --width 8 --batch 4 --delay 0.05 --no-control --timeout 80"
    )
else
    MODE=gpu
    # limits add up to 445 s (+ 5 s each to kill): the run stays under 8 minutes even if every step runs out of time
    STEPS=(
        "env|20|$PY $H env $WORK/env.json"
        "tests|125|$PY $H tests $WORK/tests.json $GPU_TEST_FILES"
        "overhead|135|$PY benchmarks/overhead.py --backend nccl --nproc 1 --reps 3 --n 2000 --steps 300 --variants a_torchrun,a_doctor,b_torchrun,b_doctor --json $WORK/overhead.json"
        "prefetch|45|$PY benchmarks/data_wait.py --device cuda --prefetch-only --json $WORK/prefetch.json"
        "check|45|$PY $H check $WORK/check.json --timeout 40"
        "ddp401|75|$PY $H starved $WORK/ddp401.json --device cuda --seconds 8 --timeout 36"
    )
fi

selected() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
NAMES=",$(for spec in "${STEPS[@]}"; do printf '%s,' "${spec%%|*}"; done)"
for want in ${ONLY//,/ }; do
    if [[ "$NAMES" != *",$want,"* ]]; then
        echo "gpu_check.sh: no step '$want' (steps: ${NAMES:1:-1})" >&2
        exit 2
    fi
done

# run_step NAME LIMIT COMMAND: the command's output, exit code and seconds go to $WORK/NAME.{log,rc,secs}
run_step() {
    local name="$1" limit="$2" cmd="$3" t0 rc
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086  # the command line is split on purpose
    timeout -k 5 "$limit" $cmd >"$WORK/$name.log" 2>&1
    rc=$?
    echo "$rc" >"$WORK/$name.rc"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }' >"$WORK/$name.secs"
    echo "$name: exit $rc ($(cat "$WORK/$name.secs") s)"
}

echo "gpu_check: mode $MODE, python $PY, output $OUTDIR" | tee "$OUTDIR/log.txt"
for spec in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$spec"
    selected "$name" || continue
    if [ "$DRY" = 1 ]; then
        # nothing is timed in a dry run: two steps at a time (more only crowd a small CPU box)
        [ "$(jobs -rp | wc -l)" -lt 2 ] || wait -n
        run_step "$name" "$limit" "$cmd" &
    else
        run_step "$name" "$limit" "$cmd"  # one at a time: the figures are timings
    fi
done
wait

FAILED=0
for spec in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$spec"
    if ! selected "$name"; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" not-selected 0 "$limit" 0 >>"$WORK/status.tsv"
        continue
    fi
    rc=$(cat "$WORK/$name.rc" 2>/dev/null || echo 255)
    secs=$(cat "$WORK/$name.secs" 2>/dev/null || echo 0)
    case $rc in
        0) status=pass ;;
        124|137) status=timeout ;;
        *) status=fail ;;
    esac
    [ "$status" = pass ] || FAILED=1
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$limit" "$rc" >>"$WORK/status.tsv"
    { echo; echo "===== $name: $status (exit $rc, ${secs} s of ${limit} s): $cmd"; cat "$WORK/$name.log"; } >>"$OUTDIR/log.txt"
done

{
    echo "gpu_check $MODE, started $STARTED, python $PY"
    [ "$DRY" = 1 ] && echo "CPU dry run: the steps were checked on the CPU; nothing here was measured on a GPU"
    printf '%-10s %-13s %8s %6s %5s\n' step status seconds limit exit
    while IFS=$'\t' read -r name status secs limit rc; do
        printf '%-10s %-13s %8s %6s %5s\n' "$name" "$status" "$secs" "$limit" "$rc"
    done <"$WORK/status.tsv"
    [ "$FAILED" = 0 ] && echo "ALL STEPS PASSED" || echo "SOME STEPS FAILED: see log.txt"
} >"$OUTDIR/summary.txt"
if ! "$PY" $H summary "$WORK" "$OUTDIR" --mode "$MODE" --started-at "$STARTED" >>"$OUTDIR/log.txt" 2>&1; then
    echo "summary.json could not be written: see log.txt" >>"$OUTDIR/summary.txt"
    FAILED=1
fi
(cd "$WORK" && tar -czf "$OUTDIR/artefacts.tar.gz" ./*.json ./*.log 2>/dev/null)
cat "$OUTDIR/summary.txt"
exit "$FAILED"
