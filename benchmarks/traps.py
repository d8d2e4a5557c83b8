"""The trap generator: correct-but-suspicious training jobs, composed at random, that `ddp-doctor run` must
leave alone (verdict ok, exit 0, no correctness warning).

Each job is one program built from a random choice of patterns that real, correct jobs have and that look
like the bugs ddp-doctor hunts: extra loader passes on one rank (a peek, sample predictions, a no_grad pass
over the training loader), DDP's Join over map-style or iterable data with workers (and ZeRO), `no_sync`
accumulation with an agreed count, object collectives in an agreed order, all_to_all with per-rank split
sizes, groups created in the same order, a subgroup's collective called by its non-members too, a rank busy or idle below the limit, ranks finishing at different
times, rank-zero-only saving, a rank-local optimizer, FSDP2 with every rank evaluating; and, in about one job in
five, a rank that waits on a peer outside the job for longer than the limit (a service's slow reply, a child
process, a file another rank writes later, a FIFO fed late: ``OUTSIDE``) under a short ``--hang-timeout``, where
the stall is a diagnosis and never a stop.  A generated job that
is stopped, or warned about, is a bug in the mechanism: fix the mechanism, never exclude the pattern.

    PYTHONPATH=src python benchmarks/traps.py [--jobs 200] [--seed 0] [--parallel 2] [--keep DIR]
    PYTHONPATH=src python benchmarks/traps.py --show SEED     # print the program of one seed

It prints one line per job and a table (jobs, stopped, warned, by pattern); tests/run/test_traps.py runs a
fixed sample of it in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# correctness codes: a warning or error of these on a correct job is a false positive
CORRECTNESS = ("DDP1", "DDP2", "DDP5")


@dataclass
class Program:
    """A generated job: its patterns, world size and source text."""
    seed: int
    nproc: int
    patterns: list[str]
    source: str
    doctor: list[str] = field(default_factory=list)  # ddp-doctor run options (a short --hang-timeout)


@dataclass
class Outcome:
    program: Program
    exit_code: int
    verdict: str | None
    bad: list[str] = field(default_factory=list)   # findings that must not be there
    perf: list[str] = field(default_factory=list)  # performance advice (reported, not counted)
    seconds: float = 0.0
    # torch itself aborted a rank at exit after its program had finished (gloo's teardown race, seen under
    # plain torchrun too: pytorch#190489): ddp-doctor stopped nothing and its report says so
    torch_teardown: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return (self.exit_code != 0 or self.verdict != "ok") and not self.torch_teardown


# -- the patterns ------------------------------------------------------------------------------------
# Each pattern adds lines to some of the program's sections; MODES say which training loop it needs.
# Sections: setup (after the model), epoch (at each epoch's end, every rank), after (after training).

def _peek(r: random.Random, w: int) -> dict:
    who = r.randrange(w)
    return {"setup": [f"if rank == {who}:", "    xb, _ = next(iter(local_loader))", "    print('batch', tuple(xb.shape))"]}


def _sample_preds(r: random.Random, w: int) -> dict:
    who, k = r.randrange(w), r.randint(1, 4)
    return {"epoch": [f"if rank == {who}:", "    with torch.no_grad():",
                      "        for j, (xb, yb) in enumerate(local_loader):",
                      f"            if j >= {k}:", "                break",
                      "            acc = (net(xb).argmax(1) == yb).float().mean().item()",
                      "    print('sample accuracy', acc)"]}


def _nograd_pass(r: random.Random, w: int) -> dict:
    who = r.randrange(w)
    return {"epoch": [f"if rank == {who}:", "    with torch.no_grad():",
                      "        total = sum(net(xb).sum().item() for xb, _ in local_loader)"]}


def _metric_allreduce(r: random.Random, w: int) -> dict:
    return {"epoch": ["m = torch.tensor([float(epoch + rank)])", "dist.all_reduce(m)"]}


def _objects(r: random.Random, w: int) -> dict:
    # the root spelled differently per rank (named, positional, torch's default of 0): one root for torch, and
    # a tensor broadcast from the last rank; the root rule must see one root in each
    return {"epoch": ["got = [None] * world", "dist.all_gather_object(got, {'rank': rank, 'n': list(range(rank + 1))})",
                      "cfg = [{'lr': 0.05, 'epoch': epoch}] if rank == 0 else [None]",
                      "dist.broadcast_object_list(cfg, 0) if rank % 2 else dist.broadcast_object_list(cfg)",
                      "dist.gather_object({'r': rank}, [None] * world if rank == 0 else None, "
                      "**({'dst': 0} if rank % 2 else {}))",
                      "last = torch.tensor([float(rank)])", "dist.broadcast(last, src=world - 1)"]}


def _all_to_all(r: random.Random, w: int) -> dict:
    return {"epoch": ["send = [(rank * 3 + j + epoch) % 4 + 1 for j in range(world)]",
                      "counts = torch.empty(world, dtype=torch.long)",
                      "dist.all_to_all_single(counts, torch.tensor(send))",
                      "recv = counts.tolist()",
                      "tokens = torch.empty(sum(recv), 8)",
                      "dist.all_to_all_single(tokens, torch.randn(sum(send), 8), output_split_sizes=recv, "
                      "input_split_sizes=send)"]}


def _groups(r: random.Random, w: int) -> dict:
    return {"setup": ["evens = dist.new_group(list(range(0, world, 2)))",
                      "odds = dist.new_group(list(range(1, world, 2)))"],
            "epoch": ["g = torch.ones(2)", "dist.all_reduce(g, group=evens if rank % 2 == 0 else odds)"]}


def _non_member_calls(r: random.Random, w: int) -> dict:
    """Every rank calls the evens' all_reduce; on the odd ranks, not members, torch skips it with a warning."""
    return {"setup": ["evens_only = dist.new_group(list(range(0, world, 2)))"],
            "epoch": ["e = torch.ones(2)", "dist.all_reduce(e, group=evens_only)"]}


