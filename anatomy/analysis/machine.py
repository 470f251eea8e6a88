"""What a machine measures with, as every reader sees it: the backend and the GPUs a run can use.

The engine finds it (anatomy/engine/devices.py); validation, the pages and the CLI read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from anatomy.vocabulary import Backend, MemoryApi


@dataclass(frozen=True)
class Device:
    """A GPU a run can use. `index` is torch's (its place among the visible devices); `nvml_index`
    is NVML's, which ignores CUDA_VISIBLE_DEVICES."""

    index: int
    nvml_index: int
    name: str
    uuid: str | None
    total: int  # bytes
    memory_api: str  # "v2" or "v1"


@dataclass(frozen=True)
class Machine:
    backend: Backend
    memory_api: MemoryApi | str  # a GPU NVML cannot describe: "none"
    devices: tuple[Device, ...]  # the GPUs a run can use, in torch's order
    driver: str | None
    cuda_driver: str | None
    ram_total: int
    why_no_gpu: str | None  # in words, when there is none ("no NVIDIA driver here")
    nvml_error: str | None = None  # NVML's own message, when it could not start

    @property
    def gpu_count(self) -> int:
        return len(self.devices)

    @property
    def has_gpu(self) -> bool:
        return bool(self.devices)
