"""The failing-job generator: training jobs that diverge in a known way, composed at random, whose diagnosis
must name the right code family, the right culprit ranks and the decision line -- with no sentence the report's
own evidence contradicts.

Each job is one program (and, for some placements, a module beside it) built from a divergence kind -- a step
skipped by `continue`, by a helper's or another module's method's early `return`, by a caught exception; a
collective or a DDP forward under a rank condition, inline, in a helper, in another module, behind a
main-process-only decorator; an early stop on a rank-local signal; a per-rank batch count or time budget; a
per-rank no_sync() choice; an object collective skipped on an empty shard; a prefetch thread that dies; a rank
that raises or exits while the others train (DDP204); calls whose shapes or dtypes differ (DDP203) -- and the
frameworks' own rank-0 places: a Lightning callback hook (``trainer.is_global_zero``, ``@rank_zero_only``), an HF
``TrainerCallback`` hook, an accelerate main-process block or decorator, Fabric's ``global_rank == 0`` -- with the
plain loops also under Fabric and accelerate, at random names, ranks, steps and world sizes (2-4).  The truth is known by construction:
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
    form: str
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
    program: str | None = None  # a whole job.py of its own (a framework's training form)
    form: str = "ddp"            # the training form: ddp, fsdp2, fabric, accelerate, lightning, hf


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

def k_no_sync_choice(r, w, names, placement) -> Parts:
    """Gradient accumulation whose boundary each rank decides from its own token count: one rank's micro-batches
    hold more tokens, so it leaves ``no_sync()`` after fewer of them (DDP101 at the choice, on that rank)."""
    bad, budget = r.randrange(w), r.choice((96, 120, 144))
    # the others sync every 3rd micro-batch, the culprit every 2nd (or the others every 2nd, the culprit every 3rd)
    few, many = (budget // 3, budget // 2) if r.random() < 0.5 else (budget // 2, budget // 3)
    m = names["model"]
    count = _ind(f"""
        tokens_seen += {many} if rank == {bad} else {few}  # this shard's real (unpadded) tokens
        sync_now = tokens_seen >= {budget}
    """, 8)
    if placement == "value":
        body = count + _ind(f"""
            ctx = contextlib.nullcontext() if sync_now else {m}.no_sync()  {MARK}
            with ctx:
                {m}(x).pow(2).mean().backward()
        """, 8)
    else:
        body = count + _ind(f"""
            if not sync_now:  {MARK}
                with {m}.no_sync():
                    {m}(x).pow(2).mean().backward()
            else:
                {m}(x).pow(2).mean().backward()
        """, 8)
    body += _ind("""
        if sync_now:
            opt.step()
            opt.zero_grad()
            tokens_seen = 0
    """, 8)
    return Parts(imports="import contextlib\n", pre=_ind("tokens_seen = 0", 4), body=body, culprits=[bad])


def k_time_budget(r, w, names, placement) -> Parts:
    """A training-time budget spent at each rank's own measured step cost (deterministic here: one host is slower
    by construction): the slower rank runs fewer steps and leaves the loop first (DDP101 at the budget test)."""
    bad, cost = r.randrange(w), r.choice((0.05, 0.1, 0.2))
    slow = r.choice((1.5, 2.0))
    pre = _ind(f"""
        budget_s, spent_s = {cost * r.randrange(12, 20):.2f}, 0.0
        step_cost_s = {cost} * ({slow} if rank == {bad} else 1.0)  # this host's measured seconds per step
    """, 4)
    body = _train(names["model"]) + _ind("spent_s += step_cost_s", 8)
    if placement == "while":
        return Parts(pre=pre, loop=f"while spent_s < budget_s:  {MARK}", body=body, culprits=[bad])
    return Parts(pre=pre, loop="for step in range(1000):", culprits=[bad], body=body + _ind(f"""
        if spent_s >= budget_s:
            break  {MARK}
    """, 8))


def k_rank_dies(r, w, names, placement) -> Parts:
    """One rank's process ends mid-training while the others wait in a collective that needs it (DDP204 on that
    rank, at the line it ended at): a record only its shard holds fails to decode -- the exception raised in a
    helper, another module's function or a method -- or it leaves on a preemption notice only its node got
    (``sys.exit``, inline, or ``raise SystemExit`` in a helper or another module).  The line is where the process
    ended, not a decision between ranks."""
    bad, k = r.randrange(w), r.randrange(3, 12)
    if placement == "exit":
        return Parts(imports="import sys\n", code="DDP204", culprits=[bad], body=_ind(f"""
            if rank == {bad} and step == {k}:  # only this node got the preemption notice
                sys.exit(0)  {MARK}
        """, 8) + _train(names["model"]))
    if placement.startswith("exit_"):  # the same exit inside a helper the loop calls: `raise SystemExit`
        fn = r.choice(("check_preemption", "maybe_stop", "handle_signals"))
        src = textwrap.dedent(f"""
            def {fn}(notice):
                if notice:  # only this node got the preemption notice
                    raise SystemExit(0)  {MARK}
        """).lstrip()
        helpers, module, imports, call = _place(r, src, fn, placement[5:], names["module"], names["cls"])
        return Parts(helpers=helpers, module=module, imports=imports, code="DDP204", culprits=[bad],
                     truth_file="job.py" if module is None else names["module"] + ".py",
                     body=_ind(f"{call}(notice=rank == {bad} and step == {k})", 8) + _train(names["model"]))
    fn = r.choice(("decode_batch", "load_records", "read_batch", "fetch_batch"))
    src = textwrap.dedent(f"""
        def {fn}(x, corrupt):
            if corrupt:  # a record only this rank's shard holds
                raise ValueError("record could not be decoded: truncated file")  {MARK}
            return x
    """).lstrip()
    helpers, module, imports, call = _place(r, src, fn, placement, names["module"], names["cls"])
    return Parts(helpers=helpers, module=module, imports=imports, code="DDP204", culprits=[bad],
                 truth_file="job.py" if module is None else names["module"] + ".py",
                 body=_ind(f"x = {call}(x, corrupt=rank == {bad} and step == {k})", 8) + _train(names["model"]))


def k_mismatch(r, w, names, placement) -> Parts:
    """Ranks pair calls that torch requires to agree and they do not (DDP203 at the collective; the odd rank out
    when the others agree, every rank of two): an all_gather of a validation shard one rank holds fewer rows of
    (``gather``), an all_reduce of metrics one rank's config keeps in float64 (``dtype``)."""
    bad, k = r.randrange(w), r.randrange(3, 12)
    culprits = [bad] if w > 2 else list(range(w))
    if placement == "gather":
        body = _ind(f"""
            if step == {k}:  # a validation pass on each rank's shard
                n_valid = 3 if rank == {bad} else 4  # this rank's shard ends with a short batch
                preds = x[:n_valid, 0].clone()
                gathered = [torch.zeros_like(preds) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, preds)  {MARK}
        """, 8)
    else:
        body = _ind(f"""
            if step == {k}:
                stats = torch.tensor([float(step), 4.0])
                if rank == {bad}:  # this node's config asks for fp64 metrics
                    stats = stats.double()
                dist.all_reduce(stats)  {MARK}
        """, 8)
    return Parts(code="DDP203", culprits=culprits, body=body + _train(names["model"]))