def _twin_groups(r: random.Random, w: int) -> dict:
    """Two groups of the same ranks (Megatron's gloo twin): every step all-reduces on one while a metrics thread
    all-reduces on the other at its own pace, so the two interleave differently on each rank (keyed by
    their ranks alone, the two groups' sequences merged and such jobs were stopped)."""
    n, pause = r.randint(10, 40), r.choice((0.001, 0.003, 0.01))
    return {"setup": ["import threading",
                      "twin_a = dist.new_group(list(range(world)))",
                      "twin_b = dist.new_group(list(range(world)))",
                      "def _metrics():",
                      f"    for _ in range({n}):",
                      "        dist.all_reduce(torch.ones(1), group=twin_b)",
                      f"        time.sleep({pause} * (1 + rank))",
                      "metrics = threading.Thread(target=_metrics)",
                      "metrics.start()"],
            "step": ["dist.all_reduce(torch.ones(3), group=twin_a)"],
            "after": ["metrics.join()"]}


def _busy(r: random.Random, w: int) -> dict:
    who, s = r.randrange(w), r.choice((2, 4, 6))
    return {"epoch": [f"if rank == {who} and epoch == 0:", "    t0 = time.time()",
                      f"    while time.time() - t0 < {s}:", "        torch.randn(128, 128) @ torch.randn(128, 128)",
                      "dist.barrier()"]}


def _idle(r: random.Random, w: int) -> dict:
    who, s = r.randrange(w), r.choice((3, 6, 12))
    return {"epoch": [f"if rank == {who} and epoch == 0:", f"    time.sleep({s})  # waiting on a remote service",
                      "dist.barrier()"]}


def _save_rank0(r: random.Random, w: int) -> dict:
    return {"epoch": ["if rank == 0:", "    torch.save(net.state_dict(), os.path.join(OUT, f'ckpt{epoch}.pt'))",
                      "dist.barrier()"]}


def _local_optimizer(r: random.Random, w: int) -> dict:
    who = r.randrange(w)
    return {"setup": [f"probe = nn.Linear(16, 2) if rank == {who} else None",
                      "probe_opt = torch.optim.SGD(probe.parameters(), lr=0.01) if probe is not None else None"],
            "step": ["if probe is not None:", "    probe_opt.zero_grad()",
                     "    nn.functional.cross_entropy(probe(xb), yb).backward()", "    probe_opt.step()"]}


def _finish_late(r: random.Random, w: int) -> dict:
    who, s = r.randrange(w), r.choice((2, 5))
    return {"after": [f"if rank == {who}:", f"    time.sleep({s})  # exporting",
                      "    torch.save(net.state_dict(), os.path.join(OUT, 'final.pt'))"]}


# a rank waits on a peer outside the job for longer than the limit (drawn apart from the patterns: see
# generate); each kind's lines go to the epoch section, at epoch 0
OUTSIDE = "outside_wait"
OUTSIDE_LIMIT_S = 6


