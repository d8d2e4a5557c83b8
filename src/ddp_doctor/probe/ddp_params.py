"""DDP's parameters as its errors number them, and the names of those an error refers to.

DDP's reducer numbers the parameters that get gradients in ``module.named_modules()`` order, each
module's own parameters that require grad and are not in ``parameters_to_ignore``, a shared one once
(``DistributedDataParallel._build_params_for_reducer``); its "did not receive grad" error prints these
numbers.  The list is taken when the model is built (it is what the reducer numbered; a later
``requires_grad_(False)`` does not renumber it) and stays inside the rank: only the names an error
refers to are published, once, when the rank fails.
"""
from __future__ import annotations

from ddp_doctor.evidence import DdpParam
from ddp_doctor.evidence.torch_errors import unused_params


def reducer_names(ddp) -> tuple[tuple[str, str], ...]:
    """(name, module type) of each parameter DDP reduces, by the reducer's index."""
    ignore = getattr(ddp, "parameters_to_ignore", None) or ()
    seen: set[int] = set()
    out = []
    for mname, mod in ddp.module.named_modules():
        mtype = type(mod).__name__
        for pname, p in mod.named_parameters(recurse=False):
            # torch spells the root module's parameters ".weight" in this test; mirrored exactly
            if not p.requires_grad or f"{mname}.{pname}" in ignore or id(p) in seen:
                continue
            seen.add(id(p))
            out.append((f"{mname}.{pname}" if mname else pname, mtype))
    return tuple(out)


def _ddp_in_traceback(exc: BaseException):
    """The DDP model whose forward/backward raised (a ``self`` of its frames), or None."""
    from torch.nn.parallel import DistributedDataParallel

    tb = exc.__traceback__
    found = None
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if isinstance(obj, DistributedDataParallel):
            found = obj  # the innermost one
        tb = tb.tb_next
    return found


def name_unused(rec, exc: BaseException) -> None:
    """If ``exc`` is DDP's unused-parameter error, keep the names of the parameters it refers to on the
    model's record (published with the rank's final state)."""
    info = unused_params(str(exc))
    if info is None or not (info.indices or info.names):
        return
    models = list(rec.ddps)
    target = _ddp_in_traceback(exc)
    hit = [d for d, ref in models if ref() is target] if target is not None else []
    if not hit and len(models) == 1:
        hit = [models[0][0]]
    if not hit:
        return
    d = hit[-1]
    names = d.get("reducer_params") or ()
    if info.indices:
        named = [DdpParam(i, *names[i]) for i in info.indices if 0 <= i < len(names)]
    else:  # torch printed the names itself (TORCH_DISTRIBUTED_DEBUG): find their indices and modules
        where = {n: (i, t) for i, (n, t) in enumerate(names)}
        named = [DdpParam(where[n][0], n, where[n][1]) if n in where else DdpParam(-1, n) for n in info.names]
    d["named"] = tuple(named)
    rec.version += 1
