"""Device rules: DDP301 load-without-map-location, DDP302 cuda-before-set-device."""
from __future__ import annotations

import ast
import re

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import arg_or_kw, final_name, kwarg, sets_current_device
from ddp_doctor.lint.scopes import Scope
from ddp_doctor.lint.rules.base import Context, Rule


def in_ddp_program(m: ModuleModel) -> bool:
    """Wraps DDP itself, or is a module of the training engine that a DDP script of the project imports
    (ask it only once something would be reported: the importers are costly to find)."""
    if m.uses_ddp:
        return True
    return A._cached(m, "in_ddp_program", lambda: m.project is not None and
                     m.project.importer_shows(m, "dist_script", is_dist_script) is not None)


def is_dist_script(m: ModuleModel) -> bool:
    """A module that sets up or runs distributed training (not merely imports torch.distributed)."""
    if "dist_script" in m._cache:
        return m._cache["dist_script"]
    res = m.uses_ddp
    if not res:
        for scope in m.scopes.values():
            for site in scope.sites:
                q = m.qual(site.call.func) or ""
                if q.endswith("init_process_group") or q in ("torch.multiprocessing.spawn",
                                                             "deepspeed.init_distributed"):
                    res = True
                    break
            if res:
                break
    m._cache["dist_script"] = res = res or _calls_project_setup(m)
    return res


def _calls_project_setup(m: ModuleModel) -> bool:
    """A call into a function of another project file that sets up the process group
    (``init_dist()`` from ``dist_env.py``): this module is the distributed script."""
    if m.project is None or not m.import_from:
        return False
    for scope in m.scopes.values():
        for site in scope.sites:
            got = m.project.resolve_call(m, site.call.func, scope)
            if got is None or got[1] is None or "init_process_group" not in got[0].source:
                continue
            summ = m.project.summary_of_call(m, site.call.func, scope)
            if summ is not None and summ.inits_group is not None:
                return True
    return False


class LoadWithoutMapLocation(Rule):
    code = "DDP301"
    needs_distributed = False  # a checkpoint utility runs in the distributed program that imports it

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if "torch" not in m.source:
            return
        loads = [site for scope in m.scopes.values() for site in scope.sites if self._unmapped_load(m, site, scope)]
        if not loads:
            return
        via = None  # the distributed script of the project that imports this module
        if not is_dist_script(m):
            via = m.project.importer_shows(m, "dist_script", is_dist_script) if m.project is not None else None
            if via is None:
                return
        where = f" (this module runs in a distributed program: {via.message} at {via.where})" if via else ""
        for site in loads:
            who = "on every rank, so all ranks allocate" if not m.rank_conds(site.conds, site.scope) else \
                "on each rank that runs it (whatever its own GPU), which allocates"
            ctx.report(
                self.code, site.call,
                "`torch.load` without `map_location` puts every tensor back on the device it was saved from "
                f"(usually cuda:0): {who} memory and a CUDA context on GPU 0 "
                f"(uneven memory, out-of-memory on GPU 0, slow loading){where}.",
                "Pass `map_location=\"cpu\"` (then `model.load_state_dict(...)` copies to the model's own "
                "device), or use `ddp_doctor.fixes.load_checkpoint(path)`.",
                fix_kind="map-location", related=[via] if via else (),
            )

    @staticmethod
    def _unmapped_load(m: ModuleModel, site, scope: Scope) -> bool:
        call = site.call
        if m.qual(call.func) != "torch.load" or A.single_process_only(m, site.conds, scope):
            return False
        if arg_or_kw(call, 1, "map_location") is not None or any(k.arg is None for k in call.keywords):
            return False
        return not _loads_data_cache(call, site.stmt)


# helpers of other modules that, by their name, set up the process group and the device
# (DINO/DeiT/MAE/torchvision `utils.init_distributed_mode(args)`, `setup_distributed`, `init_dist`, ...)
_SETUP_HELPER_RE = re.compile(
    r"(?i)^_?(?:init|setup|set_up|initialize|initialise|prepare)_?(?:\w+_)?"
    r"(?:dist|distributed|ddp|device|devices|gpu|gpus|cuda|process_group|for_distributed)(?:_\w+)?$"
    r"|^_?(?:dist|ddp|distributed)_?(?:init|setup|initialize)(?:_\w+)?$")