def k_thread_dies(r, w, names, placement) -> Parts:
    """A prefetch thread that dies on one rank (the exception only printed by the thread): that rank's loop waits
    on the batch queue forever while the others wait in a collective (DDP205 on that rank, at its wait)."""
    bad, n = r.randrange(w), r.randrange(8, 14)
    k = r.randrange(3, n - 1)
    if placement == "collective":  # dies mid-epoch, before it hands over a batch
        helpers = textwrap.dedent("""
            def prefetch(q, n, fail_at):
                for i in range(n):
                    if i == fail_at:
                        raise OSError("shard 7: stale file handle")  # the thread dies; nobody joins it
                    q.put(torch.randn(4, 8))
                q.put(None)
        """).lstrip()
    else:  # dies after the epoch's batches, before it posts the end of the epoch
        helpers = textwrap.dedent("""
            def prefetch(q, n, fail):
                for i in range(n):
                    q.put(torch.randn(4, 8))
                if fail:
                    raise OSError("shard 7: stale file handle")  # the thread dies; nobody joins it
                q.put(None)
        """).lstrip()
    m = names["model"]
    if placement == "collective":  # dies mid-epoch: the others wait in the gradient all-reduce
        pre = _ind(f"""
            q = queue.Queue(maxsize=4)
            threading.Thread(target=prefetch, args=(q, {n}, {k} if rank == {bad} else -1), daemon=True).start()
        """, 4)
        body = _ind(f"""
            x = q.get()  {MARK}
            if x is None:
                break
        """, 8) + _train(m)
        return Parts(imports="import queue\nimport threading\n", helpers=helpers, pre=pre, loop="while True:",
                     body=body, code="DDP205", culprits=[bad])
    # dies at the end of the second epoch, after its batches: the others wait in an epoch-end monitored_barrier
    body = _ind(f"""
        q = queue.Queue(maxsize=4)
        threading.Thread(target=prefetch, args=(q, {n}, rank == {bad} and epoch == 1), daemon=True).start()
        while True:
            x = q.get()  {MARK}
            if x is None:
                break
            loss = {m}(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=8))
    """, 8)
    return Parts(imports="import queue\nimport threading\n", helpers=helpers, loop="for epoch in range(3):",
                 body=body, code="DDP205", culprits=[bad])


