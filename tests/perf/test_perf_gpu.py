"""DDP301/302 logic against a fake NVML (no GPU here); real NVML tests where a GPU exists (skipped visibly)."""
import threading
import time

import pytest

from ddp_doctor import gpu
from ddp_doctor.diagnose.perf import diagnose_perf

from perf_evidence import evidence, rank_state
from fake_nvml import FakeNVML


def _gpus(procs0, procs1):
    return [{"uuid": "GPU-aaaa", "total_mib": 40000, "procs": procs0},
            {"uuid": "GPU-bbbb", "total_mib": 40000, "procs": procs1}]


def _ranks(pids=(1000, 1001), loads=None, cuda=None):
    states = []
    for r in range(2):
        st = rank_state(r, data=0.001)
        st["pid"] = pids[r]
        st["loads"] = (loads or {}).get(r, [])
        st["cuda"] = (cuda or {}).get(r)
        states.append(st)
    return states


SEED002 = ([(1000, 4000), (1001, 600)], [(1001, 4000)])  # rank 1 also holds 600 MiB on GPU 0


def test_snapshot_shape():
    snap = gpu.snapshot(FakeNVML(_gpus(*SEED002)), host="node0")
    assert snap["devices"][0] == {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-40GB",
                                  "used_mib": 4600, "total_mib": 40000}
    assert {"gpu": 0, "pid": 1001, "used_mib": 600} in snap["processes"]
    assert gpu.foreign_bytes(snap) == 600


def test_snapshot_without_nvml():
    assert gpu.snapshot(FakeNVML([], fail_init=True)) is None


def test_torch_load_blamed_ddp301():
    load = {"site": {"path": "/job/train.py", "line": 20, "function": "main"}, "map_location": None,
            "devices": ["cuda:0"]}
    ev = evidence(*_ranks(loads={1: [load]}))
    ev["gpu"] = gpu.snapshot(FakeNVML(_gpus(*SEED002)), host="node0")
    [f] = [f for f in diagnose_perf(ev) if f.code in ("DDP301", "DDP302")]
    assert f.code == "DDP301" and f.ranks == [1] and f.location.line == 20
    assert "GPU 0" in f.said and "rank 0's GPU" in f.said and "600 MiB" in f.said
    assert "load_checkpoint" in f.fix


def test_cuda_before_set_device_ddp302():
    cuda = {1: {"device": 1, "init": {"site": {"path": "/job/train.py", "line": 8, "function": "<module>"},
                                      "device": 0, "before_set_device": True}}}
    ev = evidence(*_ranks(cuda=cuda))
    ev["gpu"] = gpu.snapshot(FakeNVML(_gpus(*SEED002)), host="node0")
    [f] = [f for f in diagnose_perf(ev) if f.code in ("DDP301", "DDP302")]
    assert f.code == "DDP302" and f.ranks == [1] and f.location.line == 8
    assert "before torch.cuda.set_device" in f.said


def test_clean_twin_no_finding():
    ev = evidence(*_ranks())
    ev["gpu"] = gpu.snapshot(FakeNVML(_gpus([(1000, 4000)], [(1001, 4000)])), host="node0")
    assert [f for f in diagnose_perf(ev) if f.code in ("DDP301", "DDP302")] == []


def test_container_pids_via_nspid(tmp_path):
    # NVML reports host PIDs 5000/5001; the ranks know themselves as 10/11 (container PID namespace)
    for host_pid, ns_pid in ((5000, 10), (5001, 11)):
        (tmp_path / str(host_pid)).mkdir()
        (tmp_path / str(host_pid) / "status").write_text(f"Name:\tpython\nNSpid:\t{host_pid}\t{ns_pid}\n")
    snap = gpu.snapshot(FakeNVML(_gpus([(5000, 4000), (5001, 600)], [(5001, 4000)])), host="node0")
    ranks = {s["rank"]: s for s in _ranks(pids=(10, 11))}
    assert gpu.match_processes(snap, ranks, proc_root=str(tmp_path)) == {5000: 0, 5001: 1}
    [item] = gpu.foreign_contexts(snap, ranks, proc_root=str(tmp_path))
    assert item["rank"] == 1 and item["gpu"] == 0 and item["owner_rank"] == 0