def _is_setup_helper(m: ModuleModel, call: ast.Call, scope: Scope) -> bool:
    """A call into another module's helper named like a distributed/device setup: it may well call
    ``torch.cuda.set_device`` inside (we cannot see it), so it counts as one.  A bare ``setup(...)``
    counts when it is given the rank (``setup(rank, world_size)``).  Not a helper of this project when
    no file of the project sets a device (then it does not either)."""
    q = m.qual(call.func) or ""
    if q.startswith("torch.") or m.resolve_function(call.func, scope) is not None:
        return False
    if _project_sets_device(m) is False and m.project.resolve_call(m, call.func, scope) is not None:
        return False
    name = final_name(call.func) or ""
    if _SETUP_HELPER_RE.match(name):
        return True
    return name in ("setup", "init", "initialize") and any(
        m.mentions_rank(a, scope) for a in (*call.args, *(k.value for k in call.keywords)))


# what a preprocessed-data cache is called: its pickles hold Python objects / CPU tensors, not a
# checkpoint saved from cuda:0 (`dataset, _ = torch.load(cache_path)`, `features = torch.load(cached_file)`)
_CACHE_WORD_RE = re.compile(r"(?i)cache")
_DATA_NAME_RE = re.compile(r"(?i)(?:^|_)(?:datasets?|features|feats|embeddings|labels|targets|examples|cache|cached)(?:_|$)")


def _bound_names(target: ast.expr) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound_names(e)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    name = final_name(target)
    return [name] if name else []


def _loads_data_cache(call: ast.Call, stmt: ast.stmt) -> bool:
    """``torch.load`` of a dataset / feature cache: bound to such a name, or from a path that names a cache."""
    path = arg_or_kw(call, 0, "f")
    if path is not None:
        for n in ast.walk(path):
            text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else \
                n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None
            if text and _CACHE_WORD_RE.search(text):
                return True
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign) and stmt.value is call:
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is call:
        targets = [stmt.target]
    names = [n for t in targets for n in _bound_names(t) if n != "_"]
    return bool(names) and all(_DATA_NAME_RE.search(n) for n in names)


def _project_sets_device(m: ModuleModel) -> bool | None:
    """Does some file of the project call ``torch.cuda.set_device`` (or pin devices another way)?"""
    return m.project.shows("sets_device") if m.project is not None else None


def _is_set_device(m: ModuleModel, call: ast.Call, scope: Scope, depth: int = 0) -> bool:
    q = m.qual(call.func) or ""
    if sets_current_device(q, call) or (q == "" and final_name(call.func) == "set_device"):
        return True
    if _is_setup_helper(m, call, scope):
        return True
    if depth == 0:
        fn = m.resolve_function(call.func, scope)
        if fn is not None and fn is not scope.node:
            return any(_is_set_device(m, s.call, s.scope, 1) for s in m.scopes[fn].sites)
    if fn_summary := (m.project.summary_of_call(m, call.func, scope) if m.project is not None and
                      _project_sets_device(m) else None):
        return fn_summary.sets_device is not None  # a helper of another file that sets it, however deep
    return False


