"""Synthetic per-rank evidence in the probe's format (the wire form of ddp_doctor.evidence.RankState)."""


def rank_state(rank, *, steps=50, data=0.01, compute=0.02, coll=0.005, jitter=0.0, host="node0",
               num_workers=0, persistent=False, epoch_start=None, epochs=1, site_line=12, ddp=None,
               world=2, timeline=True):
    tl = []
    t = 1.0
    step_times, waits = [], []
    for k in range(steps):
        d = data * (1 + (jitter if k % 2 else -jitter))
        c = compute
        w = coll
        tl.append({"t": round(t, 6), "kind": "data_wait", "dur": d, "label": f"loader 0 batch {k + 1}"})
        tl.append({"t": round(t + d + c, 6), "kind": "collective", "dur": w, "label": "ddp.backward(allreduce_grads)"})
        dur = d + c + w
        tl.append({"t": round(t, 6), "kind": "step", "dur": dur, "label": f"step {k + 2}"})
        step_times.append(dur)
        waits.append(d)
        t += dur
    site = {"path": "/job/train.py", "line": site_line, "function": "main"}
    loader = {"site": site, "len": steps // epochs, "num_workers": num_workers, "pin_memory": False,
              "persistent_workers": persistent, "prefetch_factor": 2 if num_workers else None, "batch_size": 32,
              "epochs": epochs, "batches": steps, "data_wait_s": sum(waits),
              "epoch_start_s": list(epoch_start or []), "batch_wait_s": waits[-200:],
              "steps_by_epoch": [steps // epochs] * epochs, "sampler": None, "worker_pids": []}
    total = sum(step_times)
    return {
        "rank": rank, "local_rank": rank, "host": host, "pid": 1000 + rank, "world_size": world, "t": t,
        "epoch": epochs - 1, "step": steps, "step_in_epoch": steps // epochs, "forwards": steps, "backwards": steps,
        "progress": 3 * steps, "steps_by_epoch": [steps // epochs] * epochs, "train_loader": 0,
        "step_times": step_times[-200:],
        "timing": {"steps": steps, "step_time_s": total, "data_wait_s": sum(waits), "compute_s": compute * steps,
                   "collective_s": coll * steps},
        "loaders": [loader], "ddp": ddp or [], "collectives": {"count": steps, "time_s": coll * steps},
        "timeline": tl if timeline else [], "stack": [], "exc": None, "done": True,
    }


def evidence(*states, cpu_count=8):
    return {"world_size": len(states), "wall_s": 10.0, "reason": "ok",
            "ranks": {s["rank"]: s for s in states}, "machine": {"cpu_count": cpu_count}}