def _outside(r: random.Random, w: int) -> tuple[str, list[str]]:
    who, s = r.randrange(w), OUTSIDE_LIMIT_S + r.choice((3, 5))
    other = (who + 1) % w
    kinds = {
        "reply": [f"if rank == {who} and epoch == 0:",
                  "    import socket, threading",
                  "    srv = socket.create_server(('127.0.0.1', 0))",
                  "    def answer():",
                  "        c, _ = srv.accept()",
                  "        c.recv(64)",
                  f"        time.sleep({s})",
                  "        c.sendall(b'ok')",
                  "        c.close()",
                  "    threading.Thread(target=answer, daemon=True).start()",
                  "    with socket.create_connection(srv.getsockname()) as conn:",
                  "        conn.sendall(b'score?')",
                  "        conn.recv(64)  # a remote service's slow reply"],
        "child": [f"if rank == {who} and epoch == 0:",
                  "    import subprocess",
                  f"    subprocess.run(['sleep', '{s}'])  # a converter"],
        "file": ["if epoch == 0:",
                 "    flag = os.path.join(OUT, 'exported')",
                 f"    if rank == {who}:",
                 "        while not os.path.exists(flag):",
                 "            time.sleep(0.5)",
                 f"    elif rank == {other}:",
                 f"        time.sleep({s})",
                 "        open(flag, 'w').close()"],
        "fifo": [f"if rank == {who} and epoch == 0:",
                 "    import tempfile, threading",
                 "    fifo = os.path.join(tempfile.mkdtemp(), 'feed')",
                 "    os.mkfifo(fifo)",
                 "    def feed():",
                 f"        time.sleep({s})",
                 "        with open(fifo, 'wb') as f:",
                 "            f.write(b'records')",
                 "    threading.Thread(target=feed, daemon=True).start()",
                 "    with open(fifo, 'rb') as f:",
                 "        f.read()"],
    }
    kind = r.choice(sorted(kinds))
    return kind, kinds[kind] + ["dist.barrier()"]


PATTERNS = {
    "peek": _peek, "sample_preds": _sample_preds, "nograd_pass": _nograd_pass, "metric_allreduce": _metric_allreduce,
    "objects": _objects, "all_to_all": _all_to_all, "groups": _groups, "busy": _busy, "idle": _idle,
    "save_rank0": _save_rank0, "local_optimizer": _local_optimizer, "finish_late": _finish_late,
    "non_member_calls": _non_member_calls, "twin_groups": _twin_groups,
}
# training loops: plain DDP, no_sync accumulation, DDP's Join over uneven data (map-style / iterable with
# workers / with ZeRO), FSDP2 (fully_shard) with every rank evaluating, accelerate's Accelerator and Lightning
# Fabric (under torchrun: they adopt its process group and shard the loader themselves)
MODES = ("ddp", "no_sync", "join_map", "join_iterable", "join_zero", "fsdp2", "accelerate", "fabric")
FRAMEWORKS = ("accelerate", "fabric")  # the framework prepares the model, the optimizer and the loader

HEADER = '''\
import datetime, os, time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

OUT = os.environ.get("TRAP_OUT", ".")


class Shards(IterableDataset):
    """This rank's shard streams: a different number of samples on each rank."""

    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        g = torch.Generator().manual_seed(self.rank)
        for i in range(self.n):
            x = torch.randn(16, generator=g)
            if i % nw == wid:
                yield x, int(x[0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED + rank)
'''


