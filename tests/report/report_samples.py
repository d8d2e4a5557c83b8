"""Hand-written report dicts that follow the report/v1 contract and the agreed extensions.

Used before (and beside) real reports from ``ddp-doctor run``.
"""
from __future__ import annotations

import copy

TRAIN = "/home/user/project/train.py"
TORCH = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def _timeline(steps: int, step_dur: float, wait: float, t0: float = 0.0, epochs: int = 1, stop_at: float | None = None,
              stop_label: str = "") -> list[dict]:
    ev, t = [], t0
    for e in range(epochs):
        ev.append({"t": round(t, 4), "kind": "epoch", "dur": 0, "label": f"epoch {e}"})
        for s in range(steps):
            ev.append({"t": round(t, 4), "kind": "data_wait", "dur": wait, "label": f"batch {s}"})
            t += wait
            ev.append({"t": round(t, 4), "kind": "step", "dur": step_dur, "label": f"step {s}"})
            ev.append({"t": round(t + step_dur * 0.6, 4), "kind": "collective", "dur": step_dur * 0.3,
                       "label": "all_reduce (DDP gradients)"})
            t += step_dur
    if stop_at is not None:
        ev.append({"t": stop_at, "kind": "stop", "dur": 0, "label": stop_label})
    return ev


def hang_report() -> dict:
    """Seed 000: validation through the DDP model on rank 0 only; hangs in epoch 1."""
    return {
        "schema": "ddp-doctor/report/v1",
        "verdict": "hang",
        "exit_code": 1,
        "world_size": 2,
        "command": ["ddp-doctor", "run", "--nproc-per-node", "2", "train.py"],
        "started_at": "2026-11-23T09:30:00Z",
        "duration_s": 14.2,
        "hang_timeout_s": 5,
        "findings": [{
            "code": "DDP202", "name": "ddp-forward-on-subset-of-ranks", "severity": "error",
            "title": "DDP model called on only some ranks",
            "message": "Rank 0 ran 12 more DDP forwards than rank 1 (validation through the DDP model on rank 0 only); "
                       "their buffer broadcasts paired with rank 1's gradient all-reduces and the job hung in epoch 1.",
            "ranks": [0],
            "location": {"path": TRAIN, "line": 41, "function": "validate",
                         "snippet": {"start": 39, "lines": ["    model.eval()", "    for x, y in val_loader:",
                                                           "        out = model(x)", "        loss += F.mse_loss(out, y)",
                                                           "    model.train()"]}},
            "evidence": {"ddp_forwards": {"0": 52, "1": 40}, "collective_seq": {"0": 93, "1": 81}},
            "fix": "Evaluate model.module (the unwrapped model) on rank 0, or run validation on every rank.",
            "source": "runtime",
        }],
        "lint": {"path": TRAIN, "findings": [
            {"code": "DDP406", "name": "batchnorm-without-syncbn", "severity": "info",
             "title": "BatchNorm in a DDP model without SyncBatchNorm", "message": "Model has BatchNorm1d but is not "
             "converted with SyncBatchNorm.", "ranks": [], "location": {"path": TRAIN, "line": 22, "function": "main"},
             "evidence": {}, "fix": "nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP.", "source": "lint"},
            {"code": "DDP202", "name": "ddp-forward-on-subset-of-ranks", "severity": "error",
             "title": "DDP model called on only some ranks", "message": "validate() calls the DDP model and runs under "
             "`if rank == 0`.", "ranks": [], "location": {"path": TRAIN, "line": 41, "function": "validate"},
             "evidence": {}, "fix": "Evaluate model.module on rank 0.", "source": "lint"},
        ]},
        "ranks": [
            {"rank": 0, "state": "in_collective", "epoch": 1, "step": 0,
             "last_collective": {"op": "all_reduce", "seq": 93, "shape": [1025], "dtype": "float32"},
             "stack": [{"path": TRAIN, "line": 80, "function": "<module>"}, {"path": TRAIN, "line": 63, "function": "main"},
                       {"path": "/usr/lib/python3/site-packages/torch/_tensor.py", "line": 626, "function": "backward"}],
             "exit_code": None, "signal": None, "host": "node1", "pid": 4242, "local_rank": 0,
             "timing": {"steps": 20, "step_time_s": 4.0, "data_wait_s": 0.4, "compute_s": 2.4, "collective_s": 1.2},
             "timeline": _timeline(10, 0.18, 0.02, epochs=1) + [
                 {"t": 2.0, "kind": "epoch", "dur": 0, "label": "epoch 1"},
                 {"t": 2.05, "kind": "step", "dur": 0.1, "label": "step 0"},
                 {"t": 2.1, "kind": "collective", "dur": 12.1, "label": "all_reduce #93"},
                 {"t": 14.2, "kind": "stop", "dur": 0, "label": "hung in all_reduce"}]},
            {"rank": 1, "state": "in_collective", "epoch": 1, "step": 1,
             "last_collective": {"op": "broadcast", "seq": 81, "shape": [16], "dtype": "float32"},
             "stack": [{"path": TRAIN, "line": 80, "function": "<module>"}, {"path": TRAIN, "line": 58, "function": "main"},
                       {"path": "/usr/lib/python3/site-packages/torch/nn/parallel/distributed.py", "line": 1600,
                        "function": "forward"}],
             "exit_code": None, "signal": None, "host": "node1", "pid": 4243, "local_rank": 0,
             "workers": [{"pid": 4300, "stack": [{"path": "/usr/lib/python3.11/multiprocessing/queues.py", "line": 113,
                                                   "function": "get"}]}],
             "timing": {"steps": 21, "step_time_s": 3.9, "data_wait_s": 0.5, "compute_s": 2.2, "collective_s": 1.1},
             "timeline": _timeline(10, 0.17, 0.03, epochs=1) + [
                 {"t": 2.0, "kind": "epoch", "dur": 0, "label": "epoch 1"},
                 {"t": 2.3, "kind": "collective", "dur": 11.9, "label": "broadcast #81"},
                 {"t": 14.2, "kind": "stop", "dur": 0, "label": "hung in broadcast"}]},
        ],
    }


