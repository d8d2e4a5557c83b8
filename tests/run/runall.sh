#!/bin/bash
# dev helper: run scripts concurrently, print verdict/findings
cd /work/wt/run
for s in "$@"; do
  (timeout 150 env PYTHONPATH=src /work/venv/bin/python -m ddp_doctor run --quiet --report /tmp/rr_$s.json --nproc-per-node 2 tests/run/scripts/$s.py >/tmp/rr_$s.log 2>&1; echo "$s rc=$?" ) &
done
wait
for s in "$@"; do /work/venv/bin/python -c "
import json,sys;r=json.load(open('/tmp/rr_$s.json'))
print('==','$s',r['verdict'],r['exit_code'],r.get('detection'),r['duration_s'],r.get('leftover_pids'))
for f in r['findings']: print('  ',f['code'],f['severity'],f['ranks'],(f['location'] or {}).get('line'),f['message'][:400])
"; done
