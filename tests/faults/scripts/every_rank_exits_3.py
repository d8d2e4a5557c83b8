"""Every rank ends with sys.exit(3) after a barrier (a scheduler-meaningful code: requeue, give up...)."""
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
sys.exit(3)
