"""2-rank checks of agree / skip_if_nonfinite / EarlyStopping / gather_variable / rank_zero_first / load_checkpoint.

usage: cures.py CASE [CASE...] --tmp DIR   (the cases run one after the other in one process group)
"""
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_doctor import fixes

p = argparse.ArgumentParser()
p.add_argument("cases", nargs="+")
p.add_argument("--tmp", default="")
a = p.parse_args()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()


def nan(fix):
    # rank 1 sees a NaN loss at step 3; the classic rank-local skip desyncs, skip_if_nonfinite does not
    model = DDP(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = skipped = 0
    for i in range(6):
        loss = model(torch.ones(1, 2)).sum()
        if rank == 1 and i == 3:
            loss = loss * float("nan")
        if (fixes.skip_if_nonfinite(loss) if fix else not torch.isfinite(loss)):
            skipped += 1
            continue
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    t = torch.tensor([float(steps)])
    dist.all_reduce(t)
    return {"steps": steps, "skipped": skipped, "total": float(t)}


def agree():
    return {"any": fixes.agree(rank == 1), "all": fixes.agree(rank == 1, "all"), "all_true": fixes.agree(True, "all"),
            "tensor_any": fixes.agree(torch.tensor([False, rank == 0]))}


def early():
    # validation metric on each rank's shard: rank 0's stops improving at epoch 2, rank 1's keeps improving
    stopper = fixes.EarlyStopping(patience=2, mode="min", reduce=None)
    epoch = 0
    for epoch in range(10):
        metric = (1.0 / (epoch + 1)) if rank == 1 else (1.0 if epoch >= 2 else 2.0 - epoch)
        if stopper.step(metric):
            break
    mean_stopper = fixes.EarlyStopping(patience=1)
    stops = [mean_stopper.step(torch.tensor(v)) for v in ([3.0, 2.0, 2.0, 2.0] if rank == 0 else [1.0, 1.0, 1.0, 1.0])]
    return {"stopped_at": epoch, "mean_stops": stops, "best": mean_stopper.best}


def gather():
    x = torch.arange((3 + 2 * rank) * 2, dtype=torch.float32).reshape(3 + 2 * rank, 2)
    parts = fixes.gather_variable(x)
    cat = fixes.gather_variable(x, cat=True)
    ragged = fixes.gather_variable(torch.ones(2 + rank, 1 + rank, dtype=torch.int64))
    try:
        fixes.gather_variable(torch.ones(2) if rank == 0 else torch.ones(2, 2))
        mismatch = None
    except ValueError as e:
        mismatch = str(e)
    return {"shapes": [list(t.shape) for t in parts], "cat": cat.shape[0], "sum": float(cat.sum()),
            "ragged": [list(t.shape) for t in ragged], "ragged_sum": int(sum(t.sum() for t in ragged)),
            "mismatch": mismatch}


def rzf(case):
    marker = os.path.join(a.tmp, case + ".prepared")
    order = []
    try:
        with fixes.rank_zero_first():
            if case == "rzf_fail" and rank == 0:
                raise OSError("download failed")
            if case == "rzf_fail_other" and rank == 1:
                raise OSError("disk full on rank 1")
            if rank == 0:
                open(marker, "w").write("x")
            order.append(os.path.exists(marker))
        outcome = "ok"
    except fixes.RankZeroFailed as e:
        outcome = "RankZeroFailed: " + str(e)
    except OSError as e:
        outcome = "OSError: " + str(e)
    return {"outcome": outcome, "saw_marker": order}


def ckpt():
    path = os.path.join(a.tmp, "ck.pt")
    m = DDP(torch.nn.Linear(2, 2))  # on every rank (DDP construction is a collective)
    if rank == 0:
        torch.save({"model": m.state_dict(), "epoch": 3}, path)  # keys saved with the 'module.' prefix
    dist.barrier()
    ck = fixes.load_checkpoint(path)
    torch.nn.Linear(2, 2).load_state_dict(ck["model"])
    return {"keys": sorted(ck["model"]), "device": str(ck["model"]["weight"].device), "epoch": ck["epoch"],
            "local_device": str(fixes.local_device())}


CASES = {"nan": lambda: nan(False), "nan_fix": lambda: nan(True), "agree": agree, "early": early, "gather": gather,
         "rzf_ok": lambda: rzf("rzf_ok"), "rzf_fail": lambda: rzf("rzf_fail"),
         "rzf_fail_other": lambda: rzf("rzf_fail_other"), "ckpt": ckpt}
results = {}
for case in a.cases:
    results[case] = CASES[case]()
    print("RESULT", rank, json.dumps(results), flush=True)  # partial results survive a crash
dist.destroy_process_group()