def generate(seed: int, nproc: int | None = None) -> Program:
    """One correct job from ``seed``: a mode, 1-4 patterns, 2-4 ranks."""
    r = random.Random(seed)
    w = nproc or r.choice((2, 2, 3, 4))
    mode = r.choice(MODES)
    join = mode.startswith("join")
    pool = sorted(PATTERNS)
    if join:  # inside Join only DDP's own collectives are shadowed: other patterns run outside the loop
        pool.remove("local_optimizer")
        pool.remove("twin_groups")  # a step's own collective: uneven under Join
    if mode == "fsdp2":  # a sharded model's forward is collective: no rank-local pass through it
        pool = [p for p in pool if p not in ("sample_preds", "nograd_pass", "peek")]
    chosen = r.sample(pool, r.randint(1, 4))
    parts: dict[str, list[str]] = {"setup": [], "step": [], "epoch": [], "after": []}
    for name in chosen:
        for sec, lines in PATTERNS[name](r, w).items():
            parts[sec] += lines
    # an outside wait, drawn from a generator of its own (the jobs of every seed stay as they were otherwise)
    r2, doctor = random.Random(seed * 7919 + 1), []
    if r2.random() < 0.2:
        kind, lines = _outside(r2, w)
        parts["epoch"] += lines
        chosen = [*chosen, f"{OUTSIDE}:{kind}"]
        doctor = ["--hang-timeout", str(OUTSIDE_LIMIT_S)]
    epochs = r.choice((2, 3))
    body = [HEADER.replace("SEED", str(seed % 1000))]
    add = body.append
    if mode == "join_iterable":
        workers = r.choice((0, 2))
        add(f"    ds = Shards(rank, {r.randint(40, 70)} + 9 * rank)")
        add(f"    loader = DataLoader(ds, batch_size=8, num_workers={workers})")
    elif join:
        add(f"    n = {r.randint(60, 100)} + 16 * rank  # this rank's own shard: uneven by design")
        add("    x = torch.randn(n, 16)")
        add("    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8, shuffle=True)")
    elif mode in FRAMEWORKS:
        add("    x = torch.randn(256, 16)")
        add("    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8, shuffle=True)")
        # a prepared loader's iteration is collective (accelerate broadcasts its RNG state): one rank's own
        # passes go over a plain loader of the same data
        add("    local_loader = DataLoader(loader.dataset, batch_size=8)")
    else:
        add("    x = torch.randn(256, 16)")
        add("    ds = TensorDataset(x, (x[:, 0] > 0).long())")
        add("    sampler = DistributedSampler(ds, seed=1)")
        add(f"    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers={r.choice((0, 0, 2))})")
    if mode not in FRAMEWORKS:
        add("    local_loader = loader  # one rank's extra passes go over the training loader itself")
    add("    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))")
    if mode == "fsdp2":
        add("    from torch.distributed.fsdp import fully_shard")
        add("    for layer in net:")
        add("        if isinstance(layer, nn.Linear):")
        add("            fully_shard(layer)")
        add("    model = fully_shard(net)")
    elif mode == "accelerate":
        add("    from accelerate import Accelerator")
        add("    accelerator = Accelerator(cpu=True)")
        add("    model, opt, loader = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), loader)")
    elif mode == "fabric":
        add("    from lightning.fabric import Fabric")
        add("    fabric = Fabric(accelerator='cpu', strategy='ddp', devices=world)")
        add("    fabric.launch()  # under torchrun: adopts its ranks")
        add("    model, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.05))")
        add("    loader = fabric.setup_dataloaders(loader)")
    else:
        add("    model = DDP(net)")
    if mode in FRAMEWORKS:
        pass
    elif mode == "join_zero":
        add("    from torch.distributed.optim import ZeroRedundancyOptimizer")
        add("    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)")
    else:
        add("    opt = torch.optim.SGD(model.parameters(), lr=0.05)")
    acc = r.choice((2, 4))
    for line in parts["setup"]:
        add("    " + line)
    add(f"    for epoch in range({epochs}):")
    if mode in FRAMEWORKS:
        add("        loader.sampler.set_epoch(epoch) if hasattr(loader.sampler, 'set_epoch') else None")
    elif not join:
        add("        sampler.set_epoch(epoch)")
    if mode == "join_zero":
        add("        from torch.distributed.algorithms.join import Join")
        add("        ctx = Join([model, opt])")
    else:
        add("        ctx = model.join() if %s else nullcontext()" % join)
    add("        with ctx:")
    add("            for i, (xb, yb) in enumerate(loader):")
    if mode == "no_sync":
        add(f"                last = (i + 1) % {acc} == 0 or i + 1 == len(loader)  # the same count on every rank")
        add("                with (nullcontext() if last else model.no_sync()):")
        add("                    nn.functional.cross_entropy(model(xb), yb).backward()")
        add("                if last:")
        add("                    opt.step()")
        add("                    opt.zero_grad()")
    else:
        backward = {"accelerate": "accelerator.backward", "fabric": "fabric.backward"}.get(mode)
        add("                opt.zero_grad()")
        add("                loss = nn.functional.cross_entropy(model(xb), yb)")
        add(f"                {backward}(loss)" if backward else "                loss.backward()")
        add("                opt.step()")
    for line in parts["step"]:
        add("                " + line)
    if mode == "fsdp2":  # every rank evaluates the sharded model
        add("        with torch.no_grad():")
        add("            model(torch.randn(8, 16)).sum()")
    for line in parts["epoch"]:
        add("        " + line)
    if mode == "accelerate":  # the framework's own rank-zero-only forms
        add("        accelerator.wait_for_everyone()")
        add("        if accelerator.is_main_process:")
        add("            torch.save(accelerator.unwrap_model(model).state_dict(), os.path.join(OUT, 'acc.pt'))")
    elif mode == "fabric":
        add("        fabric.barrier()")
        add("        if fabric.global_rank == 0:")
        add("            fabric.print('epoch', epoch, 'done')")
    for line in parts["after"]:
        add("    " + line)
    add("    dist.barrier()")
    add("    dist.destroy_process_group()")
    add("")
    add("")
    add('if __name__ == "__main__":')
    add("    main()")
    return Program(seed, w, [mode, *chosen], "\n".join(body) + "\n", doctor)


