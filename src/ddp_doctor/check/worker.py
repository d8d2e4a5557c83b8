"""Runs in every rank of ``ddp-doctor check`` (``python -m ddp_doctor.check.worker``).

Started by torch's elastic launcher; configured by ``DDP_DOCTOR_CHECK_CONFIG`` (JSON, set by
the launcher).  Runs the tests of :mod:`.plan` in order, each in a thread with a deadline,
publishes every result through :mod:`.channel`, and never prints: the launcher renders.
After every test the ranks meet at a *store* gate (not a collective, which could hang):
a rank missing there stops everyone, so a broken rank ends the run within the deadline.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from ddp_doctor.check import audit, channel, faults as faultmod, plan

CONFIG_ENV = "DDP_DOCTOR_CHECK_CONFIG"
P2P_NUMEL = 16 * 1024          # 64 KiB of float32 per point-to-point transfer
GATHER_NUMEL = 16 * 1024


def gate_grace(deadline: float) -> float:
    """Extra time a rank waits at a gate for the others, beyond the test deadline."""
    return 1.0 + 0.25 * deadline


class Ctx:
    """What a test needs: rank, world, device, deadline, faults; and where it is waiting."""

    def __init__(self, rank: int, world: int, device, deadline: float, faults: list, nnodes: int) -> None:
        self.rank, self.world, self.device, self.deadline = rank, world, device, deadline
        self.faults, self.nnodes = faults, nnodes
        self.groups: dict[tuple[int, int], Any] = {}   # one process group per pair (see pair_groups)
        self.test = ""
        self.op = ""                       # what the test is doing now
        self.waiting_for: list[int] = []   # peers it waits on now

    def group(self, peer: int):
        return self.groups.get((min(self.rank, peer), max(self.rank, peer)))

    def fault(self, kind: str):
        return faultmod.find(self.faults, kind, self.rank, self.test)

    def dropped(self, peer: int) -> bool:
        for f in self.faults:
            if f.kind == "drop" and f.params.get("test", self.test) == self.test and "pair" in f.params:
                if {self.rank, peer} == set(f.pair()):
                    return True
        return False

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


_SRC_PREFIX = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def _first_line(exc: BaseException) -> str:
    """The gist of a backend error: its last line, without C++ source prefixes."""
    text = str(exc).strip().splitlines()
    msg = _SRC_PREFIX.sub("", text[-1] if text else "").split(" This is typically caused")[0]
    return f"{type(exc).__name__}: {msg}"[:300]


def _corrupt_if(ctx: Ctx, tensor) -> None:
    if ctx.fault("wrong") is not None:
        tensor.view(-1)[0] += 1.0


def _first_bad(tensor, expected) -> dict[str, Any] | None:
    """None when ``tensor`` equals ``expected`` (a number or a tensor) everywhere."""
    import torch

    flat = tensor.detach().view(-1).float().cpu()
    exp = torch.full_like(flat, float(expected)) if not torch.is_tensor(expected) else expected.view(-1).float().cpu()
    bad = (flat != exp).nonzero()
    if bad.numel() == 0:
        return None
    i = int(bad[0])
    return {"index": i, "got": float(flat[i]), "expected": float(exp[i]), "count": int(bad.numel())}


# ---------------------------------------------------------------------------- the tests
def pair_groups(ctx: Ctx) -> None:
    """A two-rank process group for every pair that is tested (every pair on one node, ring neighbours
    otherwise), so a timeout on one link closes only that link: gloo closes all connections of a
    process group after a timeout, which would make one bad pair look like a bad rank.

    Every rank creates every group in the same order (``new_group`` is collective).
    """
    import torch.distributed as dist

    n = ctx.world
    if ctx.groups or n < 2:
        return
    if ctx.nnodes > 1:
        pairs = sorted({(min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n)})
    else:
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    ctx.waiting_for = [r for r in range(n) if r != ctx.rank]   # new_group waits for every rank
    for a, b in pairs:
        ctx.op = f"creating the process group of ranks {a} and {b}"
        group = dist.new_group([a, b], timeout=timedelta(seconds=ctx.deadline))
        if ctx.rank in (a, b):
            ctx.groups[(a, b)] = group
    ctx.waiting_for = []


def _exchange(ctx: Ctx, send_to: int | None, recv_from: int | None, timeout_s: float) -> list[dict[str, Any]]:
    """isend to one peer and irecv from another, each waited on with a timeout.

    Returns one entry per peer: ``{"pair", "peer", "ok", "status", "op", "error"|"wrong", "time_s"}``
    (one entry when both directions go to the same peer).
    """
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    send_buf = torch.full((P2P_NUMEL,), float(ctx.rank + 1), device=ctx.device)
    recv_buf = torch.zeros(P2P_NUMEL, device=ctx.device)
    ops = []
    if recv_from is not None:
        ops.append(("recv", recv_from, dist.irecv, recv_buf))
    if send_to is not None and not ctx.dropped(send_to):
        ops.append(("send", send_to, dist.isend, send_buf))
    if ctx.device.type == "cuda":
        # NCCL: a send and a recv issued one by one on both ends queue behind each other on the
        # communicator's stream; batch them so both directions are in flight together
        p2p = [dist.P2POp(fn, buf, peer, group=ctx.group(peer)) for _, peer, fn, buf in ops]
        handles = dist.batch_isend_irecv(p2p) if p2p else []
        works = [(kind, peer, h) for (kind, peer, _, _), h in zip(ops, handles)]
    else:
        works = [(kind, peer, fn(buf, peer, group=ctx.group(peer))) for kind, peer, fn, buf in ops]
    out: dict[int, dict[str, Any]] = {}
    for peer in (recv_from, send_to):
        if peer is not None:
            out.setdefault(peer, {"pair": sorted([ctx.rank, peer]), "peer": peer, "ok": True, "status": "pass"})
    for kind, peer, work in works:
        ctx.op, ctx.waiting_for = f"{kind} {'from' if kind == 'recv' else 'to'} rank {peer}", [peer]
        remaining = max(0.05, timeout_s - (time.monotonic() - t0))
        try:
            work.wait(timeout=timedelta(seconds=remaining))
        except Exception as exc:  # noqa: BLE001
            timed_out = "timed out" in str(exc).lower() or "timeout" in str(exc).lower()
            out[peer].update(ok=False, status="timeout" if timed_out else "error", op=ctx.op, error=_first_line(exc))
            continue
        if kind == "recv":
            ctx.sync()
            _corrupt_if(ctx, recv_buf)
            bad = _first_bad(recv_buf, recv_from + 1)
            if bad:
                out[peer].update(ok=False, status="fail", op=ctx.op, wrong=bad)
        out[peer]["time_s"] = time.monotonic() - t0
    ctx.waiting_for = []
    return list(out.values())


def _p2p_result(items: list[dict[str, Any]]) -> dict[str, Any]:
    bad = [i for i in items if not i["ok"]]
    if not bad:
        return {"status": "pass", "items": items}
    statuses = {i["status"] for i in bad}
    worst = "timeout" if "timeout" in statuses else "error" if "error" in statuses else "fail"
    return {"status": worst, "items": items,
            "waiting_for": sorted({i["peer"] for i in bad if i["status"] != "fail"}),
            "detail": "; ".join(f"{i['op']}: {i.get('error') or _wrong_text(i.get('wrong'))}" for i in bad)}


def _wrong_text(bad: dict[str, Any] | None) -> str:
    if not bad:
        return ""
    return f"element {bad['index']} is {bad['got']:g}, expected {bad['expected']:g}"


def test_ring(ctx: Ctx) -> dict[str, Any]:
    n, r = ctx.world, ctx.rank
    if n < 2:
        return {"status": "skip", "detail": "one rank"}
    pair_groups(ctx)
    return _p2p_result(_exchange(ctx, (r + 1) % n, (r - 1) % n, ctx.deadline * 0.9))


def test_pairs(ctx: Ctx) -> dict[str, Any]:
    n, r = ctx.world, ctx.rank
    if n < 2:
        return {"status": "skip", "detail": "one rank"}
    if ctx.nnodes > 1:
        return {"status": "skip", "detail": "every-pair test runs on a single node only"}
    pair_groups(ctx)
    rounds = plan.pair_rounds(n)
    slot = ctx.deadline * 0.9 / len(rounds)
    t0 = time.monotonic()
    items: list[dict[str, Any]] = []
    for k, pairs in enumerate(rounds):
        peer = plan.partner(pairs, r)
        if peer is None:
            continue
        until = t0 + (k + 1) * slot   # the schedule keeps rounds aligned even after a timeout
        items += _exchange(ctx, peer, peer, max(0.05, until - time.monotonic()))
    return _p2p_result(items)


def test_barrier(ctx: Ctx) -> dict[str, Any]:
    import torch.distributed as dist

    ctx.op, ctx.waiting_for = "barrier", []
    t0 = time.monotonic()
    dist.barrier()
    return {"status": "pass", "items": [{"op": "barrier", "time_s": time.monotonic() - t0, "ok": True}]}


def test_broadcast(ctx: Ctx) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    items, wrong = [], []
    for src in range(ctx.world):
        ctx.op = f"broadcast from rank {src}"
        t = torch.full((P2P_NUMEL,), float(src + 1) if ctx.rank == src else 0.0, device=ctx.device)
        t0 = time.monotonic()
        dist.broadcast(t, src)
        ctx.sync()
        if ctx.rank != src:
            _corrupt_if(ctx, t)
        bad = _first_bad(t, src + 1)
        items.append({"src": src, "time_s": time.monotonic() - t0, "ok": bad is None, "wrong": bad})
        if bad:
            wrong.append(f"from rank {src}: element {bad['index']} is {bad['got']:g}, expected {bad['expected']:g}")
    return {"status": "fail" if wrong else "pass", "items": items, "detail": "; ".join(wrong)}


def test_all_gather(ctx: Ctx) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ctx.op = "all_gather"
    t = torch.full((GATHER_NUMEL,), float(ctx.rank + 1), device=ctx.device)
    out = [torch.zeros_like(t) for _ in range(ctx.world)]
    t0 = time.monotonic()
    dist.all_gather(out, t)
    ctx.sync()
    elapsed = time.monotonic() - t0
    _corrupt_if(ctx, out[(ctx.rank + 1) % ctx.world])
    wrong = []
    for i, got in enumerate(out):
        bad = _first_bad(got, i + 1)
        if bad:
            wrong.append(f"slot of rank {i}: element {bad['index']} is {bad['got']:g}, expected {bad['expected']:g}")
    return {"status": "fail" if wrong else "pass", "detail": "; ".join(wrong),
            "items": [{"op": "all_gather", "bytes": t.numel() * 4, "time_s": elapsed, "ok": not wrong}]}


def iterations(nbytes: int) -> int:
    """Timed iterations per size: more for small messages, at least 2 (same on every rank)."""
    return max(2, min(20, (32 * 1024 * 1024) // max(1, nbytes)))


def test_all_reduce(ctx: Ctx, sizes: list[int]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    n = ctx.world
    expected = n * (n + 1) / 2
    items, wrong = [], []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        ctx.op = f"all_reduce {plan.format_size(nbytes)}"
        t = torch.full((numel,), float(ctx.rank + 1), device=ctx.device)
        dist.all_reduce(t)                       # checked (and warm-up)
        ctx.sync()
        _corrupt_if(ctx, t)
        bad = _first_bad(t, expected)
        iters = iterations(nbytes)
        t0 = time.monotonic()
        for _ in range(iters):
            dist.all_reduce(t)
        ctx.sync()
        per_iter = (time.monotonic() - t0) / iters
        items.append({"bytes": numel * 4, "iters": iters, "time_s": per_iter, "ok": bad is None, "wrong": bad})
        if bad:
            wrong.append(f"{plan.format_size(nbytes)}: element {bad['index']} is {bad['got']:g}, expected {bad['expected']:g}")
    return {"status": "fail" if wrong else "pass", "items": items, "detail": "; ".join(wrong)}


# ---------------------------------------------------------------------------- running
def run_with_deadline(ctx: Ctx, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a daemon thread; after ``ctx.deadline`` report a timeout (and where)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001
            box["error"] = exc

    t0 = time.monotonic()
    th = threading.Thread(target=target, name=f"check-{ctx.test}", daemon=True)
    th.start()
    th.join(ctx.deadline)
    elapsed = time.monotonic() - t0
    if th.is_alive():
        return {"status": "timeout", "duration_s": elapsed, "op": ctx.op, "waiting_for": list(ctx.waiting_for),
                "detail": f"{ctx.op or ctx.test}: no progress after {ctx.deadline:g} s"}
    if "error" in box:
        exc = box["error"]
        status = "timeout" if "timed out" in str(exc).lower() or "timeout" in str(exc).lower() else "error"
        return {"status": status, "duration_s": elapsed, "op": ctx.op, "waiting_for": list(ctx.waiting_for),
                "detail": f"{ctx.op or ctx.test}: {_first_line(exc)}"}
    result = box["result"]
    result.setdefault("detail", "")
    result["duration_s"] = elapsed
    return result


def _apply_start_faults(ctx: Ctx) -> None:
    """``exit`` and ``delay`` faults fire when a test starts (after ``at`` is published)."""
    fault = ctx.fault("exit")
    if fault is not None:
        sys.stderr.flush()
        os._exit(int(fault.params.get("code", 3)))
    fault = ctx.fault("delay")
    if fault is not None:
        time.sleep(float(fault.params.get("secs", 3600)))


def _gate(gstore, ch: channel.Channel, ctx: Ctx, test: str, started: float,
          limit: float | None = None) -> tuple[dict[int, dict], list[int]]:
    """Wait (on the store) for every rank's result of ``test``; return results and missing ranks."""
    keys = [f"res/{r}/{test}" for r in range(ctx.world)]
    limit = ctx.deadline if limit is None else limit
    until = started + limit + gate_grace(ctx.deadline)
    while True:
        try:
            if all(gstore.check([k]) for k in keys) or time.monotonic() >= until:
                break
            if gstore.check(["stop"]):
                break
        except Exception:  # noqa: BLE001 - the job store is gone: everyone else is gone too
            break
        time.sleep(0.02)
    results, missing = {}, []
    for r, k in enumerate(keys):
        value = channel.get(gstore, k)
        if value is None:
            missing.append(r)
        else:
            results[r] = value
    if missing:
        ch.set("stop", {"test": test, "missing": missing, "by": ctx.rank})
    return results, missing