# -- the framework forms: each a whole program -------------------------------------------------------------------
FW_DATA = """\
    torch.manual_seed(0)
    data = torch.randn({n}, 8)
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)
"""


def _rank0_test(r, who: str, step: str, k: int) -> str:
    return r.choice((f"if {who} and {step} == {k}:", f"if {step} == {k} and {who}:"))


def k_fabric_rank0(r, w, names, placement) -> Parts:
    """Lightning Fabric: a Fabric collective on global rank 0 only, in the loop, in a helper, or in a rank-0 data
    preparation block above the loop (DDP201 on rank 0, at the rank test)."""
    k, fn = r.randrange(1, 3), names["sync_fn"]
    who = r.choice(("fabric.global_rank == 0", "fabric.is_global_zero"))
    op = r.choice(("fabric.barrier()", "fabric.all_reduce(loss.detach())", "fabric.broadcast(loss.detach())"))
    helpers, pre, inloop = "", "", ""
    if placement == "setup":  # the make_dataset(): rank 0 writes a cache, then waits for the others
        pre = _ind(f"""
            if {who}:  {MARK}
                torch.save(data, os.path.join(tempfile.gettempdir(), f"cache-{{os.getpid()}}.pt"))
                fabric.barrier()
        """, 4)
    elif placement == "inline":
        inloop = _ind(f"""
            {_rank0_test(r, who, "step", k)}  {MARK}
                {op}
        """, 12)
    else:
        helpers = f"def {fn}(fabric, loss):\n    {op}\n\n\n"
        inloop = _ind(f"""
            {_rank0_test(r, who, "step", k)}  {MARK}
                {fn}(fabric, loss)
        """, 12)
    program = (f"import os\nimport tempfile\n\nimport torch\nimport torch.nn as nn\n"
               "from lightning.fabric import Fabric\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
               f"{helpers}def main():\n"
               f"    fabric = Fabric(accelerator=\"cpu\", strategy=\"ddp\", devices={w})\n"
               "    fabric.launch()  # under torchrun: adopts its ranks\n"
               + FW_DATA.format(n=16 * w) + pre +
               "    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n"
               "    model, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))\n"
               "    loader = fabric.setup_dataloaders(loader)\n"
               "    for epoch in range(2):\n"
               "        for step, (xb, yb) in enumerate(loader):\n"
               "            loss = nn.functional.mse_loss(model(xb), yb)\n"
               "            opt.zero_grad()\n"
               "            fabric.backward(loss)\n"
               "            opt.step()\n"
               + inloop +
               "    fabric.print(\"done\")\n\n\nif __name__ == \"__main__\":\n    main()\n")
    return Parts(program=program, code="DDP201", culprits=[0], form="fabric")


def k_accelerate_main(r, w, names, placement) -> Parts:
    """accelerate: ``wait_for_everyone()`` / ``gather()`` / ``reduce()`` inside an ``if accelerator.is_main_process:``
    block, in the loop or at an epoch's end, inline or through a helper (DDP201 on rank 0, at the block's test)."""
    k, fn = r.randrange(1, 3), names["sync_fn"]
    who = r.choice(("accelerator.is_main_process", "accelerator.process_index == 0"))
    op = r.choice(("accelerator.wait_for_everyone()", "accelerator.gather(loss.detach())",
                   "accelerator.reduce(loss.detach(), reduction=\"mean\")"))
    helpers, inloop, after = "", "", ""
    if placement == "epoch_end":  # save on the main process, then "let the others wait for the file"
        after = _ind(f"""
            if {who}:  {MARK}
                torch.save(accelerator.unwrap_model(model).state_dict(),
                           os.path.join(tempfile.gettempdir(), f"acc-{{os.getpid()}}.pt"))
                accelerator.wait_for_everyone()
        """, 8)
    elif placement == "inline":
        inloop = _ind(f"""
            {_rank0_test(r, who, "step", k)}  {MARK}
                {op}
        """, 12)
    elif placement == "decorator":  # accelerate's own main-process-only decorator, on a function of main's
        after = _ind(f"""
            @accelerator.on_main_process  {MARK}
            def {fn}():
                print("epoch", epoch, "loss", loss.item(), flush=True)
                {op}

            {fn}()
        """, 8)
    else:
        helpers = f"def {fn}(accelerator, loss):\n    {op}\n\n\n"
        inloop = _ind(f"""
            {_rank0_test(r, who, "step", k)}  {MARK}
                {fn}(accelerator, loss)
        """, 12)
    program = ("import datetime\nimport os\nimport tempfile\n\nimport torch\nimport torch.nn as nn\n"
               "from accelerate import Accelerator\nfrom accelerate.utils import InitProcessGroupKwargs\n"
               "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
               f"{helpers}def main():\n"
               "    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(\n"
               "        backend=\"gloo\", timeout=datetime.timedelta(seconds=60))])\n"
               + FW_DATA.format(n=16 * w) +
               "    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n"
               "    model, opt, loader = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01), loader)\n"
               "    for epoch in range(3):\n"
               "        for step, (xb, yb) in enumerate(loader):\n"
               "            loss = nn.functional.mse_loss(model(xb), yb)\n"
               "            opt.zero_grad()\n"
               "            accelerator.backward(loss)\n"
               "            opt.step()\n"
               + inloop + after +
               "    accelerator.print(\"done\")\n\n\nif __name__ == \"__main__\":\n    main()\n")
    return Parts(program=program, code="DDP201", culprits=[0], form="accelerate")


LIGHTNING_OPS = ("trainer.strategy.barrier()", "torch.distributed.barrier()",
                 "trainer.strategy.reduce(torch.ones(1))")


def k_lightning_hook(r, w, names, placement) -> Parts:
    """Lightning: a collective in a Callback hook that only global rank 0 runs -- under ``if trainer.is_global_zero:``
    at an epoch's end or a batch's end, or a hook decorated ``@rank_zero_only`` (DDP201 on rank 0, at the test or the
    decoration)."""
    cb, op = r.choice(("ExportWeights", "SaveEveryEpoch", "MetricsLogger", "Snapshot")), r.choice(LIGHTNING_OPS)
    cb_helpers = ""
    save = "torch.save(pl_module.state_dict(), os.path.join(tempfile.gettempdir(), f\"pl-{os.getpid()}.pt\"))"
    if placement == "rank_zero_helper":  # a @rank_zero_only function of the callback's module, called by a hook
        helper = r.choice(("export", "publish", "write_snapshot"))
        hook = _ind(f"""
            def on_train_epoch_end(self, trainer, pl_module):
                {helper}(trainer, pl_module)
        """, 4)
        cb_helpers = _ind(f"""
            @rank_zero_only  {MARK}
            def {helper}(trainer, pl_module):
                {save}
                {op}
        """, 0) + "\n\n"
    elif placement == "rank_zero_only":
        hook = _ind(f"""
            @rank_zero_only  {MARK}
            def on_train_epoch_end(self, trainer, pl_module):
                {save}
                {op}
        """, 4)
    elif placement == "epoch_end":
        hook = _ind(f"""
            def on_train_epoch_end(self, trainer, pl_module):
                if trainer.is_global_zero:  {MARK}
                    {save}
                    {op}
        """, 4)
    else:
        k = r.randrange(1, 3)
        hook = _ind(f"""
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                {_rank0_test(r, "trainer.is_global_zero", "batch_idx", k)}  {MARK}
                    {op}
        """, 4)
    program = ("import datetime\nimport os\nimport tempfile\n\nimport lightning as L\nimport torch\nimport torch.nn as nn\n"
               "from lightning.pytorch.callbacks import Callback\nfrom lightning.pytorch.strategies import DDPStrategy\n"
               "from lightning.pytorch.utilities import rank_zero_only\n"
               "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
               "class Regressor(L.LightningModule):\n"
               "    def __init__(self):\n        super().__init__()\n"
               "        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n\n"
               "    def training_step(self, batch, batch_idx):\n        x, y = batch\n"
               "        return nn.functional.mse_loss(self.net(x), y)\n\n"
               "    def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.01)\n\n\n"
               f"{cb_helpers}class {cb}(Callback):\n{hook}\n\n"
               "def main():\n" + FW_DATA.format(n=16 * w) +
               f"    trainer = L.Trainer(accelerator=\"cpu\", devices={w}, max_epochs=3, logger=False,\n"
               "                        strategy=DDPStrategy(process_group_backend=\"gloo\", timeout=datetime.timedelta(seconds=60)),\n"
               "                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,\n"
               f"                        callbacks=[{cb}()])\n"
               "    trainer.fit(Regressor(), loader)\n\n\nif __name__ == \"__main__\":\n    main()\n")
    return Parts(program=program, code="DDP201", culprits=[0], form="lightning")