def desync_report() -> dict:
    return {
        "schema": "ddp-doctor/report/v1", "verdict": "desync", "exit_code": 1, "world_size": 2, "duration_s": 3.4,
        "findings": [{
            "code": "DDP203", "name": "collective-mismatch", "severity": "error",
            "title": "Ranks call different collectives at the same point",
            "message": "At collective #7 rank 0 called all_gather(shape [4, 3]) and rank 1 all_gather(shape [4, 2]).",
            "ranks": [0, 1], "location": {"path": TRAIN, "line": 30, "function": "gather_preds"},
            "evidence": {"seq": 7, "rank0": "all_gather float32[4, 3]", "rank1": "all_gather float32[4, 2]"},
            "fix": "Pad to a common shape (or all_gather_object) so every rank passes the same shape.",
            "source": "runtime"}],
        "ranks": [
            {"rank": r, "state": "crashed", "epoch": 0, "step": 6, "last_collective": {"op": "all_gather", "seq": 7},
             "stack": [{"path": TRAIN, "line": 30, "function": "gather_preds"}], "exit_code": 1, "signal": None,
             "timeline": _timeline(6, 0.3, 0.05, stop_at=3.4, stop_label="gloo::EnforceNotMet")}
            for r in (0, 1)],
    }


def ok_perf_report() -> dict:
    ranks = []
    for r, (wait, dur) in enumerate([(0.06, 0.05), (0.06, 0.05), (0.06, 0.05), (0.06, 0.12)]):
        n = 30
        ranks.append({"rank": r, "state": "finished", "epoch": 1, "step": n, "last_collective": None, "stack": [],
                      "exit_code": 0, "signal": None,
                      "timing": {"steps": n * 2, "step_time_s": 2 * n * (wait + dur), "data_wait_s": 2 * n * wait,
                                 "compute_s": 2 * n * dur * 0.7, "collective_s": 2 * n * dur * 0.3},
                      "timeline": _timeline(n, dur, wait, epochs=2)})
    return {
        "schema": "ddp-doctor/report/v1", "verdict": "ok", "exit_code": 0, "world_size": 4, "duration_s": 10.3,
        "findings": [
            {"code": "DDP401", "name": "data-bound", "severity": "warning", "title": "Training waits on the data loader",
             "message": "Ranks 0-2 spend 55% of each step waiting for the next batch.", "ranks": [0, 1, 2],
             "location": {"path": TRAIN, "line": 18, "function": "main"},
             "evidence": {"data_wait_pct": {"0": 55, "1": 54, "2": 55, "3": 33}, "num_workers": 0},
             "fix": "DataLoader(num_workers=4, pin_memory=True, persistent_workers=True).", "source": "runtime"},
            {"code": "DDP404", "name": "straggler-rank", "severity": "warning",
             "title": "One rank is consistently slower than the others",
             "message": "Rank 3's compute per step is 2.4x the median.", "ranks": [3], "location": None,
             "evidence": {"median_step_s": 0.11, "rank3_step_s": 0.18}, "fix": "Check rank 3's host.",
             "source": "runtime"}],
        "ranks": ranks,
    }