def _redirect_output(logdir: str | None, rank: int) -> None:
    """Keep backend noise out of the launcher's terminal: fd 1 and 2 go to a per-rank log."""
    if not logdir:
        return
    fd = os.open(os.path.join(logdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> int:
    cfg = json.loads(os.environ[CONFIG_ENV])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    group_rank, group_world = int(os.environ.get("GROUP_RANK", 0)), int(os.environ.get("GROUP_WORLD_SIZE", 1))
    _redirect_output(cfg.get("logdir"), rank)
    deadline = float(cfg["deadline"])
    # ranks start seconds apart (importing torch on a loaded machine): joining gets its own timeout
    rdzv_timeout = float(cfg.get("rendezvous_timeout", 60.0))
    faults = faultmod.from_env()

    import torch
    import torch.distributed as dist

    host, port = cfg["store"].rsplit(":", 1)
    lstore = channel.connect(host, int(port), timeout_s=max(30.0, 4 * deadline))
    ch = channel.Channel(lstore)
    ch.set("master", {
        "addr": os.environ["MASTER_ADDR"], "port": int(os.environ["MASTER_PORT"]), "world_size": world,
        "group_world_size": group_world, "run_id": os.environ.get("TORCHELASTIC_RUN_ID", ""),
        "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")})
    started_info = {"rank": rank, "pid": os.getpid(), "local_rank": local_rank,
                    "group_rank": group_rank, "host": socket.gethostname()}
    ch.set(f"started/{rank}", started_info)
    device, backend = audit.rank_device(local_rank, cfg.get("backend"))
    ctx = Ctx(rank, world, device, deadline, faults, group_world)

    # --- rendezvous: init_process_group, bounded by the deadline
    ctx.test = "rendezvous"
    ch.set(f"at/{rank}", {"test": "rendezvous", "t": time.time()})
    _apply_start_faults(ctx)
    t0 = time.monotonic()
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=rdzv_timeout))
    except Exception as exc:  # noqa: BLE001
        ch.set(f"res/{rank}/rendezvous", {"status": "timeout" if "timeout" in str(exc).lower() else "error",
                                          "duration_s": time.monotonic() - t0, "detail": _first_line(exc)})
        ch.set(f"done/{rank}", {"stopped_at": "rendezvous"})
        _wait_ack(lstore, deadline)
        os._exit(0)
    gstore = channel.connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s=max(30.0, 4 * deadline),
                             prefix=channel.job_prefix(os.environ.get("TORCHELASTIC_RUN_ID", ""),
                                                       os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    ch.add(gstore)
    ch.set(f"started/{rank}", started_info)   # now also visible to the other nodes' launchers
    hello = audit.rank_identity(rank, local_rank, device, backend)
    ch.set(f"hello/{rank}", hello)
    ch.set(f"res/{rank}/rendezvous", {"status": "pass", "duration_s": time.monotonic() - t0, "detail": ""})
    if local_rank == 0:
        facts = audit.measure_node()
        shm = faultmod.find(faults, "shm", rank, "audit")
        if shm is not None:
            facts["shm_free"] = facts["shm_total"] = int(shm.params.get("bytes", 0))
        env = cfg.get("user_env", {})
        gpus = torch.cuda.device_count() if device.type == "cuda" else None
        checks = audit.audit_node(facts, env, local_ranks=local_world, nnodes=group_world,
                                  workers=int(cfg.get("workers", 4)), batch_bytes=int(cfg.get("batch_bytes", 32 << 20)),
                                  gpus=gpus)
        ch.set(f"audit/{group_rank}", {"node": group_rank, "host": hello["host"], "facts": facts, "checks": checks,
                                       "local_ranks": local_world})
    _, missing = _gate(gstore, ch, ctx, "rendezvous", t0, rdzv_timeout)

    sizes = [int(s) for s in cfg.get("sizes", plan.DEFAULT_SIZES)]
    tests: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("ring", lambda: test_ring(ctx)),
        ("pairs", lambda: test_pairs(ctx)),
        ("barrier", lambda: test_barrier(ctx)),
        ("broadcast", lambda: test_broadcast(ctx)),
        ("all_gather", lambda: test_all_gather(ctx)),
        ("all_reduce", lambda: test_all_reduce(ctx, sizes)),
    ]
    stopped_at = "rendezvous" if missing else None
    for name, fn in tests:
        if stopped_at:
            break
        ctx.test, ctx.op, ctx.waiting_for = name, "", []
        ctx.deadline = plan.test_deadline(name, deadline, world, group_world)
        started = time.monotonic()
        ch.set(f"at/{rank}", {"test": name, "t": time.time()})
        _apply_start_faults(ctx)
        result = run_with_deadline(ctx, fn)
        ch.set(f"res/{rank}/{name}", result)
        results, missing = _gate(gstore, ch, ctx, name, started)
        broken = [r for r, res in results.items() if res.get("status") in ("timeout", "error")]
        if missing or (broken and name not in plan.P2P_TESTS):
            stopped_at = name
    ch.set(f"done/{rank}", {"stopped_at": stopped_at})
    # wait until the launcher(s) collected everything, then leave without joining stuck threads
    _wait_ack(lstore, deadline)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait_ack(lstore, deadline: float) -> None:
    """Wait until the launcher has read everything (bounded: the launcher may be gone)."""
    channel.wait_for(lstore, "ack", 4 * deadline + 10)


if __name__ == "__main__":
    sys.exit(main())
