"""An honest fake of the pynvml (nvidia-ml-py) calls ddp_doctor.gpu makes: same names, same return shapes."""
from types import SimpleNamespace

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class FakeNVML:
    def __init__(self, gpus, fail_init=False):
        """gpus: list of {"uuid": str, "total_mib": int, "procs": [(pid, used_mib or None)], "util": [pct, ...]}

        ``util`` (optional): the utilisation readings of that device, one per call, the last one repeated."""
        self.gpus = gpus
        self.util_calls = [0] * len(gpus)
        self.fail_init = fail_init
        self.inited = 0
        self.NVMLError = NVMLError

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")
        self.inited += 1

    def nvmlShutdown(self):
        self.inited -= 1

    def _check(self):
        if self.inited <= 0:
            raise NVMLError("Uninitialized")

    def nvmlDeviceGetCount(self):
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check()
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return SimpleNamespace(index=i)

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self.gpus[h.index]
        used = sum((u or 0) for _, u in g["procs"]) * MIB
        return SimpleNamespace(total=g["total_mib"] * MIB, used=used, free=g["total_mib"] * MIB - used)

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h.index]["uuid"]  # str in nvidia-ml-py >= 11.5

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA A100-SXM4-40GB"  # bytes in older releases: handled

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if u is None else u * MIB, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for pid, u in self.gpus[h.index]["procs"]]

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check()
        readings = self.gpus[h.index].get("util") or [0]
        i = min(self.util_calls[h.index], len(readings) - 1)
        self.util_calls[h.index] += 1
        return SimpleNamespace(gpu=readings[i], memory=0)  # nvmlUtilization_t: .gpu and .memory, in %

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []
