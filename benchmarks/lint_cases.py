"""Lint cases with the truth known by construction (issue 36).

Writes small multi-file training projects into a temporary directory, each from a template of one rule's
hazard (DDP101-105, DDP201/202/206, DDP301-303, DDP401-403) placed at a random depth and in a random
form: inline, a helper of the same file, a method of a class in another module, a project decorator
that runs the function on the main process only, a factory returning a tuple or a dict, a registry or
configuration choice, a ``**kwargs`` dict, a framework hook (Lightning callback, Fabric, accelerate, a
Hugging Face ``Trainer`` subclass), an entry point under ``tools/`` or ``scripts/``.  Names are drawn
from realistic pools with a seeded RNG, so a seed always writes the same projects.

Each case records its truth: the rule and the line the template marks (``#@`` at the end of the line,
stripped before writing).  Each also writes its *correct twin*: the same project with the one fix.
Precision cases are clean projects full of look-alikes (step counters compared with totals, resume
skips next to a dict that accumulates the loss, rank-0 logging, agreed early stopping, a gather before
a decision, samplers of equal share).

Scoring: a case is *found* when a finding names the rule on the marked line; a twin or a look-alike is
a *false positive* when it reports the rule, or any error or warning.

    python benchmarks/lint_cases.py --n 500 --seed 1 [--keep DIR] [--show-misses]

The table counts, per rule and form: cases, found, missed, and false positives of the twins.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import textwrap
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MARK = "#@"


# ------------------------------------------------------------------ names ---
@dataclass
class Names:
    """The random but realistic names of one project (drawn once, shared by the broken tree and its twin)."""

    pkg: str
    utils: str
    engine: str
    data: str
    entry_dir: str
    model: str
    raw: str
    opt: str
    loader: str
    val_loader: str
    sampler: str
    dataset: str
    lr: str
    net: str
    sync: str
    save_fn: str
    eval_fn: str
    build_fn: str
    trainer: str
    deco: str
    is_main: str
    ckpt_cls: str
    cfg: str
    step_fn: str
    collate: str

    @classmethod
    def draw(cls, rng: random.Random) -> "Names":
        c = rng.choice
        return cls(
            pkg=c(["core", "trainlib", "proj", "src", "mylib", "fastrain", "lab", "seg"]),
            utils=c(["dist_utils", "comm", "distributed", "misc", "helpers", "ddp_utils"]),
            engine=c(["engine", "trainer", "runner", "loops", "solver"]),
            data=c(["data", "datasets", "loaders", "dataloading", "input_pipeline"]),
            entry_dir=c(["", "", "tools", "scripts"]),
            model=c(["model", "net", "ddp_model", "network", "module"]),
            raw=c(["base_model", "backbone", "core_net", "raw_model"]),
            opt=c(["optimizer", "opt", "optim"]),
            loader=c(["train_loader", "loader", "train_dl", "dataloader", "train_iter"]),
            val_loader=c(["val_loader", "eval_loader", "valid_dl", "test_loader"]),
            sampler=c(["sampler", "train_sampler", "dist_sampler"]),
            dataset=c(["dataset", "train_set", "train_ds", "ds"]),
            lr=c(["local_rank", "gpu", "device_id", "lrank"]),
            net=c(["Net", "Classifier", "Regressor", "TinyModel", "MLP"]),
            sync=c(["synchronize", "wait_for_everyone", "sync_all", "barrier_all", "all_wait"]),
            save_fn=c(["save_checkpoint", "dump_state", "persist", "write_ckpt", "save_all"]),
            eval_fn=c(["evaluate", "validate", "run_eval", "compute_metrics"]),
            build_fn=c(["build_loader", "make_dataloader", "get_loaders", "create_data", "build_data"]),
            trainer=c(["Trainer", "Runner", "Engine", "Solver", "Learner"]),
            deco=c(["main_process_only", "master_only", "only_on_master", "rank_zero", "leader_only",
                    "primary_only"]),
            is_main=c(["is_main_process", "is_master", "is_primary", "main_process"]),
            ckpt_cls=c(["Checkpointer", "CheckpointManager", "Saver", "StateKeeper"]),
            cfg=c(["args", "cfg", "opts", "config"]),
            step_fn=c(["train_step", "step", "forward_backward", "run_batch"]),
            collate=c(["collate_fn", "safe_collate", "collate_skip_bad", "pad_collate"]),
        )


def ded(text: str, indent: int = 0) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n") + "\n", " " * indent)


def pick(fixed: bool, bug: str, fix: str) -> str:
    """The bug's text (marked) in the broken tree, the fix's in the twin."""
    return fix if fixed else bug


def fb(fixed: bool, fix: str, bug: str) -> str:
    """:func:`pick` with the fix first (where the fix reads as the normal text)."""
    return fix if fixed else bug


# ---------------------------------------------------------- the scaffold ---
MODEL_PY = '''\
import torch
from torch import nn


class {net}(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.body(x)


def build_model(width=16):
    model = {net}(width)
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)
'''

DIST_PY = '''\
import functools

import torch.distributed as dist


def get_rank():
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank()


def {is_main}():
    return get_rank() == 0


def {sync}():
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def {deco}(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if get_rank() == 0:
            return fn(*args, **kwargs)
        return None
    return wrapper
'''


@dataclass
class Slots:
    """The parts of the training script a template replaces (indented as they stand in main())."""

    imports: str = ""
    helpers: str = ""
    init: str | None = None
    model: str | None = None
    data: str | None = None
    epoch_head: str | None = None
    batch: str | None = None
    after_epoch: str | None = None
    save: str | None = None
    end: str = ""
    loop: str | None = None  # replaces the whole epoch loop


def script(n: Names, s: Slots) -> str:
    """A clean torchrun training script of the project, with the template's slots filled in."""
    m, o, ld, sp, ds, lr = n.model, n.opt, n.loader, n.sampler, n.dataset, n.lr
    init = s.init if s.init is not None else ded(f'''
        dist.init_process_group("nccl")
        {lr} = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device({lr})''', 4)
    model = s.model if s.model is not None else ded(f'''
        {m} = DDP(build_model().cuda(), device_ids=[{lr}])
        {o} = torch.optim.AdamW({m}.parameters(), lr={n.cfg}.lr)''', 4)
    data = s.data if s.data is not None else ded(f'''
        {ds} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {sp} = DistributedSampler({ds}, shuffle=True)
        {ld} = DataLoader({ds}, batch_size={n.cfg}.batch_size, sampler={sp}, num_workers=4, pin_memory=True,
                        persistent_workers=True)''', 4)
    head = s.epoch_head if s.epoch_head is not None else ded(f"{sp}.set_epoch(epoch)", 8)
    batch = s.batch if s.batch is not None else ded(f'''
        x = x.cuda(non_blocking=True)
        y = y.cuda(non_blocking=True)
        loss = F.mse_loss({m}(x), y)
        {o}.zero_grad()
        loss.backward()
        {o}.step()''', 12)
    after = s.after_epoch or ""
    save = s.save if s.save is not None else ded(f'''
        if dist.get_rank() == 0:
            torch.save({m}.module.state_dict(), f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt")''', 8)
    loop = s.loop if s.loop is not None else (
        f"    for epoch in range({n.cfg}.epochs):\n{head}        {m}.train()\n"
        f"        for x, y in {ld}:\n{batch}{after}{save}")
    return (f'''import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from {n.pkg}.models import build_model
{s.imports}

def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--resume", default="")
    p.add_argument("--out", default="checkpoints")
    return p.parse_args()

{s.helpers}
def main({n.cfg}):
{init}{model}{data}{loop}{s.end}    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
''')