def k_hf_callback(r, w, names, placement) -> Parts:
    """The HF Trainer: a collective in a ``TrainerCallback`` hook under the world's process zero
    (``state.is_world_process_zero`` or ``args.process_index == 0``) at a step's end, a log or an epoch's end (DDP201
    on rank 0, at the test)."""
    cb = r.choice(("SyncCheckpoint", "GlobalLogger", "EvalHook", "PushMetrics"))
    who = r.choice(("state.is_world_process_zero", "args.process_index == 0"))
    op = r.choice(("torch.distributed.barrier()", "torch.distributed.all_reduce(torch.ones(1))"))
    if placement == "step_end":
        k = r.randrange(2, 4)
        hook = _ind(f"""
            def on_step_end(self, args, state, control, **kwargs):
                {_rank0_test(r, who, "state.global_step", k)}  {MARK}
                    {op}
        """, 4)
    else:
        hook = _ind(f"""
            def on_epoch_end(self, args, state, control, **kwargs):
                if {who}:  {MARK}
                    print("epoch", state.epoch, "done", flush=True)
                    {op}
        """, 4)
    program = ("import torch\nimport torch.nn as nn\n"
               "from transformers import Trainer, TrainerCallback, TrainingArguments\n\n\n"
               "class Regressor(nn.Module):\n"
               "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(8, 1)\n\n"
               "    def forward(self, x, labels=None):\n        out = self.lin(x).squeeze(-1)\n"
               "        return {\"loss\": nn.functional.mse_loss(out, labels), \"logits\": out}\n\n\n"
               "class Rows(torch.utils.data.Dataset):\n"
               "    def __len__(self):\n        return 64\n\n"
               "    def __getitem__(self, i):\n        x = torch.randn(8, generator=torch.Generator().manual_seed(i))\n"
               "        return {\"x\": x, \"labels\": x.sum()}\n\n\n"
               f"class {cb}(TrainerCallback):\n{hook}\n\n"
               "def main():\n"
               "    args = TrainingArguments(output_dir=\"out\", per_device_train_batch_size=4, num_train_epochs=3,\n"
               "                             use_cpu=True, ddp_backend=\"gloo\", report_to=[], save_strategy=\"no\",\n"
               "                             logging_strategy=\"no\", disable_tqdm=True, dataloader_num_workers=0)\n"
               f"    Trainer(model=Regressor(), args=args, train_dataset=Rows(), callbacks=[{cb}()]).train()\n\n\n"
               "if __name__ == \"__main__\":\n    main()\n")
    return Parts(program=program, code="DDP201", culprits=[0], form="hf")


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
    "no_sync_choice": (k_no_sync_choice, ("value", "if")),
    "time_budget": (k_time_budget, ("while", "break")),
    "thread_dies": (k_thread_dies, ("collective", "monitored")),
    "fabric_rank0": (k_fabric_rank0, ("inline", "helper", "setup")),
    "accelerate_main": (k_accelerate_main, ("inline", "helper", "epoch_end", "decorator")),
    "lightning_hook": (k_lightning_hook, ("batch_end", "epoch_end", "rank_zero_only", "rank_zero_helper")),
    "hf_callback": (k_hf_callback, ("step_end", "epoch_end")),
    "rank_dies": (k_rank_dies, ("helper", "module", "method", "exit", "exit_helper", "exit_module")),
    "mismatch": (k_mismatch, ("gather", "dtype")),
}
# the world sizes a kind is built for: a per-rank no_sync() choice needs a majority that agrees (3+ ranks); the
# frameworks' jobs are the slow ones (2-3 ranks); every other kind 2-4
WORLDS = {"no_sync_choice": (3, 3, 4), "fabric_rank0": (2, 2, 3), "accelerate_main": (2, 2, 3),
          "lightning_hook": (2, 2, 3), "hf_callback": (2, 2, 3)}


# the plain-loop kinds also run under Lightning Fabric and accelerate (launched by torchrun, they adopt its ranks):
# the framework wraps the model and the optimizer, the loop calls its backward
FORM_KINDS = {"skip_continue", "skip_return", "skip_except", "rank_collective", "forward_rank0", "early_stop",
              "uneven_count", "counter_continue", "time_budget", "empty_gather", "rank_dies", "mismatch"}
FORMS = ("ddp", "ddp", "fabric", "accelerate")
FORM_IMPORTS = {"fabric": "from lightning.fabric import Fabric\n",
                "accelerate": "from accelerate import Accelerator\nfrom accelerate.utils import InitProcessGroupKwargs\n"}
INIT = {"fabric": "    fabric = Fabric(accelerator=\"cpu\", strategy=\"ddp\", devices=int(os.environ[\"WORLD_SIZE\"]))\n"
                  "    fabric.launch()\n    rank = fabric.global_rank\n",
        "accelerate": "    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(\n"
                      "        backend=\"gloo\", timeout=datetime.timedelta(seconds=60))])\n"
                      "    rank = accelerator.process_index\n"}
SETUP = {"fabric": "fabric.setup", "accelerate": "accelerator.prepare"}


def form_obj(form: str) -> str:
    return {"fabric": "fabric", "accelerate": "accelerator"}[form]


