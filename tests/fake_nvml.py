"""A stand-in for the pynvml module, for the answers a machine without a GPU cannot give.

It raises pynvml's own NVMLError classes, so the wrapper's error handling runs for real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml

GIB = 1024**3


class FakePynvml:
    NVMLError = pynvml.NVMLError

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, gpus: int = 1, v2: bool = True, utilization: bool = True,
                 init_error: int | None = None, used: int = 2 * GIB, reserved: int = 615 * 2**20,
                 total: int = 141 * GIB, bindings_have_v2: bool = True, sensors: bool = True,
                 processes: dict[int, int | None] | None = None):
        self.gpus, self.v2, self.has_utilization = gpus, v2, utilization
        self.init_error = init_error
        # Power, temperature and the process list: a consumer GPU or a VM may support none.
        self.sensors = sensors
        # pid: GPU memory (None: the driver does not say), as nvidia-smi lists them.
        self.running = {4242: 3 * GIB, 777: None} if processes is None else processes
        self.used, self.reserved, self.total = used, reserved, total
        if bindings_have_v2:
            self.nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None:
            if not self.v2:  # a driver older than the v2 call
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return SimpleNamespace(version=version, total=self.total, reserved=self.reserved,
                                   free=self.total - self.used - self.reserved, used=self.used)
        # v1 `used` includes the driver's reservation on R510+ drivers
        return SimpleNamespace(total=self.total, free=self.total - self.used - self.reserved,
                               used=self.used + self.reserved)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if not self.has_utilization:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def _sensor(self, value):
        if not self.sensors:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._sensor(412_345)  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._sensor(700_000)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._sensor(54)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._sensor([SimpleNamespace(pid=pid, usedGpuMemory=used)
                             for pid, used in self.running.items()])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._sensor([])