def base_files(n: Names) -> dict[str, str]:
    return {f"{n.pkg}/__init__.py": "", f"{n.pkg}/models.py": MODEL_PY.format(net=n.net),
            f"{n.pkg}/{n.utils}.py": DIST_PY.format(is_main=n.is_main, sync=n.sync, deco=n.deco)}


def entry(n: Names) -> str:
    return f"{n.entry_dir}/train.py" if n.entry_dir else "train.py"


def project(n: Names, s: Slots, extra: dict[str, str] | None = None) -> dict[str, str]:
    files = base_files(n)
    files[entry(n)] = script(n, s)
    files.update(extra or {})
    return files


# -------------------------------------------------------------- templates ---
# Each template: (names, rng, fixed) -> files.  The broken tree marks its one hazard line with MARK.
Template = Callable[[Names, random.Random, bool], dict[str, str]]
TEMPLATES: dict[tuple[str, str], Template] = {}


def template(code: str, form: str):
    def deco(fn: Template) -> Template:
        TEMPLATES[(code, form)] = fn
        return fn
    return deco


# ----- DDP101 uneven steps
@template("DDP101", "inline")
def _101_inline(n, rng, fixed):
    m, o = n.model, n.opt
    batch = ded(f'''
        x = x.cuda(non_blocking=True)
        y = y.cuda(non_blocking=True)
        loss = F.mse_loss({m}(x), y)''', 12) + pick(fixed, ded(f'''
        if not torch.isfinite(loss):
            continue  {MARK}''', 12), ded(f'''
        bad = (~torch.isfinite(loss)).float()
        dist.all_reduce(bad)
        if bad.item() > 0:
            continue''', 12)) + ded(f'''
        {o}.zero_grad()
        loss.backward()
        {o}.step()''', 12)
    return project(n, Slots(batch=batch))


@template("DDP101", "helper")
def _101_helper(n, rng, fixed):
    m, o = n.model, n.opt
    check = pick(fixed, "", (
        "    flag = torch.tensor([float(bad)], device=loss.device)\n"
        "    dist.all_reduce(flag)\n"
        "    bad = flag.item() > 0\n"))
    helpers = (f"def {n.step_fn}(model, x, y):\n"
               "    loss = F.mse_loss(model(x), y)\n"
               "    bad = not torch.isfinite(loss)\n"
               f"{check}"
               "    if bad:\n"
               "        return None\n"
               "    return loss\n")
    batch = ded(f'''
        loss = {n.step_fn}({m}, x.cuda(non_blocking=True), y.cuda(non_blocking=True))
        if loss is None:
            continue{"" if fixed else "  " + MARK}
        {o}.zero_grad()
        loss.backward()
        {o}.step()''', 12)
    return project(n, Slots(helpers=helpers + "\n", batch=batch))


def _trainer_module(n: Names, body_loop: str, extra_methods: str = "", imports: str = "") -> str:
    return f'''import torch
import torch.distributed as dist
import torch.nn.functional as F
{imports}

class {n.trainer}:
    def __init__(self, model, optimizer, loader, sampler, cfg):
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.sampler = sampler
        self.cfg = cfg

    def run_epoch(self, epoch):
        self.model.train()
{body_loop}
    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            self.run_epoch(epoch)
{extra_methods}'''


def _trainer_project(n: Names, module: str, main_tail: str = "", slots: Slots | None = None) -> dict[str, str]:
    s = slots or Slots()
    s.imports += f"from {n.pkg}.{n.engine} import {n.trainer}\n"
    s.loop = s.loop if s.loop is not None else ded(f"{n.trainer}({n.model}, {n.opt}, {n.loader}, {n.sampler}, "
                                                   f"{n.cfg}).fit()", 4) + main_tail
    return project(n, s, {f"{n.pkg}/{n.engine}.py": module})


@template("DDP101", "method")
def _101_method(n, rng, fixed):
    loop = ded(f'''
        for x, y in self.loader:
            loss = F.mse_loss(self.model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))''', 8) + pick(
        fixed, ded(f'''
        if torch.isnan(loss):
            continue  {MARK}''', 12), ded('''
        skip = torch.isnan(loss).float()
        dist.all_reduce(skip)
        if skip.item() > 0:
            continue''', 12)) + ded('''
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()''', 12)
    return _trainer_project(n, _trainer_module(n, loop))


def _eval_helper(n: Names) -> str:
    return ded(f'''
        def {n.eval_fn}(model, loader):
            model.eval()
            total = 0.0
            with torch.no_grad():
                for x, y in loader:
                    total += F.mse_loss(model(x.cuda()), y.cuda()).item()
            return total / max(len(loader), 1)
        ''')


def _val_data(n: Names) -> str:
    return ded(f'''
        val_set = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
        {n.val_loader} = DataLoader(val_set, batch_size=64)''', 4)


@template("DDP101", "early_stop_rank0")
def _101_early_stop(n, rng, fixed):
    m = n.model
    if fixed:
        after = ded(f'''
            stop = torch.zeros(1, device="cuda")
            if dist.get_rank() == 0:
                val = {n.eval_fn}({m}.module, {n.val_loader})
                if val < best:
                    best, bad_epochs = val, 0
                else:
                    bad_epochs += 1
                stop.fill_(float(bad_epochs >= {n.cfg}.patience))
            dist.broadcast(stop, 0)
            if stop.item() > 0:
                break''', 8)
    else:
        after = ded(f'''
            if dist.get_rank() == 0:
                val = {n.eval_fn}({m}.module, {n.val_loader})
                if val < best:
                    best, bad_epochs = val, 0
                else:
                    bad_epochs += 1
                if bad_epochs >= {n.cfg}.patience:
                    break  {MARK}''', 8)
    data = script_default_data(n) + _val_data(n) + ded("best, bad_epochs = float('inf'), 0", 4)
    return project(n, Slots(helpers=_eval_helper(n) + "\n", data=data, after_epoch=after))


@template("DDP101", "early_stop_counter")
def _101_early_stop_counter(n, rng, fixed):
    m = n.model
    after = ded(f'''
        if dist.get_rank() == 0:
            val = {n.eval_fn}({m}.module, {n.val_loader})
            if val < best:
                best, bad_epochs = val, 0
            else:
                bad_epochs += 1''', 8) + pick(fixed, ded(f'''
        if bad_epochs >= {n.cfg}.patience:
            break  {MARK}''', 8), ded(f'''
        stop = torch.tensor([bad_epochs], device="cuda")
        dist.broadcast(stop, src=0)
        if stop.item() >= {n.cfg}.patience:
            break''', 8))
    data = script_default_data(n) + _val_data(n) + ded("best, bad_epochs = float('inf'), 0", 4)
    return project(n, Slots(helpers=_eval_helper(n) + "\n", data=data, after_epoch=after))


