"""Hooks the probe installs in a rank: collectives, DDP forward/backward/init, DataLoader, sampler, optimizer.

Every hook is exception-safe: the probe's own bookkeeping runs in ``try`` blocks and the user's call
is made exactly once, with the user's arguments, whatever the bookkeeping did.  Nothing here issues a
collective or touches the user's process groups.
"""
from __future__ import annotations

import faulthandler
import functools
import inspect
import os
import signal
import sys
import threading
import time
import weakref

from ddp_doctor import store as side
from ddp_doctor.evidence import ops
from ddp_doctor.evidence.agreement import GROUP_CREATION
from ddp_doctor.probe import ddp_params, funcol, group_calls, groups, lifeline, p2p, workers
from ddp_doctor.probe.apisite import user_site_api
from ddp_doctor.probe.describe import describe as describe_call
from ddp_doctor.probe.recorder import EpochRec, LoaderRec, Recorder, user_site


REC: Recorder | None = None
_tls = threading.local()
_group_key = group_calls.group_key
_installed = False


def _inside(entry, call, *args, **kwargs):
    """Run ``call`` inside the collective ``entry`` (None: not recorded): a raise is recorded as failing in
    it, and the collective is left whatever happens."""
    try:
        return call(*args, **kwargs)
    except BaseException:
        REC.failed_in = entry
        raise
    finally:
        if entry is not None:
            try:
                REC.coll_leave(entry)
            except Exception:
                pass


_stream_backends: dict[int, bool] = {}


def _completes_on_stream(group, args, kwargs) -> bool:
    """Does this call return before its work completes though the user did not ask for ``async_op``?

    NCCL queues the collective on a CUDA stream and ``work.wait()`` only orders streams: the host goes
    on while the collective may never finish.  Such calls are issued with ``async_op=True`` and waited
    here, which is what torch does for ``async_op=False``, so the probe keeps the work to watch."""
    first = next((a for a in (*args, *kwargs.values()) if hasattr(a, "is_cuda")), None)
    if first is None or not first.is_cuda:
        return False
    key = id(group)
    nccl = _stream_backends.get(key)
    if nccl is None:
        try:
            import torch.distributed as dist

            nccl = "nccl" in str(dist.get_backend(group)).lower()
        except Exception:
            nccl = False
        _stream_backends[key] = nccl
    return nccl


def _issue(entry, call, args, kwargs, *, wait_here: bool):
    """Run an asynchronous collective: the rank stays issued in ``entry`` until its work completes
    (polled by the publisher).  ``wait_here``: the user asked for a synchronous call; wait as torch
    does and return None."""
    try:
        work = call(*args, **kwargs)
    except BaseException:
        REC.failed_in = entry
        REC.coll_leave(entry)
        raise
    try:
        if hasattr(work, "is_completed"):
            REC.coll_pending(entry, work)
        else:  # this rank is not in the group: torch returned None
            REC.coll_leave(entry)
    except Exception:
        pass
    if wait_here:
        if work is not None:
            work.wait()
        return None
    return work