def run(p: Program, workdir: Path, timeout: float = 300.0) -> Outcome:
    """Run one generated job under `ddp-doctor run` and judge its report."""
    d = workdir / f"trap{p.seed}"
    d.mkdir(parents=True, exist_ok=True)
    script, report = d / "job.py", d / "report.json"
    script.write_text(p.source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", TRAP_OUT=str(d))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--report", str(report), *p.doctor,
                          "--nproc-per-node", str(p.nproc), str(script)], cwd=d, env=env, timeout=timeout,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Outcome(p, res.returncode, None, seconds=time.monotonic() - t0)
    (d / "output.txt").write_text(res.stdout)  # the ranks' own output, kept with --keep
    try:
        rep = json.loads(report.read_text())
    except (OSError, ValueError) as e:
        out.bad.append(f"no report ({e}); output tail: {res.stdout[-800:]}")
        return out
    out.verdict = rep.get("verdict")
    for f in rep.get("findings") or []:
        tag = f"{f['code']}[{f['severity']}] ranks {f.get('ranks')}: {f.get('message', '')[:160]}"
        if f["severity"] == "error" and (f.get("evidence") or {}).get("finished_program"):
            out.torch_teardown.append(tag)
        elif f["severity"] == "error" or (f["severity"] == "warning" and f["code"].startswith(CORRECTNESS)):
            out.bad.append(tag)
        elif f["severity"] == "warning":
            out.perf.append(tag)
    for f in (rep.get("lint") or {}).get("findings") or []:
        if f["severity"] == "error":
            out.bad.append(f"lint {f['code']} line {f.get('line')}: {f.get('message', '')[:120]}")
    if out.stopped and not out.bad:
        out.bad.append(f"stopped: verdict {out.verdict}, exit {res.returncode}; output tail: {res.stdout[-800:]}")
    return out


def run_many(seeds: list[int], workdir: Path, parallel: int = 2, echo=print) -> list[Outcome]:
    programs = [generate(s) for s in seeds]
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for o in pool.map(lambda p: run(p, workdir), programs):
            outcomes.append(o)
            flag = "STOPPED" if o.stopped else ("WARNED" if o.bad else "TORCH-ABORT-AT-EXIT" if o.torch_teardown else "ok")
            echo(f"{flag:8} seed {o.program.seed:5} {o.program.nproc} ranks {'+'.join(o.program.patterns):60} "
                 f"{o.seconds:5.1f}s" + "".join(f"\n         {b}" for b in o.bad))
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    n = len(outcomes)
    stopped = sum(o.stopped for o in outcomes)
    warned = sum(bool(o.bad) and not o.stopped for o in outcomes)
    perf = sum(bool(o.perf) for o in outcomes)
    lines = ["| jobs | stopped | warned (correctness) | performance advice only |", "|---|---|---|---|",
             f"| {n} | {stopped} | {warned} | {perf} |", "", "| pattern | jobs | stopped or warned |", "|---|---|---|"]
    names = sorted({p for o in outcomes for p in o.program.patterns})
    for name in names:
        has = [o for o in outcomes if name in o.program.patterns]
        lines.append(f"| {name} | {len(has)} | {sum(bool(o.bad) for o in has)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="first seed; job k uses seed + k")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep every job's folder (program, report) here")
    ap.add_argument("--show", type=int, metavar="SEED", help="print the program of one seed and exit")
    a = ap.parse_args(argv)
    if a.show is not None:
        p = generate(a.show)
        print(f"# {p.nproc} ranks: {' + '.join(p.patterns)}\n{p.source}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        outcomes = run_many(list(range(a.seed, a.seed + a.jobs)), work, a.parallel)
    print()
    print(table(outcomes))
    return 1 if any(o.bad for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