@template("DDP101", "accelerate_early_stop")
def _101_accelerate(n, rng, fixed):
    m, o, ld = n.model, n.opt, n.loader
    stop = pick(fixed, f'''
        if accelerator.is_main_process:
            val = {n.eval_fn}(accelerator.unwrap_model({m}), {n.val_loader})
            bad_epochs = 0 if val < best else bad_epochs + 1
            best = min(best, val)
            if bad_epochs >= {n.cfg}.patience:
                break  {MARK}''', f'''
        flag = torch.tensor([0.0], device=accelerator.device)
        if accelerator.is_main_process:
            val = {n.eval_fn}(accelerator.unwrap_model({m}), {n.val_loader})
            bad_epochs = 0 if val < best else bad_epochs + 1
            best = min(best, val)
            flag += float(bad_epochs >= {n.cfg}.patience)
        flag = accelerator.reduce(flag, reduction="sum")
        if flag.item() > 0:
            break''')
    text = f'''import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from {n.pkg}.models import build_model


{_eval_helper(n)}

def main({n.cfg}):
    accelerator = Accelerator()
    {m} = build_model()
    {o} = torch.optim.AdamW({m}.parameters(), lr={n.cfg}.lr)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    {ld} = DataLoader(data, batch_size=32, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True)
    {n.val_loader} = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=64)
    {m}, {o}, {ld} = accelerator.prepare({m}, {o}, {ld})
    best, bad_epochs = float("inf"), 0
    for epoch in range({n.cfg}.epochs):
        {m}.train()
        for x, y in {ld}:
            loss = F.mse_loss({m}(x), y)
            {o}.zero_grad()
            accelerator.backward(loss)
            {o}.step()
{ded(stop, 8)}    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.save(accelerator.unwrap_model({m}).state_dict(), "final.pt")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--patience", type=int, default=3)
    main(p.parse_args())
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


def script_default_data(n: Names) -> str:
    return ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
        {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, num_workers=4,
                        pin_memory=True, persistent_workers=True)''', 4)


# ----- DDP102 sampler epoch never set
@template("DDP102", "inline")
def _102_inline(n, rng, fixed):
    data = ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True){"" if fixed else "  " + MARK}
        {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, num_workers=4,
                        pin_memory=True, persistent_workers=True)''', 4)
    return project(n, Slots(data=data, epoch_head=pick(fixed, "", ded(f"{n.sampler}.set_epoch(epoch)", 8))))


def _data_module(n: Names, ret: str, sampler_expr: str = "DistributedSampler(dataset, shuffle=shuffle)",
                 loader_opts: str = "num_workers=4, pin_memory=True, persistent_workers=True",
                 head: str = "", mark_sampler: bool = False) -> str:
    return f'''import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset
{head}

def {n.build_fn}(batch_size, shuffle=True):
    dataset = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    sampler = {sampler_expr}{"  " + MARK if mark_sampler else ""}
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, {loader_opts})
    return {ret}
'''


@template("DDP102", "factory_tuple")
def _102_tuple(n, rng, fixed):
    data = ded(f"{n.loader}, {n.sampler} = {n.build_fn}({n.cfg}.batch_size){'' if fixed else '  ' + MARK}", 4)
    return project(n, Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data,
                            epoch_head=pick(fixed, "", ded(f"{n.sampler}.set_epoch(epoch)", 8))),
                   {f"{n.pkg}/{n.data}.py": _data_module(n, "loader, sampler")})


@template("DDP102", "factory_dict")
def _102_dict(n, rng, fixed):
    data = ded(f"bundle = {n.build_fn}({n.cfg}.batch_size){'' if fixed else '  ' + MARK}\n"
               f"{n.loader} = bundle['loader']", 4)
    return project(n, Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data,
                            epoch_head=pick(fixed, "", ded("bundle['sampler'].set_epoch(epoch)", 8))),
                   {f"{n.pkg}/{n.data}.py": _data_module(n, '{"loader": loader, "sampler": sampler}')})


@template("DDP102", "registry")
def _102_registry(n, rng, fixed):
    head = '\nSAMPLERS = {"distributed": DistributedSampler, "random": RandomSampler}\n'
    mod = _data_module(n, "loader", sampler_expr='SAMPLERS[kind](dataset)', head=head)
    mod = mod.replace("(batch_size, shuffle=True)", '(batch_size, kind="distributed")')
    data = ded(f"{n.loader} = {n.build_fn}({n.cfg}.batch_size, kind='distributed'){'' if fixed else '  ' + MARK}", 4)
    return project(n, Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data,
                            epoch_head=pick(fixed, "", ded(f"{n.loader}.sampler.set_epoch(epoch)", 8))),
                   {f"{n.pkg}/{n.data}.py": mod})


@template("DDP102", "three_modules")
def _102_three(n, rng, fixed):
    """The loader is built in the data module, the loop is in the engine module, the script joins them."""
    data = ded(f"{n.loader} = {n.build_fn}({n.cfg}.batch_size){'' if fixed else '  ' + MARK}", 4)
    loop = ded('''
        for x, y in self.loader:
            loss = F.mse_loss(self.model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()''', 8)
    mod = _trainer_module(n, loop).replace("    def __init__(self, model, optimizer, loader, sampler, cfg):",
                                           "    def __init__(self, model, optimizer, loader, cfg):")
    mod = mod.replace("        self.sampler = sampler\n", "")
    mod = mod.replace("            self.sampler.set_epoch(epoch)\n",
                      pick(fixed, "", "            self.loader.sampler.set_epoch(epoch)\n"))
    s = Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data,
              loop=ded(f"{n.trainer}({n.model}, {n.opt}, {n.loader}, {n.cfg}).fit()", 4))
    files = _trainer_project(n, mod, slots=s)
    files[f"{n.pkg}/{n.data}.py"] = _data_module(n, "loader")
    return files


# ----- DDP103 shuffle=True with a sampler
@template("DDP103", "inline")
def _103_inline(n, rng, fixed):
    data = ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
        {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, {pick(fixed, "shuffle=True,  " + MARK, "")}
                        num_workers=4, pin_memory=True, persistent_workers=True)''', 4)
    data = data.replace(f",  {MARK}\n", f",\n").replace("shuffle=True,\n", f"shuffle=True,  {MARK}\n")
    # the mark goes on the call's first line
    lines = data.split("\n")
    data = "\n".join(ln.replace(f"  {MARK}", "") + (f"  {MARK}" if f"{n.loader} = DataLoader(" in ln and not fixed
                                                     else "") for ln in lines)
    return project(n, Slots(data=data))


@template("DDP103", "kwargs")
def _103_kwargs(n, rng, fixed):
    kw = rng.choice(["loader_kwargs", "dl_kwargs", "loader_cfg", "common"])
    data = ded(f'''
        {kw} = dict(batch_size={n.cfg}.batch_size, shuffle={"False" if fixed else "True"}, num_workers=4, pin_memory=True,
                  persistent_workers=True)
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
        {n.loader} = DataLoader({n.dataset}, sampler={n.sampler}, **{kw}){"" if fixed else "  " + MARK}''', 4)
    return project(n, Slots(data=data))


