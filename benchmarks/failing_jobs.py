"""The failing-job generator: training jobs that diverge in a known way, composed at random, whose diagnosis
must name the right code family, the right culprit ranks and the decision line -- with no sentence the report's
own evidence contradicts.

Each job is one program (and, for some placements, a module beside it) built from a divergence kind -- a step
skipped by `continue`, by a helper's or another module's method's early `return`, by a caught exception; a
collective or a DDP forward under a rank condition, inline, in a helper, in another module, behind a
main-process-only decorator; an early stop on a rank-local signal; a per-rank batch count; an object collective
skipped on an empty shard -- at random names, ranks, steps and world sizes.  The truth is known by construction:
the template marks the decision line (``# DECISION``), the culprit ranks and the code.  A miss is a bug in the
mechanism: fix the mechanism, never the template.

    PYTHONPATH=src python benchmarks/failing_jobs.py [--jobs 300] [--seed 0] [--parallel 2] [--keep DIR]
    PYTHONPATH=src python benchmarks/failing_jobs.py --show SEED     # print the files of one seed

It prints one line per job and a table (by kind and placement: jobs, code right, culprits right, line right,
all right, contradicted); tests/run/test_failing_jobs.py runs a fixed sample in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "# DECISION"


@dataclass
class Job:
    """A generated failing job: its files, and the truth the diagnosis must find."""
    seed: int
    nproc: int
    kind: str
    placement: str
    files: dict[str, str]          # relative path -> source; "job.py" is the entry
    truth_file: str                # the file holding the decision line
    culprits: list[int]
    code: str

    @property
    def truth_line(self) -> int:
        return next(i for i, ln in enumerate(self.files[self.truth_file].splitlines(), 1) if MARK in ln)


@dataclass
class Outcome:
    job: Job
    exit_code: int
    verdict: str | None
    got: list[tuple[str, list[int], str | None, int | None]] = field(default_factory=list)  # runtime errors
    contradictions: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    def _best(self):
        """The runtime error finding closest to the truth (code, then ranks, then line)."""
        j = self.job

        def score(g):
            return (g[0] == j.code, sorted(g[1]) == sorted(j.culprits), self._line_ok(g))
        return max(self.got, key=score, default=None)

    def _line_ok(self, g) -> bool:
        return g[2] is not None and os.path.basename(g[2]) == os.path.basename(self.job.truth_file) \
            and g[3] == self.job.truth_line

    @property
    def code_ok(self) -> bool:
        return any(g[0] == self.job.code for g in self.got)

    @property
    def ranks_ok(self) -> bool:
        return any(g[0] == self.job.code and sorted(g[1]) == sorted(self.job.culprits) for g in self.got)

    @property
    def line_ok(self) -> bool:
        return any(g[0] == self.job.code and self._line_ok(g) for g in self.got)

    @property
    def right(self) -> bool:
        return any(g[0] == self.job.code and sorted(g[1]) == sorted(self.job.culprits) and self._line_ok(g)
                   for g in self.got) and not self.contradictions


# -- names ---------------------------------------------------------------------------------------------
MODELS = ("model", "net", "ddp_model", "wrapped")
STEP_FNS = ("train_step", "run_batch", "step_fn", "fit_batch", "optimize_batch")
EVAL_FNS = ("evaluate", "validate", "run_eval", "quick_eval")
SYNC_FNS = ("sync_metrics", "wait_all", "log_global", "checkpoint_barrier", "gather_scores")
CLASSES = ("Trainer", "Engine", "Runner", "Loop")
MODULES = ("trainer_lib", "engine", "train_utils", "runner")
DECORATORS = ("main_process_only", "on_main_process", "rank_zero_only", "only_on_main")

HEADER = """\
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
"""


@dataclass
class Parts:
    """What a divergence kind puts into the job: module-level helpers of job.py, another module (or None),
    lines before the loop, the loop body (8 spaces deep), and the truth."""
    helpers: str = ""
    module: str | None = None
    imports: str = ""
    pre: str = ""
    body: str = ""
    truth_file: str = "job.py"
    culprits: list[int] = field(default_factory=list)
    code: str = "DDP101"
    steps: str = "{steps}"
    loop: str = "for step in range({steps}):"
    batchnorm: bool = False
    fsdp2: bool = False  # the model is sharded with FSDP2 (`fully_shard`) instead of wrapped in DDP


def _ind(text: str, n: int) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), " " * n) + "\n"


def _place(r: random.Random, fn_src: str, fn: str, placement: str, modname: str, cls: str) -> tuple[str, str | None, str, str]:
    """A helper ``fn`` (source of a plain function taking ``model, opt, x``-style arguments) placed inline in
    job.py, in another module, or as a method of a class in another module: (helpers, module, imports, call)."""
    if placement == "helper":
        return fn_src, None, "", f"{fn}"
    if placement == "module":
        return "", "import torch\nimport torch.distributed as dist\n\n\n" + fn_src, f"from {modname} import {fn}\n", fn
    # a method of a class in another module: the instance is built in main
    method = _ind(fn_src.replace(f"def {fn}(", f"def {fn}(self, ", 1), 4)
    mod = f"import torch\nimport torch.distributed as dist\n\n\nclass {cls}:\n{method}"
    return "", mod, f"from {modname} import {cls}\n", f"{cls}().{fn}"


def k_skip_continue(r, w, names) -> Parts:
    bad, k = r.randrange(w), r.randrange(3, 12)
    m = names["model"]
    return Parts(body=_ind(f"""
        if rank == {bad} and step == {k}:
            x[0, 0] = float("nan")  # one corrupt record in this rank's shard
        loss = {m}(x).pow(2).mean()
        if not torch.isfinite(loss):
            continue  {MARK}
        opt.zero_grad()
        loss.backward()
        opt.step()
    """, 8), culprits=[bad])


def k_skip_return(r, w, names, placement) -> Parts:
    bad, k = r.randrange(w), r.randrange(3, 12)
    fn = names["step_fn"]
    src = textwrap.dedent(f"""
        def {fn}(model, opt, x):
            loss = model(x).pow(2).mean()
            if torch.isnan(loss):
                return None  {MARK}
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()
    """).lstrip()
    helpers, module, imports, call = _place(r, src, fn, placement, names["module"], names["cls"])
    return Parts(helpers=helpers, module=module, imports=imports, truth_file="job.py" if module is None else
                 names["module"] + ".py", culprits=[bad], body=_ind(f"""
        if rank == {bad} and step == {k}:
            x[0, 0] = float("nan")
        {call}({names['model']}, opt, x)
    """, 8))


def k_skip_except(r, w, names) -> Parts:
    bad, k = r.randrange(w), r.randrange(3, 12)
    m = names["model"]
    return Parts(helpers=textwrap.dedent("""
        def check_finite(loss):
            if not torch.isfinite(loss):
                raise FloatingPointError("non-finite loss")
    """).lstrip(), culprits=[bad], body=_ind(f"""
        if rank == {bad} and step == {k}:
            x[0, 0] = float("inf")
        loss = {m}(x).pow(2).mean()
        try:
            check_finite(loss)
        except FloatingPointError:
            continue  {MARK}
        opt.zero_grad()
        loss.backward()
        opt.step()
    """, 8))


def _train(m: str) -> str:
    return _ind(f"""
        loss = {m}(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """, 8)


def k_rank_collective(r, w, names, placement) -> Parts:
    who, k = r.randrange(w), r.randrange(2, 10)
    fn = names["sync_fn"]
    op = r.choice(["dist.barrier()", "dist.all_reduce(torch.ones(1))"])
    src = f"def {fn}():\n    {op}\n"
    if placement == "inline":
        body = _ind(f"""
            if step == {k} and rank == {who}:  {MARK}
                {op}
        """, 8)
        return Parts(body=body + _train(names["model"]), code="DDP201", culprits=[who])
    helpers, module, imports, call = _place(r, src, fn, placement, names["module"], names["cls"])
    body = _ind(f"""
        if step == {k} and rank == {who}:  {MARK}
            {call}()
    """, 8)
    return Parts(helpers=helpers, module=module, imports=imports, body=body + _train(names["model"]),
                 code="DDP201", culprits=[who])


def k_decorator(r, w, names) -> Parts:
    k = r.randrange(2, 10)
    dec, fn = names["decorator"], names["sync_fn"]
    mod = textwrap.dedent(f"""
        import functools

        import torch.distributed as dist


        def {dec}(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if dist.get_rank() == 0:
                    return func(*args, **kwargs)
                return None
            return wrapper


        @{dec}  {MARK}
        def {fn}(step):
            print(f"saving at step {{step}}", flush=True)
            dist.barrier()
    """).lstrip()
    body = _ind(f"""
        if step == {k}:
            {fn}(step)
    """, 8)
    return Parts(module=mod, imports=f"from {names['module']} import {fn}\n", body=body + _train(names["model"]),
                 truth_file=names["module"] + ".py", code="DDP201", culprits=[0])


def k_forward_rank0(r, w, names, placement) -> Parts:
    k = r.randrange(2, 10)
    fn = names["eval_fn"]
    src = textwrap.dedent(f"""
        def {fn}(model, x):
            model.eval()
            score = model(x).mean().item()
            model.train()
            return score
    """).lstrip()
    m = names["model"]
    if placement == "inline":
        body = _ind(f"""
            if rank == 0 and step == {k}:  {MARK}
                {m}.eval()
                print("val", {m}(x).mean().item(), flush=True)
                {m}.train()
        """, 8)
        return Parts(body=body + _train(m), code="DDP202", culprits=[0], batchnorm=True)
    helpers, module, imports, call = _place(r, src, fn, placement, names["module"], names["cls"])
    body = _ind(f"""
        if rank == 0 and step == {k}:  {MARK}
            {call}({m}, x)
    """, 8)
    return Parts(helpers=helpers, module=module, imports=imports, body=body + _train(m), code="DDP202",
                 culprits=[0], batchnorm=True)


def k_early_stop(r, w, names) -> Parts:
    bad, k = r.randrange(w), r.randrange(4, 12)
    m = names["model"]
    return Parts(pre=_ind("""
        best, patience = float("inf"), 0
    """, 4), culprits=[bad], body=_train(m) + _ind(f"""
        val_loss = loss.item() + (step if rank == {bad} and step >= {k} else -step)  # a shard-local metric
        if val_loss < best:
            best, patience = val_loss, 0
        else:
            patience += 1
        if patience >= 2:
            break  {MARK}
    """, 8))


FSDP2_CALLS = {
    "eval": "{m}.eval()\n    print(\"val\", {m}(x).mean().item(), flush=True)\n    {m}.train()",
    "clip": "norm = torch.nn.utils.clip_grad_norm_({m}.parameters(), 1.0)\n"
            "    print(\"grad norm\", norm.to_local().item(), flush=True)",
    "state_dict": "sd = get_model_state_dict({m}, options=StateDictOptions(full_state_dict=True))\n"
                  "    print(len(sd), \"tensors to save\", flush=True)",
}


def k_fsdp2_rank0(r, w, names, placement) -> Parts:
    """A collective API of an FSDP2 model (its forward, clip_grad_norm_ of its DTensor gradients, a full state
    dict) called on rank 0 only: DDP201 at the rank-0 branch."""
    k, what = r.randrange(2, 8), r.choice(sorted(FSDP2_CALLS))
    m, fn = names["model"], names["eval_fn"]
    call = FSDP2_CALLS[what].format(m="model" if placement == "helper" else m)
    imports = ("from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict\n"
               if what == "state_dict" else "")
    train = _ind(f"""
        loss = {m}(x).pow(2).mean()
        loss.backward()
    """, 8)
    if placement == "inline":
        body = " " * 8 + f"if rank == 0 and step == {k}:  {MARK}\n" + textwrap.indent(
            textwrap.dedent("    " + call), " " * 12) + "\n"
        helpers = ""
    else:
        body = _ind(f"""
            if rank == 0 and step == {k}:  {MARK}
                {fn}({m}, x)
        """, 8)
        helpers = f"def {fn}(model, x):\n    {call}\n"
    step = _ind("""
        opt.step()
        opt.zero_grad()
    """, 8)
    # clip_grad_norm_ needs this step's gradients: between backward and the optimizer step
    return Parts(helpers=helpers, imports=imports, body=train + body + step, code="DDP201", culprits=[0],
                 fsdp2=True)


def k_counter_continue(r, w, names) -> Parts:
    """nanoGPT's shape: `while True` with an iteration counter, a data-dependent skip that moves the counter."""
    bad, k = r.randrange(w), r.randrange(3, 10)
    m = names["model"]
    return Parts(pre=_ind("""
        iter_num = 0
    """, 4), loop="while True:", culprits=[bad], body=_ind(f"""
        if rank == {bad} and iter_num == {k}:
            x[0, 0] = float("nan")  # a corrupt batch
        if torch.isnan(x).any():
            iter_num += 1
            continue  {MARK}
        loss = {m}(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iter_num += 1
        if iter_num >= {r.randrange(14, 24)}:
            break
    """, 8))


def k_uneven_count(r, w, names) -> Parts:
    few = r.randrange(w)
    m = names["model"]
    return Parts(pre=_ind(f"""
        n_batches = 12 - (1 if rank == {few} else 0)  {MARK}
    """, 4), steps="n_batches", culprits=[few], body=_train(m))


def k_empty_gather(r, w, names, placement) -> Parts:
    empty = r.randrange(w)
    fn = "summarise"
    src = textwrap.dedent(f"""
        def {fn}(preds):
            if not preds:
                return {{}}  {MARK}
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, {{"n": len(preds)}})
            return {{"ranks": every}}
    """).lstrip()
    helpers, module, imports, call = _place(r, src, fn, placement, names["module"], names["cls"])
    body = _train(names["model"]) + _ind(f"""
        if step == 5:
            preds = [] if rank == {empty} else [loss.item()]
            {call}(preds)
    """, 8)
    return Parts(helpers=helpers, module=module, imports=imports, body=body, code="DDP201",
                 truth_file="job.py" if module is None else names["module"] + ".py",
                 culprits=[q for q in range(w) if q != empty])


KINDS = {
    "skip_continue": (k_skip_continue, ("inline",)),
    "skip_return": (k_skip_return, ("helper", "module", "method")),
    "skip_except": (k_skip_except, ("inline",)),
    "rank_collective": (k_rank_collective, ("inline", "helper", "module", "method")),
    "decorator_collective": (k_decorator, ("module",)),
    "forward_rank0": (k_forward_rank0, ("inline", "helper", "module")),
    "early_stop": (k_early_stop, ("inline",)),
    "uneven_count": (k_uneven_count, ("inline",)),
    "counter_continue": (k_counter_continue, ("inline",)),
    "fsdp2_rank0": (k_fsdp2_rank0, ("inline", "helper")),
    "empty_gather": (k_empty_gather, ("helper", "module", "method")),
}


def generate(seed: int) -> Job:
    r = random.Random(seed)
    kind = list(KINDS)[seed % len(KINDS)]
    make, placements = KINDS[kind]
    placement = r.choice(placements)
    w = r.choice((2, 2, 3))
    names = {"model": r.choice(MODELS), "step_fn": r.choice(STEP_FNS), "eval_fn": r.choice(EVAL_FNS),
             "sync_fn": r.choice(SYNC_FNS), "cls": r.choice(CLASSES), "module": r.choice(MODULES),
             "decorator": r.choice(DECORATORS)}
    parts = make(r, w, names, placement) if make.__code__.co_argcount == 4 else make(r, w, names)
    m = names["model"]
    layers = "nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)" if parts.batchnorm else \
        "nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)"
    steps = parts.steps.format(steps=r.randrange(14, 24))
    fsdp = ("from torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.fsdp import fully_shard\n") if parts.fsdp2 else ""
    main = (f"{HEADER}{fsdp}{parts.imports}\n\n{parts.helpers}\n\ndef main():\n"
            "    dist.init_process_group(\"gloo\", timeout=datetime.timedelta(seconds=60))\n"
            "    rank = dist.get_rank()\n"
            "    torch.manual_seed(1234 + rank)\n"
            + (f"    {m} = nn.Sequential({layers})\n"
               "    mesh = init_device_mesh(\"cpu\", (dist.get_world_size(),))\n"
               f"    for layer in {m}:\n        if isinstance(layer, nn.Linear):\n"
               "            fully_shard(layer, mesh=mesh)\n"
               f"    fully_shard({m}, mesh=mesh)\n" if parts.fsdp2 else f"    {m} = DDP(nn.Sequential({layers}))\n") +
            f"    opt = torch.optim.SGD({m}.parameters(), lr=0.01)\n"
            f"{parts.pre}"
            f"    {parts.loop.format(steps=steps)}\n"
            "        x = torch.randn(4, 8)\n"
            f"{parts.body}"
            "    done = torch.ones(1)\n"
            "    dist.all_reduce(done)\n"
            "    dist.destroy_process_group()\n\n\n"
            "if __name__ == \"__main__\":\n    main()\n")
    files = {"job.py": main.replace("\n\n\n\n\n", "\n\n\n")}
    if parts.module is not None:
        files[names["module"] + ".py"] = parts.module
    return Job(seed, w, kind, placement, files, parts.truth_file, parts.culprits, parts.code)


def run(job: Job, workdir: Path, timeout: float = 240.0) -> Outcome:
    """Run one generated job under `ddp-doctor run` and score its report against the truth."""
    d = workdir / f"fail{job.seed}"
    d.mkdir(parents=True, exist_ok=True)
    for rel, text in job.files.items():
        (d / rel).write_text(text)
    report = d / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--report", str(report),
                          "--nproc-per-node", str(job.nproc), str(d / "job.py")], cwd=d, env=env, timeout=timeout,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Outcome(job, res.returncode, None, seconds=time.monotonic() - t0)
    (d / "output.txt").write_text(res.stdout)
    try:
        rep = json.loads(report.read_text())
    except (OSError, ValueError) as e:
        out.note = f"no report ({e}); output tail: {res.stdout[-600:]}"
        return out
    out.verdict = rep.get("verdict")
    out.contradictions = list(rep.get("contradictions") or [])
    for f in rep.get("findings") or []:
        if f.get("source", "runtime") == "runtime" and f.get("severity") == "error":
            loc = f.get("location") or {}
            out.got.append((f["code"], list(f.get("ranks") or []), loc.get("path"), loc.get("line")))
    return out


def run_many(seeds: list[int], workdir: Path, parallel: int = 2, echo=print) -> list[Outcome]:
    jobs = [generate(s) for s in seeds]
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for o in pool.map(lambda j: run(j, workdir), jobs):
            outcomes.append(o)
            j = o.job
            flag = "ok" if o.right else "MISS"
            echo(f"{flag:5} seed {j.seed:4} {j.nproc} ranks {j.kind:21} {j.placement:7} want {j.code} {j.culprits} "
                 f"{j.truth_file}:{j.truth_line}  got {[(c, rs, os.path.basename(p or '-'), ln) for c, rs, p, ln in o.got]}"
                 + (f" CONTRADICTED {o.contradictions}" if o.contradictions else "") + (f" {o.note}" if o.note else "")
                 + f" {o.seconds:.1f}s")
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    def row(label, os_):
        n = len(os_)
        return (f"| {label} | {n} | {sum(o.code_ok for o in os_)} | {sum(o.ranks_ok for o in os_)} | "
                f"{sum(o.line_ok for o in os_)} | {sum(o.right for o in os_)} | {sum(bool(o.contradictions) for o in os_)} |")
    lines = ["| kind / placement | jobs | code right | code + culprits right | code + line right | all right "
             "| contradicted |", "|---|---|---|---|---|---|---|", row("**all**", outcomes)]
    for key in sorted({(o.job.kind, o.job.placement) for o in outcomes}):
        lines.append(row(f"{key[0]} / {key[1]}", [o for o in outcomes if (o.job.kind, o.job.placement) == key]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0, help="first seed; job k uses seed + k")
    ap.add_argument("--seeds", type=int, nargs="+", help="run exactly these seeds")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep every job's folder (files, report, output) here")
    ap.add_argument("--show", type=int, metavar="SEED", help="print the files of one seed and exit")
    a = ap.parse_args(argv)
    if a.show is not None:
        j = generate(a.show)
        print(f"# {j.nproc} ranks, {j.kind} / {j.placement}: want {j.code} on {j.culprits} at "
              f"{j.truth_file}:{j.truth_line}")
        for rel, text in j.files.items():
            print(f"# ---- {rel}\n{text}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        outcomes = run_many(a.seeds or list(range(a.seed, a.seed + a.jobs)), work, a.parallel)
    print()
    print(table(outcomes))
    return 0 if all(o.right for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