def _wrap_collective(fn, name: str, describe=None, call=None):
    """``describe``: (args, kwargs) -> the arguments of a group creation (recorded under GROUP_CREATION),
    or None where this call is not one every rank makes; without it, a collective on its own group.
    ``call``: (args, kwargs) -> (group key, shapes, dtypes) where torch's call is not c10d's (probe/funcol.py)."""
    try:
        params = list(inspect.signature(fn).parameters)
        gidx = params.index("group") if "group" in params else None
        aidx = params.index("async_op") if "async_op" in params else None
    except (TypeError, ValueError):
        gidx = aidx = None

    @functools.wraps(fn)
    def collective(*args, **kwargs):
        if getattr(_tls, "depth", 0):
            return fn(*args, **kwargs)
        entry = None
        asynchronous = wait_here = False
        try:
            g = kwargs.get("group")
            if g is None and gidx is not None and len(args) > gidx:
                g = args[gidx]
            if call is not None:
                key, shapes, dtypes = call(args, kwargs)
            elif describe is None:
                key = _group_key(g)
                if key is None:  # torch skips a call on a group this rank is not in: noted, never paired
                    REC.not_member_call(name, user_site(sys._getframe(1)))
                shapes, dtypes = describe_call(name, args, kwargs) if key is not None else ((), ())
            else:
                key, shapes, dtypes = GROUP_CREATION, describe(args, kwargs), ()
            if key is not None and shapes is not None:
                entry = REC.coll_enter(key, name, shapes, dtypes, user_site_api(sys._getframe(1)))
                if REC.flush is not None and REC.site_counts.get((name, entry[5])) == 1:
                    REC.flush()  # its first call at this line: posted before gloo can abort on a mismatch
            if aidx is not None and entry is not None:
                asynchronous = bool(kwargs["async_op"] if "async_op" in kwargs
                                    else len(args) > aidx and args[aidx])
                if not asynchronous and len(args) <= aidx and _completes_on_stream(g, args, kwargs):
                    kwargs = dict(kwargs, async_op=True)
                    asynchronous = wait_here = True
        except Exception:
            entry = None
        _tls.depth = 1
        try:
            if asynchronous and entry is not None:
                return _issue(entry, fn, args, kwargs, wait_here=wait_here)
            return _inside(entry, fn, *args, **kwargs)
        finally:
            _tls.depth = 0

    collective.__ddp_doctor_wrapped__ = fn
    return collective


def _patch_collectives() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name in ops.C10D:
        fn = getattr(c10d, name, None)
        if fn is None or hasattr(fn, "__ddp_doctor_wrapped__"):
            continue
        wrapped = _wrap_collective(fn, name)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)


def _patch_funcol() -> None:
    """Functional collectives (DTensor's redistributions, ``full_tensor``): issued, not waited, in the call."""
    funcol.patch(_wrap_collective, _group_key)


def _patch_p2p() -> None:
    """Point-to-point calls: counted per line, never numbered with the collectives (probe/p2p.py)."""
    p2p.patch(lambda: REC)


def _patch_group_creation() -> None:
    """Group creation (new_group, init_device_mesh...): a call every rank makes, compared by its arguments."""
    group_calls.patch(_wrap_collective)