@template("DDP103", "kwargs_module")
def _103_kwargs_module(n, rng, fixed):
    data = ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
        {n.loader} = DataLoader({n.dataset}, sampler={n.sampler}, **LOADER_KWARGS){"" if fixed else "  " + MARK}''', 4)
    conf = (f'LOADER_KWARGS = {{"batch_size": 32, "shuffle": {"False" if fixed else "True"}, "num_workers": 4, '
            f'"pin_memory": True, "persistent_workers": True}}\n')
    return project(n, Slots(imports=f"from {n.pkg}.settings import LOADER_KWARGS\n", data=data),
                   {f"{n.pkg}/settings.py": conf})


@template("DDP103", "factory")
def _103_factory(n, rng, fixed):
    mod = _data_module(n, "loader, sampler",
                       loader_opts=pick(fixed, "shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True",
                                        "num_workers=4, pin_memory=True, persistent_workers=True"))
    if not fixed:
        mod = mod.replace("    loader = DataLoader(", f"    loader = DataLoader(", 1)
        mod = "\n".join(ln + f"  {MARK}" if ln.startswith("    loader = DataLoader(") else ln for ln in mod.split("\n"))
    data = ded(f"{n.loader}, {n.sampler} = {n.build_fn}({n.cfg}.batch_size)", 4)
    return project(n, Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data),
                   {f"{n.pkg}/{n.data}.py": mod})


# ----- DDP104 collate_fn may return None
def _collate_def(n: Names, fixed: bool, indent: int = 0) -> str:
    return ded(f'''
        def {n.collate}(batch):
            batch = [b for b in batch if b is not None]
            if not batch:
        {pick(fixed, "        return None  " + MARK, '        raise ValueError("every sample of the batch failed to load")')}
            return default_collate(batch)
        ''', indent)


def _collate_project(n: Names, fixed: bool, where: str) -> dict[str, str]:
    data = ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
        {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, num_workers=4,
                        pin_memory=True, persistent_workers=True, collate_fn={n.collate})''', 4)
    if where == "helper":
        return project(n, Slots(imports="from torch.utils.data import default_collate\n",
                                helpers=_collate_def(n, fixed) + "\n", data=data))
    mod = "from torch.utils.data import default_collate\n\n\n" + _collate_def(n, fixed)
    return project(n, Slots(imports=f"from {n.pkg}.collate import {n.collate}\n", data=data),
                   {f"{n.pkg}/collate.py": mod})


@template("DDP104", "helper")
def _104_helper(n, rng, fixed):
    return _collate_project(n, fixed, "helper")


@template("DDP104", "module")
def _104_module(n, rng, fixed):
    return _collate_project(n, fixed, "module")


# ----- DDP105 no DistributedSampler
@template("DDP105", "inline")
def _105_inline(n, rng, fixed):
    data = ded(f'''
        {n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
        {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)''', 4) if fixed else ded(
        f"{n.dataset} = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))", 4)
    opt = f"sampler={n.sampler}" if fixed else "shuffle=True"
    data += ded(f'''
        {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, {opt}, num_workers=4, pin_memory=True,{"" if fixed else "  " + MARK}
                        persistent_workers=True)''', 4)
    return project(n, Slots(data=data, epoch_head=pick(fixed, "", ded(f"{n.sampler}.set_epoch(epoch)", 8))))


@template("DDP105", "factory")
def _105_factory(n, rng, fixed):
    mod = _data_module(n, "loader, sampler", sampler_expr=pick(fixed, "None", "DistributedSampler(dataset, shuffle=shuffle)"),
                       loader_opts=pick(fixed, "shuffle=shuffle, num_workers=4, pin_memory=True, persistent_workers=True",
                                        "num_workers=4, pin_memory=True, persistent_workers=True"))
    if not fixed:
        mod = "\n".join(ln + f"  {MARK}" if ln.startswith("    loader = DataLoader(") else ln for ln in mod.split("\n"))
    data = ded(f"{n.loader}, {n.sampler} = {n.build_fn}({n.cfg}.batch_size)", 4)
    head = pick(fixed, "", ded(f"{n.sampler}.set_epoch(epoch)", 8))
    return project(n, Slots(imports=f"from {n.pkg}.{n.data} import {n.build_fn}\n", data=data, epoch_head=head),
                   {f"{n.pkg}/{n.data}.py": mod})


# ----- DDP201 collective on a subset of ranks
def _save_block(n: Names) -> str:
    return f'torch.save({n.model}.module.state_dict(), f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt")'


@template("DDP201", "inline")
def _201_inline(n, rng, fixed):
    save = ded(f'''
        if dist.get_rank() == 0:
            {_save_block(n)}''', 8) + fb(fixed, ded("dist.barrier()", 8), ded(f"dist.barrier()  {MARK}", 12))
    return project(n, Slots(save=save))


@template("DDP201", "helper")
def _201_helper(n, rng, fixed):
    helpers = ded(f'''
        def {n.save_fn}(model, path):
            torch.save(model.module.state_dict(), path)
            {fb(fixed, "pass", "dist.barrier()")}
        ''') + "\n"
    save = ded(f'''
        if dist.get_rank() == 0:
            {n.save_fn}({n.model}, f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt"){fb(fixed, "", "  " + MARK)}''', 8) + pick(
        fixed, ded("dist.barrier()", 8), "")
    return project(n, Slots(helpers=helpers, save=save))


@template("DDP201", "other_module")
def _201_other_module(n, rng, fixed):
    mod = f'''import torch

from .{n.utils} import {n.sync}


def {n.save_fn}(model, path):
    torch.save(model.module.state_dict(), path)
    {fb(fixed, "return path", f"{n.sync}()")}
'''
    cond = rng.choice([f"{n.is_main}()", "dist.get_rank() == 0", f"{n.lr} == 0"])
    save = ded(f'''
        if {cond}:
            {n.save_fn}({n.model}, f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt"){fb(fixed, "", "  " + MARK)}''', 8) + pick(
        fixed, ded(f"{n.sync}()", 8), "")
    return project(n, Slots(imports=f"from {n.pkg}.checkpoint import {n.save_fn}\n"
                                    f"from {n.pkg}.{n.utils} import {n.is_main}, {n.sync}\n", save=save),
                   {f"{n.pkg}/checkpoint.py": mod})


@template("DDP201", "decorator")
def _201_decorator(n, rng, fixed):
    mod = f'''import torch

from .{n.utils} import {n.deco}, {n.sync}


@{n.deco}
def {n.save_fn}(model, path):
    torch.save(model.module.state_dict(), path)
    {fb(fixed, "return path", f"{n.sync}()  " + MARK)}
'''
    save = ded(f'{n.save_fn}({n.model}, f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt")', 8) + fb(fixed, ded(f"{n.sync}()", 8), "")
    return project(n, Slots(imports=f"from {n.pkg}.checkpoint import {n.save_fn}\n"
                                    f"from {n.pkg}.{n.utils} import {n.sync}\n", save=save),
                   {f"{n.pkg}/checkpoint.py": mod})


@template("DDP201", "method")
def _201_method(n, rng, fixed):
    mod = f'''import os

import torch
import torch.distributed as dist


class {n.ckpt_cls}:
    def __init__(self, directory):
        self.directory = directory

    def save(self, model, epoch):
        torch.save(model.module.state_dict(), os.path.join(self.directory, f"epoch_{{epoch}}.pt"))
        {fb(fixed, "return epoch", "dist.barrier()")}
'''
    data = script_default_data(n) + ded(f"saver = {n.ckpt_cls}({n.cfg}.out)", 4)
    save = ded(f'''
        if dist.get_rank() == 0:
            saver.save({n.model}, epoch){fb(fixed, "", "  " + MARK)}''', 8) + fb(fixed, ded("dist.barrier()", 8), "")
    return project(n, Slots(imports=f"from {n.pkg}.checkpoint import {n.ckpt_cls}\n", data=data, save=save),
                   {f"{n.pkg}/checkpoint.py": mod})