def _current_cuda(m: ModuleModel, expr: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    """Does ``expr`` name the *current* CUDA device (no index)?  ``"cuda"``, ``torch.device("cuda")``,
    ``"cuda" if torch.cuda.is_available() else "cpu"`` (the CPU branch is the machine without a GPU), or
    a variable every assignment of which is one (``device = torch.device("cuda")`` ... ``.to(device)``)."""
    if expr is None or depth > 3:
        return False
    if A.literal(expr) == "cuda":
        return True
    if isinstance(expr, ast.IfExp):
        sides = (expr.body, expr.orelse)
        return any(_current_cuda(m, x, scope, depth + 1) for x in sides) and \
            all(A.literal(x) == "cpu" or _current_cuda(m, x, scope, depth + 1) for x in sides)
    if isinstance(expr, ast.Call) and m.qual(expr.func) == "torch.device" and len(expr.args) == 1 and \
            not expr.keywords:
        return _current_cuda(m, expr.args[0], scope, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        vals = [(v, m.scope_of_value(v, scope)) for v in m.values_of(expr, scope)]
        if not vals and isinstance(expr, ast.Name):
            vals = m.param_args(expr, scope)  # `train(hyp, opt, device)`: what this file's callers pass
        return bool(vals) and all(_current_cuda(m, v, s, depth + 1) for v, s in vals)
    return False


def _current_device_alloc(m: ModuleModel, call: ast.Call, scope: Scope) -> str | None:
    """A CUDA allocation on the *current* device: ``.cuda()``, ``.to("cuda")``, ``device="cuda"``, also
    through a variable holding such a device."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "cuda" and not call.args and kwarg(call, "device") is None:
        if (m.qual(f.value) or "").startswith("torch"):
            return None  # torch.cuda
        return f"`{ast.unparse(f)}()`"
    if isinstance(f, ast.Attribute) and f.attr == "to":
        target = call.args[0] if call.args else (kwarg(call, "device").value if kwarg(call, "device") else None)
        if _current_cuda(m, target, scope):
            return f"`{ast.unparse(call)}`" if A.literal(target) != "cuda" else f"`{ast.unparse(f)}(\"cuda\")`"
    dk = kwarg(call, "device")
    if dk is not None and (m.qual(f) or "").startswith("torch.") and _current_cuda(m, dk.value, scope):
        return f"`{ast.unparse(f)}(..., device=\"cuda\")`"
    return None


class CudaBeforeSetDevice(Rule):
    code = "DDP302"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not is_dist_script(m):
            return
        any_set = False
        for scope in m.scopes.values():
            sets = [s for s in scope.sites if _is_set_device(m, s.call, scope)]
            any_set = any_set or bool(sets)
            if not sets:
                continue
            first = min(s.call.lineno for s in sets)
            for site in scope.sites:
                if site.call.lineno >= first:
                    continue
                what = _current_device_alloc(m, site.call, scope)
                if what and not A.single_process_only(m, site.conds, scope):
                    ctx.report(
                        self.code, site.call,
                        f"{what} runs before `torch.cuda.set_device(...)` (line {first}): at this point the "
                        f"current device is still cuda:0 on every rank, so each rank creates a CUDA context and "
                        f"allocates on GPU 0 (wasted memory there, OOM on GPU 0, or tensors on the wrong GPU).",
                        "Call `torch.cuda.set_device(local_rank)` first thing (before any CUDA use), or use "
                        "an explicit device: `.to(f\"cuda:{local_rank}\")`.",
                    )
                    break
        if any_set or not m.uses_ddp or "CUDA_VISIBLE_DEVICES" in m.source:
            return
        if m.project is not None and m.project.importer_shows(m, "sets_device"):
            return  # the file that imports this one sets it (the launcher, before it builds what this wraps)
        if any(q.split(".")[0] in ("lightning", "pytorch_lightning", "accelerate", "lightning_fabric")
               for q in m.imports.values()):
            return
        nowhere = " (nor does any other file of the project)" if _project_sets_device(m) is False else ""
        for scope in m.scopes.values():
            for site in scope.sites:
                what = _current_device_alloc(m, site.call, scope)
                if what:
                    ctx.report(
                        self.code, site.call,
                        f"{what} uses the current CUDA device, but this DDP script never calls "
                        f"`torch.cuda.set_device(local_rank)`{nowhere}: the current device is cuda:0 on every "
                        f"rank, so all ranks put their model and data on GPU 0.",
                        "Call `torch.cuda.set_device(local_rank)` right after reading LOCAL_RANK, or move to an "
                        "explicit device: `.to(f\"cuda:{local_rank}\")`.",
                    )
                    return