def note_ddp(model, site) -> None:
    """Put a DDP model on record (made at ``site``; None: it existed before the probe)."""
    try:
        nbuf = sum(1 for _ in model.module.buffers())
        if REC.group is None:
            groups.note_group(REC)
        rd = {
            "site": site,
            "find_unused_parameters": bool(getattr(model, "find_unused_parameters", False)),
            "broadcast_buffers": bool(getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", False))),
            "buffers": nbuf,
            "params": sum(1 for _ in model.module.parameters()),
            "unused_seen": None,
            "reducer_params": ddp_params.reducer_names(model),  # kept in the rank, see ddp_params
        }
        model.__dict__["_ddpd_rec"] = rd  # the forward hook updates it in the user's thread
        REC.ddps.append((rd, weakref.ref(model)))
        REC.version += 1
    except Exception:
        pass


def _patch_ddp() -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_init = DDP.__init__
    orig_forward = DDP.forward

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        entry = None
        site = None
        try:
            site = user_site(sys._getframe(1))
            entry = REC.coll_enter(_group_key(kwargs.get("process_group")), "ddp.init(broadcast_params)", (), (), site, "ddp")
        except Exception:
            entry = None
        _inside(entry, orig_init, self, *args, **kwargs)
        note_ddp(self, site)

    @functools.wraps(orig_forward)
    def forward(self, *args, **kwargs):
        entry = None
        try:
            REC.train_thread = threading.get_ident()
            REC.forwards += 1
            REC.progress += 1
            site = user_site(sys._getframe(1))
            key = ("ddp.forward", REC.site_index(site))
            REC.site_counts[key] = REC.site_counts.get(key, 0) + 1
            if self._check_sync_bufs_pre_fwd():
                entry = REC.coll_enter(_group_key(self.process_group), "ddp.forward(broadcast_buffers)", (), (),
                                       site, "ddp")
        except Exception:
            entry = None
        try:
            return _inside(entry, orig_forward, self, *args, **kwargs)
        finally:
            try:
                if torch.is_grad_enabled() and self.require_backward_grad_sync:
                    REC.sync_forward(_group_key(self.process_group), key[1])
                elif torch.is_grad_enabled():
                    REC.sync_overtaken()
                rd = self.__dict__.get("_ddpd_rec")
                if rd is not None and rd["find_unused_parameters"] and REC.forwards % 16 == 2:
                    # read here, in the user's thread: the probe's thread never holds the model
                    rd["unused_size"] = int(self._get_ddp_logging_data().get("unused_parameter_size", 0))
            except Exception:
                pass

    DDP.__init__ = __init__
    DDP.forward = forward

    orig_backward = torch.autograd.backward

    @functools.wraps(orig_backward)
    def backward(*args, **kwargs):
        entry = None
        try:
            REC.backwards += 1
            REC.progress += 1
            pend = REC.pending_grad_sync
            if pend is not None:
                REC.pending_grad_sync = None
                entry = REC.coll_enter(pend, "ddp.backward(allreduce_grads)", (), (), user_site(sys._getframe(1)), "ddp")
        except Exception:
            entry = None
        return _inside(entry, orig_backward, *args, **kwargs)

    torch.autograd.backward = backward


def _length(loader) -> int:
    """``len(loader)``, or -1 where asking has side effects or fails.

    Never for an IterableDataset: torch then remembers the length and warns when more samples come
    (a job run with ``-W error`` would crash on the probe's question)."""
    try:
        from torch.utils.data import IterableDataset

        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            return -1
        return len(loader)
    except Exception:
        return -1


def _sampler_of(loader):
    s = getattr(loader, "sampler", None)
    bs = getattr(loader, "batch_sampler", None)
    if bs is not None and getattr(bs, "sampler", None) is not None:
        s = bs.sampler
    return s


def note_loader(loader, site) -> None:
    """Put a DataLoader on record (made at ``site``; None: it existed before the probe)."""
    try:
        settings = {
            "num_workers": loader.num_workers, "pin_memory": bool(loader.pin_memory),
            "persistent_workers": bool(loader.persistent_workers), "prefetch_factor": loader.prefetch_factor,
            "batch_size": loader.batch_size,
        }
        rec = LoaderRec(REC.loaders_made, site, settings, _sampler_of(loader))
        REC.loaders_made += 1
        REC.loaders.append(rec)
        object.__setattr__(loader, "_ddpd_rec", rec)
        REC.version += 1
    except Exception:
        pass


def _patch_data() -> None:
    from torch.utils.data import dataloader as dl_mod
    from torch.utils.data import distributed as dist_mod
    from torch.utils.data._utils import worker as worker_mod

    DataLoader = dl_mod.DataLoader
    orig_init = DataLoader.__init__
    orig_iter = DataLoader.__iter__
    BaseIter = dl_mod._BaseDataLoaderIter
    orig_next = BaseIter.__next__

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        try:
            site = user_site(sys._getframe(1))
        except Exception:
            site = None
        note_loader(self, site)

    @functools.wraps(orig_iter)
    def __iter__(self):
        lifeline.forking_thread_is_main = threading.current_thread() is threading.main_thread()
        it = orig_iter(self)
        try:
            rec = getattr(self, "_ddpd_rec", None)
            if rec is not None:
                rec.epochs += 1
                it._ddpd_epoch = rec.cur = EpochRec()
                s = rec.sampler
                rec.sampler_epochs.append(getattr(s, "epoch", None))
                if rec.length is None:
                    rec.length = _length(self)
                ws = getattr(it, "_workers", None)
                if ws:
                    rec.worker_pids = [w.pid for w in ws if w.pid]
                    rec.workers = [weakref.ref(w) for w in ws]
                    rec.worker_exits = ()
                rec.iter_t = time.monotonic()
                rec.first_batch_pending = True
                it._ddpd_rec = rec
                REC.progress += 1
                REC.version += 1
                REC.timeline.append((REC.now(), "epoch", 0, f"loader {rec.idx} epoch {rec.epochs - 1}"))
        except Exception:
            pass
        return it

    @functools.wraps(orig_next)
    def __next__(self):
        rec = getattr(self, "_ddpd_rec", None)
        if rec is None:
            return orig_next(self)
        t = time.monotonic()
        REC.train_thread = threading.get_ident()
        REC.in_data_wait = (rec, t)
        try:
            batch = orig_next(self)
        finally:
            REC.in_data_wait = None
        try:
            dt = time.monotonic() - t
            rec.batches += 1
            e = getattr(self, "_ddpd_epoch", None)
            if e is not None:
                REC.batch_drawn(rec, e)
            rec.data_wait_s += dt
            rec.batch_wait.append(dt)
            if REC.first_step_t is not None:
                REC.data_wait_s += dt
            REC.progress += 1
            REC.last_loader = rec
            if rec.first_batch_pending:
                rec.first_batch_pending = False
                rec.epoch_start_s.append(time.monotonic() - rec.iter_t)
            if dt > 0.001:
                REC.timeline.append((REC.now() - dt, "data_wait", dt, f"loader {rec.idx} batch {rec.batches}"))
        except Exception:
            pass
        return batch

    DataLoader.__init__ = __init__
    DataLoader.__iter__ = __iter__
    BaseIter.__next__ = __next__
    workers.patch_shutdown(REC)

    DS = dist_mod.DistributedSampler
    orig_set_epoch = DS.set_epoch

    @functools.wraps(orig_set_epoch)
    def set_epoch(self, epoch):
        try:
            self._ddpd_set_epoch_calls = getattr(self, "_ddpd_set_epoch_calls", 0) + 1
        except Exception:
            pass
        return orig_set_epoch(self, epoch)

    DS.set_epoch = set_epoch

    if not hasattr(worker_mod._worker_loop, "__ddp_doctor_wrapped__"):
        orig_loop = worker_mod._worker_loop
        _worker_loop.__ddp_doctor_wrapped__ = orig_loop
        worker_mod._worker_loop = _worker_loop


def _worker_loop(*args, **kwargs):
    """DataLoader worker entry: register the stack dump, then run torch's own loop.

    Module-level so that a spawn/forkserver worker can unpickle it by name; there
    the patch is absent and torch's loop is found directly."""
    from torch.utils.data._utils import worker as worker_mod

    _register_stack_dump("worker")
    lifeline.tie_worker_to_rank()
    orig = getattr(_worker_loop, "__ddp_doctor_wrapped__", None) or worker_mod._worker_loop
    return orig(*args, **kwargs)


_dump_files: list = []


def _register_stack_dump(kind: str) -> None:
    """faulthandler on SIGUSR1 -> DIR/<kind>-<pid>.stack: stacks on request, even inside a blocked C call;
    and on a fatal signal (SIGABRT from gloo's EnforceNotMet, SIGSEGV) unless the user enabled faulthandler."""
    try:
        d = os.environ.get("DDP_DOCTOR_DIR")
        if not d or not hasattr(signal, "SIGUSR1"):
            return
        f = open(side.stack_file(d, kind, os.getpid()), "w")
        _dump_files.append(f)
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
        if kind == "rank" and not faulthandler.is_enabled():
            faulthandler.enable(file=f, all_threads=True)
    except Exception:
        pass


def _patch_optimizer() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def _post(opt, args, kwargs):
        try:
            if REC.trains_ddp(opt):
                REC.train_thread = threading.get_ident()
                REC.step()
        except Exception:
            pass

    register_optimizer_step_post_hook(_post)


def _patch_perf() -> None:
    try:
        from ddp_doctor.probe import perf as _perf
    except ImportError:
        return
    _perf.install(REC)


def _patch_groups() -> None:
    groups.install(REC)


def install(rec: Recorder) -> None:
    """Install every hook once; a hook that cannot be installed is skipped (training unaffected)."""
    global REC, _installed
    REC = rec
    if _installed:
        return
    _installed = True
    try:
        import torch  # noqa: F401 - nothing to hook without it
    except Exception:
        return
    _register_stack_dump("rank")
    for patch in (_patch_groups, _patch_collectives, _patch_funcol, _patch_p2p, _patch_group_creation, _patch_ddp,
                  _patch_data, _patch_optimizer, _patch_perf):
        try:
            patch()
        except Exception as e:  # pragma: no cover - depends on torch version
            print(f"ddp-doctor probe: could not install {patch.__name__}: {e!r}", file=sys.stderr)