@template("DDP201", "hf_trainer")
def _201_hf(n, rng, fixed):
    cond = rng.choice(["self.is_world_process_zero()", "self.args.process_index == 0", "self.args.local_rank in (-1, 0)"])
    mod = f'''import os

import torch
import torch.distributed as dist
from transformers import Trainer


class Custom{n.trainer}(Trainer):
    def _save_extra_state(self, output_dir):
        torch.save(self.model.state_dict(), os.path.join(output_dir, "extra.pt"))
        {fb(fixed, "return output_dir", "dist.barrier()")}

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if {cond}:
            self._save_extra_state(output_dir or self.args.output_dir){fb(fixed, "", "  " + MARK)}
{fb(fixed, "        dist.barrier()" + chr(10), "")}'''
    main = f'''import torch
import torch.distributed as dist
from transformers import TrainingArguments

from {n.pkg}.hf_trainer import Custom{n.trainer}
from {n.pkg}.models import build_model


def main():
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8)
    trainer = Custom{n.trainer}(model=build_model(), args=args)
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
'''
    files = base_files(n)
    files[f"{n.pkg}/hf_trainer.py"] = mod
    files[entry(n)] = main
    return files


@template("DDP201", "accelerate")
def _201_accelerate(n, rng, fixed):
    m = n.model
    text = f'''import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from {n.pkg}.models import build_model


def main():
    accelerator = Accelerator()
    {m} = build_model()
    {n.opt} = torch.optim.AdamW({m}.parameters(), lr=1e-3)
    {n.loader} = DataLoader(TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1)), batch_size=32, shuffle=True,
                            num_workers=4, pin_memory=True, persistent_workers=True)
    {m}, {n.opt}, {n.loader} = accelerator.prepare({m}, {n.opt}, {n.loader})
    for epoch in range(10):
        for x, y in {n.loader}:
            loss = F.mse_loss({m}(x), y)
            {n.opt}.zero_grad()
            accelerator.backward(loss)
            {n.opt}.step()
        if accelerator.is_main_process:
            accelerator.save(accelerator.unwrap_model({m}).state_dict(), f"epoch_{{epoch}}.pt")
{fb(fixed, "        accelerator.wait_for_everyone()", "            accelerator.wait_for_everyone()  " + MARK)}


if __name__ == "__main__":
    main()
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


@template("DDP201", "lightning_callback")
def _201_lightning(n, rng, fixed):
    mod = f'''import os

import torch
from lightning.pytorch.callbacks import Callback


class Export{n.trainer}(Callback):
    def __init__(self, directory):
        self.directory = directory

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), os.path.join(self.directory, "export.pt"))
{fb(fixed, "        trainer.strategy.barrier()", "            trainer.strategy.barrier()  " + MARK)}
'''
    main = f'''import lightning.pytorch as pl

from {n.pkg}.callbacks import Export{n.trainer}
from {n.pkg}.lit import LitModel


def main():
    trainer = pl.Trainer(accelerator="gpu", devices=4, strategy="ddp", max_epochs=10,
                         callbacks=[Export{n.trainer}("exports")])
    trainer.fit(LitModel())


if __name__ == "__main__":
    main()
'''
    lit = f'''import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from .models import build_model


class LitModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = build_model()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
'''
    files = base_files(n)
    files.update({f"{n.pkg}/callbacks.py": mod, f"{n.pkg}/lit.py": lit, entry(n): main})
    return files


@template("DDP201", "fabric")
def _201_fabric(n, rng, fixed):
    m, o = n.model, n.opt
    text = f'''import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

from {n.pkg}.models import build_model


def main():
    fabric = Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    {m} = build_model()
    {o} = torch.optim.AdamW({m}.parameters(), lr=1e-3)
    {m}, {o} = fabric.setup({m}, {o})
    {n.loader} = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1)),
                                           batch_size=32, shuffle=True, num_workers=4, pin_memory=True,
                                           persistent_workers=True))
    for epoch in range(10):
        for x, y in {n.loader}:
            loss = F.mse_loss({m}(x), y)
            {o}.zero_grad()
            fabric.backward(loss)
            {o}.step()
        if fabric.global_rank == 0:
            torch.save({m}.state_dict(), f"epoch_{{epoch}}.pt")
{fb(fixed, "        fabric.barrier()", "            fabric.barrier()  " + MARK)}


if __name__ == "__main__":
    main()
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


# ----- DDP202 DDP forward on a subset of ranks
@template("DDP202", "inline")
def _202_inline(n, rng, fixed):
    after = ded(f'''
        if dist.get_rank() == 0:
            {n.model}.eval()
            with torch.no_grad():
                for vx, vy in {n.val_loader}:
                    out = {fb(fixed, n.model + ".module", n.model)}(vx.cuda()){fb(fixed, "", "  " + MARK)}
                    print(F.mse_loss(out, vy.cuda()).item())''', 8)
    data = script_default_data(n) + _val_data(n)
    return project(n, Slots(data=data, after_epoch=after))


@template("DDP202", "helper")
def _202_helper(n, rng, fixed):
    after = ded(f'''
        if dist.get_rank() == 0:
            print({n.eval_fn}({fb(fixed, n.model + ".module", n.model)}, {n.val_loader})){fb(fixed, "", "  " + MARK)}''', 8)
    data = script_default_data(n) + _val_data(n)
    return project(n, Slots(helpers=_eval_helper(n) + "\n", data=data, after_epoch=after))


@template("DDP202", "other_module")
def _202_other(n, rng, fixed):
    mod = "import torch\nimport torch.nn.functional as F\n\n\n" + _eval_helper(n)
    cond = rng.choice([f"{n.is_main}()", "dist.get_rank() == 0", f"{n.lr} == 0"])
    after = ded(f'''
        if {cond}:
            metric = {n.eval_fn}({fb(fixed, n.model + ".module", n.model)}, {n.val_loader}){fb(fixed, "", "  " + MARK)}
            print(f"epoch {{epoch}}: {{metric:.4f}}")''', 8)
    data = script_default_data(n) + _val_data(n)
    return project(n, Slots(imports=f"from {n.pkg}.evaluation import {n.eval_fn}\n"
                                    f"from {n.pkg}.{n.utils} import {n.is_main}\n", data=data, after_epoch=after),
                   {f"{n.pkg}/evaluation.py": mod})


@template("DDP202", "trainer_mixin")
def _202_trainer_mixin(n, rng, fixed):
    """A trainer class spread over two files: the loop in one, validation in a mixin of another."""
    mixin = f'''import torch
import torch.nn.functional as F


class EvalMixin:
    def {n.eval_fn}(self):
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in self.val_loader:
                total += F.mse_loss({fb(fixed, "self.model.module", "self.model")}(x.cuda()), y.cuda()).item()
        return total
'''
    loop = ded('''
        for x, y in self.loader:
            loss = F.mse_loss(self.model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()''', 8)
    extra = f'''        if dist.get_rank() == 0:
            print(self.{n.eval_fn}()){fb(fixed, "", "  " + MARK)}
'''
    mod = _trainer_module(n, loop, imports="\nfrom .eval_mixin import EvalMixin\n")
    mod = mod.replace(f"class {n.trainer}:", f"class {n.trainer}(EvalMixin):")
    mod = mod.replace("        self.cfg = cfg\n", "        self.cfg = cfg\n        self.val_loader = cfg.val_loader\n")
    mod = mod.replace("            self.run_epoch(epoch)\n", "            self.run_epoch(epoch)\n    " + extra.replace("\n        ", "\n            "))
    files = _trainer_project(n, mod)
    files[f"{n.pkg}/eval_mixin.py"] = mixin
    return files


