"""Both ranks issue an all_reduce with async_op=True; rank 1 issues it 1.5 s late.

Run under ``ddp-doctor run``: rank 0 checks, from inside the job, that the probe keeps the
collective issued (in_collective) until its work completes, then leaves it (last_collective)."""
import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
out = {}
t = torch.ones(4)
if rank == 1:
    time.sleep(1.5)
work = dist.all_reduce(t, async_op=True)  # the issuing line
if rank == 0:
    from ddp_doctor.probe import hooks
    from ddp_doctor.probe.publisher import snapshot

    st = snapshot(hooks.REC)
    out["issued"] = st.in_collective.to_json() if st.in_collective else None
    out["completed_early"] = work.is_completed()
work.wait()
if rank == 0:
    st = snapshot(hooks.REC)
    out["after_wait"] = st.in_collective.to_json() if st.in_collective else None
    out["last"] = st.last_collective.to_json() if st.last_collective else None
    out["sum"] = t.tolist()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
dist.barrier()
dist.destroy_process_group()
