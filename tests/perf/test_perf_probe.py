"""probe/perf.py hooks: torch.load records (site, map_location, devices) and the first CUDA use (faked on CPU)."""
import torch

from ddp_doctor.probe import perf as pp


def test_tensor_devices():
    obj = {"model": {"w": torch.ones(1)}, "opt": [torch.zeros(1, device="meta")], "n": 3}
    assert pp.tensor_devices(obj) == ["cpu", "meta"]


def test_torch_load_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "load", torch.load)  # restored after the test
    monkeypatch.setattr(pp, "_loads", [])
    pp._patch_load()
    torch.save({"w": torch.ones(2)}, tmp_path / "c.pt")
    out = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=True)  # this line is the recorded site
    assert torch.equal(out["w"], torch.ones(2))
    [rec] = pp._loads
    assert rec["devices"] == ["cpu"] and rec["map_location"] == "'cpu'"
    assert rec["site"]["path"] == __file__ and rec["site"]["function"] == "test_torch_load_recorded"
    assert pp.state()["loads"] == [rec]


def test_first_cuda_use_before_set_device(monkeypatch):
    calls = []
    state = {"init": False}

    def fake_lazy_init():
        calls.append("init")
        state["init"] = True

    monkeypatch.setattr(torch.cuda, "_lazy_init", fake_lazy_init)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set", d)))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["init"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(pp, "_cuda", {})
    monkeypatch.setattr(pp, "_set_device_called", False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    pp._patch_cuda()
    torch.cuda._lazy_init()  # stands for x.cuda() before torch.cuda.set_device(local_rank)
    torch.cuda.set_device(1)
    assert calls[0] == "init" and calls[-1] == ("set", 1)
    init = pp._cuda["init"]
    assert init["before_set_device"] is True and init["device"] == 0
    assert pp._cuda["visible"] == "0,1"
    assert init["site"]["function"] == "test_first_cuda_use_before_set_device"


def test_install_is_safe_and_idempotent(monkeypatch):
    monkeypatch.setattr(torch, "load", torch.load)
    monkeypatch.setattr(torch.cuda, "_lazy_init", torch.cuda._lazy_init)
    monkeypatch.setattr(torch.cuda, "set_device", torch.cuda.set_device)
    monkeypatch.setattr(pp, "_installed", False)
    monkeypatch.setenv("DDP_DOCTOR_NVML", "0")
    pp.install(None)
    pp.install(None)
    assert hasattr(torch.load, "__ddp_doctor_wrapped__")
    assert not hasattr(torch.load.__ddp_doctor_wrapped__, "__ddp_doctor_wrapped__")
    assert set(pp.state()) == {"loads", "cuda", "gpu", "h2d", "loadavg", "cpu_count"}


def test_h2d_copies_timed(monkeypatch):
    """The copy hook, with "meta" standing for the CUDA device (no GPU here)."""
    class Rec:
        def __init__(self):
            self.timeline = []

        def now(self):
            return 1.0

    rec = Rec()
    monkeypatch.setattr(torch.Tensor, "to", torch.Tensor.to)
    monkeypatch.setattr(torch.Tensor, "cuda", torch.Tensor.cuda)
    monkeypatch.setattr(pp, "_H2D_TARGET", "meta")
    monkeypatch.setattr(pp, "_h2d", {"s": 0.0, "n": 0})
    monkeypatch.setattr(pp, "_rec", rec)
    pp._patch_h2d()
    x = torch.ones(1000, 1000)
    y = x.to("meta")
    assert y.device.type == "meta"
    x.to(torch.float64)  # a CPU->CPU conversion is not a copy to the device
    assert pp._h2d["n"] == 1
    assert pp.state()["h2d"]["copies"] == 1


def test_h2d_split_in_diagnosis():
    from ddp_doctor.diagnose.perf import rank_split

    from perf_evidence import rank_state

    st = rank_state(0, steps=10, data=0.01, compute=0.02, coll=0.005)
    for e in [e for e in st["timeline"] if e["kind"] == "step"]:
        st["timeline"].append({"t": e["t"] + 0.011, "kind": "h2d", "dur": 0.004, "label": "copy"})
    sp = rank_split(st)
    assert abs(sp["h2d_s"] - 0.004) < 1e-9 and abs(sp["compute_s"] - 0.016) < 1e-9