@template("DDP202", "accelerate")
def _202_accelerate(n, rng, fixed):
    m = n.model
    text = f'''import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from {n.pkg}.models import build_model


def main():
    accelerator = Accelerator()
    {m} = build_model()
    {n.opt} = torch.optim.AdamW({m}.parameters(), lr=1e-3)
    {n.loader} = DataLoader(TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1)), batch_size=32, shuffle=True,
                            num_workers=4, pin_memory=True, persistent_workers=True)
    {n.val_loader} = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=64)
    {m}, {n.opt}, {n.loader} = accelerator.prepare({m}, {n.opt}, {n.loader})
    for epoch in range(10):
        {m}.train()
        for x, y in {n.loader}:
            loss = F.mse_loss({m}(x), y)
            {n.opt}.zero_grad()
            accelerator.backward(loss)
            {n.opt}.step()
        if accelerator.is_main_process:
            {m}.eval()
            with torch.no_grad():
                for vx, vy in {n.val_loader}:
                    pred = {fb(fixed, "accelerator.unwrap_model(" + m + ")", m)}(vx.to(accelerator.device)){fb(fixed, "", "  " + MARK)}
                    accelerator.print(F.mse_loss(pred, vy.to(accelerator.device)).item())


if __name__ == "__main__":
    main()
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


# ----- DDP301 torch.load without map_location
@template("DDP301", "inline")
def _301_inline(n, rng, fixed):
    end = ""
    model = ded(f'''
        {n.raw} = build_model()
        if {n.cfg}.resume:
            {n.raw}.load_state_dict(torch.load({n.cfg}.resume{fb(fixed, ', map_location="cpu"))', '))  ' + MARK)}
        {n.model} = DDP({n.raw}.cuda(), device_ids=[{n.lr}])
        {n.opt} = torch.optim.AdamW({n.model}.parameters(), lr={n.cfg}.lr)''', 4)
    return project(n, Slots(model=model))


@template("DDP301", "other_module")
def _301_other(n, rng, fixed):
    mod = f'''import torch


def load_weights(model, path):
    state = torch.load(path{fb(fixed, ', map_location="cpu")', ')  ' + MARK)}
    model.load_state_dict(state["model"])
    return state.get("epoch", 0)
'''
    model = ded(f'''
        {n.raw} = build_model()
        if {n.cfg}.resume:
            load_weights({n.raw}, {n.cfg}.resume)
        {n.model} = DDP({n.raw}.cuda(), device_ids=[{n.lr}])
        {n.opt} = torch.optim.AdamW({n.model}.parameters(), lr={n.cfg}.lr)''', 4)
    return project(n, Slots(imports=f"from {n.pkg}.checkpoint import load_weights\n", model=model),
                   {f"{n.pkg}/checkpoint.py": mod})


# ----- DDP302 CUDA before set_device
@template("DDP302", "before_set_device")
def _302_before(n, rng, fixed):
    lr = n.lr
    init = ded(f'''
        dist.init_process_group("nccl")
        {lr} = int(os.environ["LOCAL_RANK"])''', 4)
    if fixed:
        init += ded(f"torch.cuda.set_device({lr})", 4)
    model = ded(f"{n.raw} = build_model().cuda(){'' if fixed else '  ' + MARK}", 4)
    if not fixed:
        model += ded(f"torch.cuda.set_device({lr})", 4)
    model += ded(f'''
        {n.model} = DDP({n.raw}, device_ids=[{lr}])
        {n.opt} = torch.optim.AdamW({n.model}.parameters(), lr={n.cfg}.lr)''', 4)
    return project(n, Slots(init=init, model=model))


@template("DDP302", "never_set")
def _302_never(n, rng, fixed):
    lr = n.lr
    init = ded(f'''
        dist.init_process_group("nccl")
        {lr} = int(os.environ["LOCAL_RANK"])''', 4) + pick(fixed, "", ded(f"torch.cuda.set_device({lr})", 4))
    if not fixed:
        init = init[:-1] + "\n"
    model = ded(f'''
        {n.model} = DDP(build_model().cuda(), device_ids=[{lr}]){"" if fixed else "  " + MARK}
        {n.opt} = torch.optim.AdamW({n.model}.parameters(), lr={n.cfg}.lr)''', 4)
    return project(n, Slots(init=init, model=model))


@template("DDP302", "spawn_worker")
def _302_spawn(n, rng, fixed):
    m = n.model
    text = f'''import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from {n.pkg}.models import build_model


def worker(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
{fb(fixed, "    torch.cuda.set_device(rank)" + chr(10), "")}    {m} = DDP(build_model().cuda(), device_ids=[rank]){fb(fixed, "", "  " + MARK)}
    {n.opt} = torch.optim.SGD({m}.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    {n.sampler} = DistributedSampler(data)
    {n.loader} = DataLoader(data, batch_size=32, sampler={n.sampler}, num_workers=4, pin_memory=True,
                            persistent_workers=True)
    for epoch in range(10):
        {n.sampler}.set_epoch(epoch)
        for x, y in {n.loader}:
            loss = F.mse_loss({m}(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
            {n.opt}.zero_grad()
            loss.backward()
            {n.opt}.step()
    if rank == 0:
        torch.save({m}.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    n_gpus = torch.cuda.device_count()
    mp.spawn(worker, args=(n_gpus,), nprocs=n_gpus)
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


# ----- DDP206 launch outside the entry
@template("DDP206", "constructor")
def _206_constructor(n, rng, fixed):
    m = n.model
    mod = f'''import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from .models import build_model


class {n.trainer}:
    def __init__(self, rank, world_size):
{fb(fixed, "", "        dist.init_process_group('nccl', rank=rank, world_size=world_size)  " + MARK + chr(10))}        torch.cuda.set_device(rank)
        self.rank = rank
        self.model = DDP(build_model().cuda(), device_ids=[rank])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x, y):
        loss = F.mse_loss(self.model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
'''
    text = f'''import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from {n.pkg}.{n.engine} import {n.trainer}


def worker(rank, world_size):
{fb(fixed, "    dist.init_process_group('nccl', rank=rank, world_size=world_size)" + chr(10), "")}    trainer = {n.trainer}(rank, world_size)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    {n.sampler} = DistributedSampler(data)
    {n.loader} = DataLoader(data, batch_size=32, sampler={n.sampler}, num_workers=4, pin_memory=True,
                            persistent_workers=True)
    for epoch in range(10):
        {n.sampler}.set_epoch(epoch)
        for x, y in {n.loader}:
            trainer.step(x, y)
    if rank == 0:
        torch.save(trainer.model.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    n_gpus = torch.cuda.device_count()
    mp.spawn(worker, args=(n_gpus,), nprocs=n_gpus)
'''
    files = base_files(n)
    files[f"{n.pkg}/{n.engine}.py"] = mod
    files[entry(n)] = text
    return files


# ----- DDP303 torch.save on every rank
@template("DDP303", "inline")
def _303_inline(n, rng, fixed):
    save = fb(fixed, ded(f'''
        if dist.get_rank() == 0:
            {_save_block(n)}''', 8), ded(f"{_save_block(n)}  {MARK}", 8))
    return project(n, Slots(save=save))


@template("DDP303", "other_module")
def _303_other(n, rng, fixed):
    mod = f'''import torch


def {n.save_fn}(model, path):
    torch.save(model.module.state_dict(), path)
'''
    save = fb(fixed, ded(f'''
        if dist.get_rank() == 0:
            {n.save_fn}({n.model}, f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt")''', 8),
                ded(f'{n.save_fn}({n.model}, f"{{{n.cfg}.out}}/epoch_{{epoch}}.pt")  {MARK}', 8))
    return project(n, Slots(imports=f"from {n.pkg}.checkpoint import {n.save_fn}\n", save=save),
                   {f"{n.pkg}/checkpoint.py": mod})


# ----- DDP401-403 loader performance
def _file_dataset(n: Names) -> str:
    return '''import torch
from PIL import Image
from torch.utils.data import Dataset


class ImageFiles(Dataset):
    def __init__(self, paths, labels):
        self.paths = paths
        self.labels = labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        img = Image.open(self.paths[i]).convert("RGB").resize((16, 1))
        x = torch.tensor(list(img.getdata()), dtype=torch.float32).mean(dim=1)
        return x, torch.tensor([float(self.labels[i])])
'''


def _perf_project(n: Names, rng: random.Random, fixed: bool, code: str, form: str) -> dict[str, str]:
    good = {"DDP401": "num_workers=8", "DDP402": "pin_memory=True", "DDP403": "persistent_workers=True"}
    opts = ["num_workers=4", "pin_memory=True", "persistent_workers=True"]
    if code == "DDP401":
        opts = ["num_workers=0", "pin_memory=True"] if not fixed else ["num_workers=8", "pin_memory=True",
                                                                      "persistent_workers=True"]
    elif not fixed:
        opts.remove(good[code])
    dataset = f"ImageFiles(sorted(glob.glob(os.path.join({n.cfg}.out, '*.jpg'))), [0] * 4096)"
    imports = f"import glob\n\nfrom {n.pkg}.images import ImageFiles\n"
    extra = {f"{n.pkg}/images.py": _file_dataset(n)}
    mark = "" if fixed else "  " + MARK
    if form == "inline":
        data = ded(f'''
            {n.dataset} = {dataset}
            {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
            {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, {", ".join(opts)}){mark}''', 4)
    elif form == "kwargs":
        kw = ", ".join(o.replace("=", '": ').join(['"', '']) for o in opts)
        data = ded(f'''
            {n.dataset} = {dataset}
            {n.sampler} = DistributedSampler({n.dataset}, shuffle=True)
            opts = {{{kw}}}
            {n.loader} = DataLoader({n.dataset}, batch_size={n.cfg}.batch_size, sampler={n.sampler}, **opts){mark}''', 4)
    else:  # factory in the data module
        mod = f'''import torch
from torch.utils.data import DataLoader, DistributedSampler

from .images import ImageFiles


def {n.build_fn}(paths, batch_size):
    dataset = ImageFiles(paths, [0] * len(paths))
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, {", ".join(opts)}){mark}
    return loader, sampler
'''
        extra[f"{n.pkg}/{n.data}.py"] = mod
        imports += f"from {n.pkg}.{n.data} import {n.build_fn}\n"
        data = ded(f"{n.loader}, {n.sampler} = {n.build_fn}(sorted(glob.glob(os.path.join({n.cfg}.out, '*.jpg'))), "
                   f"{n.cfg}.batch_size)", 4)
    return project(n, Slots(imports=imports, data=data), extra)


for _code in ("DDP401", "DDP402", "DDP403"):
    for _form in ("inline", "kwargs", "factory"):
        TEMPLATES[(_code, _form)] = (lambda c, f: lambda n, rng, fixed: _perf_project(n, rng, fixed, c, f))(_code, _form)


# ------------------------------------------------------- clean look-alikes ---
LOOKALIKES: dict[str, Callable[[Names, random.Random], dict[str, str]]] = {}


def lookalike(name: str):
    def deco(fn):
        LOOKALIKES[name] = fn
        return fn
    return deco


@lookalike("step_equals_total")
def _la_steps(n, rng):
    total = rng.choice(["num_iterations", "max_steps", "total_steps", "num_train_steps"])
    m, o = n.model, n.opt
    loop = ded(f'''
        step = 0
        {total} = {n.cfg}.epochs * len({n.loader})
        for epoch in range({n.cfg}.epochs):
            {n.sampler}.set_epoch(epoch)
            for x, y in {n.loader}:
                loss = F.mse_loss({m}(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                {o}.zero_grad()
                loss.backward()
                {o}.step()
                step += 1
                if step % 100 == 0 and dist.get_rank() == 0:
                    print(f"step {{step}}/{{{total}}} loss {{loss.item():.4f}}")
                if step == {total}:
                    {n.sync}()
                    if dist.get_rank() == 0:
                        torch.save({m}.module.state_dict(), "final.pt")
                    break''', 4)
    return project(n, Slots(imports=f"from {n.pkg}.{n.utils} import {n.sync}\n", loop=loop))


@lookalike("resume_skip")
def _la_resume(n, rng):
    st = rng.choice(["state", "train_state", "progress", "meta"])
    m, o = n.model, n.opt
    loop = ded(f'''
        {st} = {{"epoch": 0, "epoch_step": 0, "loss_sum": 0.0}}
        if {n.cfg}.resume:
            {st}.update(torch.load({n.cfg}.resume, map_location="cpu")["{st}"])
        for epoch in range({st}["epoch"], {n.cfg}.epochs):
            {n.sampler}.set_epoch(epoch)
            for i_step, (x, y) in enumerate({n.loader}):
                if i_step < {st}["epoch_step"]:
                    continue
                loss = F.mse_loss({m}(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                {o}.zero_grad()
                loss.backward()
                {o}.step()
                {st}["loss_sum"] += loss.item()
                {st}["epoch_step"] = i_step + 1
            {st}["epoch"], {st}["epoch_step"] = epoch + 1, 0
            if dist.get_rank() == 0:
                torch.save({{"model": {m}.module.state_dict(), "{st}": {st}}}, "last.pt")''', 4)
    return project(n, Slots(loop=loop))


@lookalike("rank0_logging")
def _la_logging(n, rng):
    after = ded(f'''
        if dist.get_rank() == 0:
            print(f"epoch {{epoch}} loss {{loss.item():.4f}}")
        if {n.is_main}():
            with open("log.txt", "a") as fh:
                fh.write(f"{{epoch}}\\n")''', 8)
    return project(n, Slots(imports=f"from {n.pkg}.{n.utils} import {n.is_main}\n", after_epoch=after))


@lookalike("agreed_early_stop")
def _la_agreed(n, rng):
    return _101_early_stop(n, rng, True)


@lookalike("agreed_skip")
def _la_agreed_skip(n, rng):
    return _101_inline(n, rng, True)


@lookalike("accelerate_gather")
def _la_gather(n, rng):
    m, o = n.model, n.opt
    text = f'''import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from {n.pkg}.models import build_model


def main():
    accelerator = Accelerator()
    {m} = build_model()
    {o} = torch.optim.AdamW({m}.parameters(), lr=1e-3)
    {n.loader} = DataLoader(TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1)), batch_size=32, shuffle=True,
                            num_workers=4, pin_memory=True, persistent_workers=True)
    {n.val_loader} = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=64)
    {m}, {o}, {n.loader}, {n.val_loader} = accelerator.prepare({m}, {o}, {n.loader}, {n.val_loader})
    best, bad_epochs = float("inf"), 0
    for epoch in range(100):
        {m}.train()
        for x, y in {n.loader}:
            loss = F.mse_loss({m}(x), y)
            {o}.zero_grad()
            accelerator.backward(loss)
            {o}.step()
        {m}.eval()
        losses = []
        with torch.no_grad():
            for vx, vy in {n.val_loader}:
                losses.append(accelerator.gather(F.mse_loss({m}(vx), vy, reduction="none")))
        val = torch.cat(losses).mean().item()
        if val < best:
            best, bad_epochs = val, 0
            accelerator.wait_for_everyone()
            accelerator.save_state("best")
        else:
            bad_epochs += 1
        if bad_epochs >= 5:
            break


if __name__ == "__main__":
    main()
'''
    files = base_files(n)
    files[entry(n)] = text
    return files


@lookalike("equal_share_steps")
def _la_equal_share(n, rng):
    m, o = n.model, n.opt
    loop = ded(f'''
        steps_per_epoch = len({n.loader})
        for epoch in range({n.cfg}.epochs):
            {n.sampler}.set_epoch(epoch)
            it = iter({n.loader})
            for i in range(steps_per_epoch):
                x, y = next(it)
                loss = F.mse_loss({m}(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                {o}.zero_grad()
                loss.backward()
                {o}.step()
                if i == steps_per_epoch - 1:
                    dist.all_reduce(loss.detach())''', 4)
    return project(n, Slots(loop=loop))


@lookalike("rank0_save_then_barrier")
def _la_save_barrier(n, rng):
    return _201_other_module(n, rng, True)


# ---------------------------------------------------------------- runner ---
@dataclass
class Case:
    index: int
    code: str
    form: str
    files: dict[str, str]
    truth: tuple[str, int] | None  # (path, line) of the hazard; None for a twin or a look-alike
    kind: str  # "bug", "twin" or "lookalike"


def strip_marks(files: dict[str, str]) -> tuple[dict[str, str], list[tuple[str, int]]]:
    out, marks = {}, []
    for path, text in files.items():
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.rstrip().endswith(MARK):
                marks.append((path, i + 1))
                lines[i] = line.rstrip()[: -len(MARK)].rstrip()
        out[path] = "\n".join(lines)
    return out, marks


def generate(n_projects: int, seed: int) -> list[Case]:
    """``n_projects`` broken projects (each with its twin) and look-alikes in a 4:1 ratio, reproducibly."""
    rng = random.Random(seed)
    keys = sorted(TEMPLATES)
    la_keys = sorted(LOOKALIKES)
    cases: list[Case] = []
    for i in range(n_projects):
        names = Names.draw(rng)
        if i % 5 == 4:
            name = la_keys[(i // 5) % len(la_keys)]
            files, marks = strip_marks(LOOKALIKES[name](names, random.Random(rng.random())))
            assert not marks, name
            cases.append(Case(i, "-", name, files, None, "lookalike"))
            continue
        code, form = keys[rng.randrange(len(keys))]
        sub = rng.random()
        broken, marks = strip_marks(TEMPLATES[(code, form)](names, random.Random(sub), False))
        assert len(marks) == 1, (code, form, marks)
        twin, tmarks = strip_marks(TEMPLATES[(code, form)](names, random.Random(sub), True))
        assert not tmarks, (code, form)
        cases.append(Case(i, code, form, broken, marks[0], "bug"))
        cases.append(Case(i, code, form, twin, None, "twin"))
    return cases


@dataclass
class Outcome:
    case: Case
    ok: bool
    findings: list[tuple[str, str, int, str]] = field(default_factory=list)  # code, path, line, severity
    errors: list[str] = field(default_factory=list)


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        # every directory of the project is a package
    for d in {(root / rel).parent for rel in files}:
        while d != root and d.is_dir():
            if d.name not in ("tools", "scripts"):
                (d / "__init__.py").touch(exist_ok=True)
            d = d.parent


def judge(case: Case, root: Path) -> Outcome:
    from ddp_doctor.lint import lint_paths

    res = lint_paths([root])
    got = []
    for f in res.findings:
        rel = Path(f.location.path).resolve().relative_to(root.resolve()).as_posix()
        sev = (f.severity or __import__("ddp_doctor.findings", fromlist=["info"]).info(f.code).severity).value
        got.append((f.code, rel, f.location.line, sev))
    errors = [e.message for e in res.errors]
    if case.kind == "bug":
        ok = any(c == case.code and (p, ln) == case.truth for c, p, ln, _ in got)
    elif case.kind == "twin":
        ok = not any(c == case.code or s in ("error", "warning") for c, _, _, s in got) and not errors
    else:
        ok = not any(s in ("error", "warning") for _, _, _, s in got) and not errors
    return Outcome(case, ok, got, errors)


def run(cases: list[Case], keep: Path | None = None) -> list[Outcome]:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="lint_cases_") as tmp:
        base = keep or Path(tmp)
        for c in cases:
            root = base / f"{c.index:04d}_{c.kind}_{c.code}_{c.form}"
            write(root, c.files)
            outcomes.append(judge(c, root))
    return outcomes


def table(outcomes: list[Outcome]) -> tuple[str, dict[str, float]]:
    rows: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for o in outcomes:
        key = (o.case.code, o.case.form)
        if o.case.kind == "bug":
            rows[key]["cases"] += 1
            rows[key]["found" if o.ok else "missed"] += 1
        else:
            rows[key]["clean"] += 1
            rows[key]["fp"] += not o.ok
    lines = [f"{'rule':7} {'form':24} {'cases':>5} {'found':>5} {'missed':>6} {'clean':>5} {'FP':>3}"]
    for (code, form), c in sorted(rows.items()):
        lines.append(f"{code:7} {form:24} {c['cases']:5} {c['found']:5} {c['missed']:6} {c['clean']:5} {c['fp']:3}")
    bugs = [o for o in outcomes if o.case.kind == "bug"]
    clean = [o for o in outcomes if o.case.kind != "bug"]
    found = sum(o.ok for o in bugs)
    fps = sum(not o.ok for o in clean)
    figures = {"bugs": len(bugs), "found": found, "recall": found / max(len(bugs), 1),
               "clean": len(clean), "fp": fps, "fp_rate": fps / max(len(clean), 1)}
    lines.append(f"recall {found}/{len(bugs)} = {figures['recall']:.1%}; false positives {fps}/{len(clean)} clean "
                 f"projects = {figures['fp_rate']:.1%}")
    return "\n".join(lines), figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500, help="broken projects and look-alikes to generate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="write the projects here and keep them")
    ap.add_argument("--show-misses", action="store_true", help="list every miss and false positive")
    args = ap.parse_args(argv)
    outcomes = run(generate(args.n, args.seed), args.keep)
    text, figures = table(outcomes)
    print(text)
    if args.show_misses:
        for o in outcomes:
            if not o.ok:
                print(f"{o.case.kind:9} {o.case.code} {o.case.form} truth={o.case.truth} got={o.findings} "
                      f"{o.errors or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