def lint_only_report() -> dict:
    return {
        "schema": "ddp-doctor/report/v1", "verdict": "ok", "exit_code": 1, "world_size": 0, "ranks": [],
        "findings": [
            {"code": "DDP201", "name": "rank-conditional-collective", "severity": "error",
             "title": "Collective reached by only some ranks", "message": "dist.barrier() runs only under `if rank == 0`.",
             "ranks": [], "location": {"path": TRAIN, "line": 12, "function": "main"}, "evidence": {},
             "fix": "Call barrier() on every rank.", "source": "lint"},
            {"code": "DDP102", "name": "sampler-epoch-not-set", "severity": "warning",
             "title": "DistributedSampler.set_epoch() is never called", "message": "sampler is iterated each epoch "
             "without set_epoch(epoch).", "ranks": [], "location": {"path": TRAIN, "line": 20, "function": None},
             "evidence": {}, "fix": "sampler.set_epoch(epoch) at the top of each epoch.", "source": "lint"}],
    }


XSS = "<script>alert(1)</script><img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"


def xss_report() -> dict:
    r = hang_report()
    f = r["findings"][0]
    f["message"] = "bad " + XSS + " </script><script>document.body.setAttribute('data-pwned','2')</script>"
    f["location"]["path"] = "/tmp/" + XSS + ".py"
    f["location"]["snippet"]["lines"][2] = "        out = model(x)  # " + XSS
    f["evidence"]["note"] = XSS
    f["fix"] = XSS
    r["command"] = ["ddp-doctor", "run", XSS]
    r["ranks"][0]["state"] = XSS
    r["ranks"][0]["stack"][1]["function"] = XSS
    r["ranks"][0]["timeline"].append({"t": 1.0, "kind": "step", "dur": 0.1, "label": XSS})
    r["lint"]["path"] = XSS
    return r


def restarted_report() -> dict:
    """--max-restarts 1: attempt 0 crashed (rank 1 raised), torch's agent restarted, attempt 1 finished."""
    rep = ok_perf_report()
    rep["findings"] = []
    rep["attempt"] = 1
    rep["restarts"] = [{
        "attempt": 0, "verdict": "crash",
        "findings": [{"code": "DDP204", "name": "rank-exited", "severity": "error",
                      "title": "A rank exited while the others wait",
                      "message": "Rank 1 raised OSError: stale file handle at train.py:52 (load_batch).",
                      "ranks": [1], "location": {"path": TRAIN, "line": 52, "function": "load_batch"},
                      "evidence": {"exception": {"type": "OSError"}}, "fix": "Fix the exception on that line.",
                      "source": "runtime"}],
        "ranks": [{"rank": r, "state": "crashed" if r == 1 else "stopped", "epoch": 0, "step": 5,
                   "last_collective": None, "stack": [], "exit_code": 1, "signal": None} for r in range(4)]}]
    return rep


ALL = {"hang": hang_report, "desync": desync_report, "ok_perf": ok_perf_report, "lint_only": lint_only_report}


def get(name: str) -> dict:
    return copy.deepcopy(ALL[name]())