def generate(seed: int) -> Job:
    r = random.Random(seed)
    kind = list(KINDS)[seed % len(KINDS)]
    make, placements = KINDS[kind]
    placement = r.choice(placements)
    w = r.choice(WORLDS.get(kind, (2, 2, 3, 4)))
    names = {"model": r.choice(MODELS), "step_fn": r.choice(STEP_FNS), "eval_fn": r.choice(EVAL_FNS),
             "sync_fn": r.choice(SYNC_FNS), "cls": r.choice(CLASSES), "module": r.choice(MODULES),
             "decorator": r.choice(DECORATORS)}
    parts = make(r, w, names, placement) if make.__code__.co_argcount == 4 else make(r, w, names)
    if parts.program is not None:
        return Job(seed, w, kind, placement, parts.form, {"job.py": parts.program}, parts.truth_file, parts.culprits,
                   parts.code)
    m = names["model"]
    layers = "nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)" if parts.batchnorm else \
        "nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)"
    steps = parts.steps.format(steps=r.randrange(14, 24))
    fsdp = ("from torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.fsdp import fully_shard\n") if parts.fsdp2 else ""
    form = r.choice(FORMS) if kind in FORM_KINDS else "fsdp2" if parts.fsdp2 else "ddp"
    if form == "fsdp2":
        setup = (f"    {m} = nn.Sequential({layers})\n"
                 "    mesh = init_device_mesh(\"cpu\", (dist.get_world_size(),))\n"
                 f"    for layer in {m}:\n        if isinstance(layer, nn.Linear):\n"
                 "            fully_shard(layer, mesh=mesh)\n"
                 f"    fully_shard({m}, mesh=mesh)\n"
                 f"    opt = torch.optim.SGD({m}.parameters(), lr=0.01)\n")
    elif form == "ddp":
        setup = f"    {m} = DDP(nn.Sequential({layers}))\n    opt = torch.optim.SGD({m}.parameters(), lr=0.01)\n"
    else:  # the framework wraps the model (in DDP) and the optimizer; its backward in the loop
        setup = (f"    net = nn.Sequential({layers})\n"
                 f"    {m}, opt = {SETUP[form]}(net, torch.optim.SGD(net.parameters(), lr=0.01))\n")
        parts.body = parts.body.replace("loss.backward()", f"{form_obj(form)}.backward(loss)")
    main = (f"{HEADER}{fsdp}{FORM_IMPORTS.get(form, '')}{parts.imports}\n\n{parts.helpers}\n\ndef main():\n"
            + INIT.get(form, "    dist.init_process_group(\"gloo\", timeout=datetime.timedelta(seconds=60))\n"
                             "    rank = dist.get_rank()\n") +
            "    torch.manual_seed(1234 + rank)\n"
            + setup +
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
    return Job(seed, w, kind, placement, form, files, parts.truth_file, parts.culprits, parts.code)


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
            echo(f"{flag:5} seed {j.seed:4} {j.nproc} ranks {j.form:10} {j.kind:21} {j.placement:14} want {j.code} {j.culprits} "
                 f"{j.truth_file}:{j.truth_line}  got {[(c, rs, os.path.basename(p or '-'), ln) for c, rs, p, ln in o.got]}"
                 + (f" CONTRADICTED {o.contradictions}" if o.contradictions else "") + (f" {o.note}" if o.note else "")
                 + f" {o.seconds:.1f}s")
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    def row(label, os_):
        n = len(os_)
        return (f"| {label} | {n} | {sum(o.code_ok for o in os_)} | {sum(o.ranks_ok for o in os_)} | "
                f"{sum(o.line_ok for o in os_)} | {sum(o.right for o in os_)} | {sum(bool(o.contradictions) for o in os_)} "
                f"| {sum(len(o.got) > 1 for o in os_)} |")
    # "more errors": jobs whose report has error findings besides the closest one -- a consequence (a rank gloo
    # aborted) or a wrong claim at another line; read them (the job lines print every one)
    lines = ["| kind / placement | jobs | code right | code + culprits right | code + line right | all right "
             "| contradicted | more errors |", "|---|---|---|---|---|---|---|---|", row("**all**", outcomes)]
    for form in sorted({o.job.form for o in outcomes}):
        lines.append(row(f"form: {form}", [o for o in outcomes if o.job.form == form]))
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
        print(f"# {j.nproc} ranks, {j.form}: {j.kind} / {j.placement}: want {j.code} on {j.culprits} at "
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