def test_container_pids_by_memory(tmp_path):
    # no /proc view of the host PIDs at all: fall back to "a process's own GPU is where it holds most memory"
    snap = gpu.snapshot(FakeNVML(_gpus([(5000, 4000), (5001, 600)], [(5001, 4000)])), host="node0")
    ranks = {s["rank"]: s for s in _ranks(pids=(10, 11))}
    assert gpu.match_processes(snap, ranks, proc_root=str(tmp_path)) == {5000: 0, 5001: 1}


def test_cuda_visible_devices_mapping():
    devices = [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}, {"index": 2, "uuid": "GPU-cccc"}]
    assert gpu.physical_index(0, "2,1", devices) == 2
    assert gpu.physical_index(1, "GPU-cccc,GPU-aaaa", devices) == 0
    assert gpu.own_gpu({"local_rank": 1, "cuda": {"uuid": "GPU-cccc"}}, devices) == 2
    assert gpu.own_gpu({"local_rank": 1}, devices) == 1


def test_utilization_sampled_until_stopped():
    stop = threading.Event()
    nv = FakeNVML([{"uuid": "GPU-aaaa", "total_mib": 1, "procs": [], "util": [0, 100, 0, 100]},
                   {"uuid": "GPU-bbbb", "total_mib": 1, "procs": [], "util": [7]}])
    orig = nv.nvmlDeviceGetUtilizationRates

    def reading(h):  # the 4th reading of device 1 stops the sampler
        if h.index == 1 and nv.util_calls[1] == 3:
            stop.set()
        return orig(h)

    nv.nvmlDeviceGetUtilizationRates = reading
    t0 = time.time()
    samples = gpu.sample_utilization(stop, period_s=0.01, nvml=nv)
    assert [s.gpu_pct for s in samples] == [(0, 7), (100, 7), (0, 7), (100, 7)]
    assert all(t0 <= a.t <= b.t for a, b in zip(samples, samples[1:]))
    assert nv.inited == 0  # NVML shut down again


def test_utilization_without_nvml():
    assert gpu.sample_utilization(threading.Event(), nvml=FakeNVML([], fail_init=True)) is None


def test_other_host_ignored():
    states = _ranks()
    states[1]["host"] = "node1"
    ev = evidence(*states)
    ev["gpu"] = gpu.snapshot(FakeNVML(_gpus(*SEED002)), host="node0")
    assert [f for f in diagnose_perf(ev) if f.code in ("DDP301", "DDP302")] == []


def _real_nvml():
    return gpu.snapshot() is not None


NO_NVML = "no NVML (no NVIDIA driver/GPU here): the real-NVML test needs one"


@pytest.mark.gpu
@pytest.mark.skipif(not _real_nvml(), reason=NO_NVML)
def test_real_nvml_snapshot():
    snap = gpu.snapshot()
    assert snap["devices"] and all("uuid" in d for d in snap["devices"])


@pytest.mark.gpu
@pytest.mark.skipif(not _real_nvml(), reason=NO_NVML)
def test_real_nvml_utilization():
    """Real readings: one per device per sample, each a percentage; busy work on cuda:0 shows above 0 on some device."""
    import torch

    stop = threading.Event()
    box: dict = {}
    sampler = threading.Thread(target=lambda: box.update(s=gpu.sample_utilization(stop, period_s=0.05)))
    sampler.start()
    try:
        a = torch.randn(4096, 4096, device="cuda:0")
        t_end = time.time() + 2.0
        while time.time() < t_end:  # about 2 s of back-to-back matrix products
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    finally:
        stop.set()
        sampler.join(10)
    samples = box["s"]
    n = len(gpu.snapshot()["devices"])
    assert len(samples) >= 10 and all(len(s.gpu_pct) == n and all(0 <= p <= 100 for p in s.gpu_pct)
                                      for s in samples)
    assert max(max(s.gpu_pct) for s in samples) > 0


def test_snapshot_published_by_the_probe():
    load = {"site": {"path": "/job/train.py", "line": 20, "function": "main"}, "map_location": None,
            "devices": ["cuda:0"]}
    states = _ranks(loads={1: [load]})
    states[0]["gpu"] = gpu.snapshot(FakeNVML(_gpus(*SEED002)), host="node0")
    assert [f.code for f in diagnose_perf(evidence(*states)) if f.code.startswith("DDP3")] == ["DDP301"]
