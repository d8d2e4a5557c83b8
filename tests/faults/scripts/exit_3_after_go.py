"""Every rank says it started (a file per rank under MARK_DIR), waits for GO_FILE, then ends with sys.exit(3)."""
import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
mark = os.environ.get("MARK_DIR")
if mark:
    open(os.path.join(mark, f"started-{dist.get_rank()}"), "w").close()
go = os.environ.get("GO_FILE")
while go and not os.path.exists(go):
    time.sleep(0.05)
dist.barrier()
sys.exit(3)
