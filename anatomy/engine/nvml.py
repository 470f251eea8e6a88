"""The one module that talks to NVML. Every NVML error becomes a plain value or a clear message.

Callers never see an NVMLError: a field the driver does not support is None, a missing driver or
library makes `available()` false and `status()` say why. Tests replace `_lib` (the pynvml
module) with a fake, at this boundary only; everything above it runs for real.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

try:  # nvidia-ml-py provides the `pynvml` module
    import pynvml as _lib
except ImportError:  # pragma: no cover - it is in requirements.txt
    _lib = None

_state: dict[str, Any] = {"initialised": False, "error": None, "why": None}


@dataclass(frozen=True)
class Memory:
    """One reading of one GPU's memory, in bytes.

    `used` is v2's used (driver-reserved memory excluded) when `api == "v2"`, else v1's used,
    which on R510+ drivers includes the driver's reservation.
    """

    used: int
    total: int
    reserved: int | None
    api: str  # "v2" or "v1"


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str | None
    total: int
    memory_api: str


def _message(error: Exception) -> str:
    return f"NVML: {error}"


# Why NVML could not start, in a user's words, by its error (NVML's own words are the error's).
WHY = {"NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver here",
       "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA driver is not loaded",
       "NVML_ERROR_NO_PERMISSION": "NVML refuses this user",
       "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVIDIA driver's library and kernel module differ "
                                             "(a driver updated since the machine started)"}


_WHY_BY_CODE = {getattr(_lib, name): words for name, words in WHY.items()} if _lib else {}


def _why(error: Exception) -> str:
    if isinstance(error, OSError):  # libnvidia-ml.so itself is missing
        return WHY["NVML_ERROR_LIBRARY_NOT_FOUND"]
    return _WHY_BY_CODE.get(getattr(error, "value", None), "NVML cannot be used")


def init() -> bool:
    """Start NVML once per process; false (with `status()` saying why) when it cannot."""
    if _state["initialised"]:
        return True
    if _lib is None:
        _state.update(error="NVML: the nvidia-ml-py package is not installed",
                      why="nvidia-ml-py is not installed: no GPU can be read")
        return False
    try:
        _lib.nvmlInit()
    except Exception as error:  # NVMLError or OSError when libnvidia-ml.so is absent
        _state.update(error=_message(error), why=_why(error))
        return False
    _state.update(initialised=True, error=None, why=None)
    return True


def reset() -> None:
    """Forget the init state (tests swap `_lib`)."""
    _state.update(initialised=False, error=None, why=None)


def available() -> bool:
    return init() and device_count() > 0


def status() -> str:
    """Why NVML gives no GPU, in a user's words ("no NVIDIA driver here"), or "ok"; `error()`
    is NVML's own message."""
    if init():
        return "ok" if device_count() > 0 else "the NVIDIA driver finds no GPU"
    return _state["why"] or "NVML is not initialised"


def error() -> str | None:
    """NVML's own message for why it could not start ("NVML: NVML Shared Library Not Found");
    None once it has started."""
    init()
    return _state["error"]


def device_count() -> int:
    if not init():
        return 0
    try:
        return int(_lib.nvmlDeviceGetCount())
    except Exception:
        return 0


def _handle(index: int):
    return _lib.nvmlDeviceGetHandleByIndex(index)


def _device(index: int):
    """The handle of GPU `index`, or None without NVML or without such a GPU."""
    if not init():
        return None
    return _optional(_handle, index)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call, *args) -> Any:
    """A value the driver may not support: None instead of an error."""
    try:
        return call(*args)
    except Exception:
        return None


def memory(index: int) -> Memory | None:
    """Memory of GPU `index`: v2 where the driver has it (reserved separated), else v1."""
    handle = _device(index)
    if handle is None:
        return None
    version = getattr(_lib, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = _lib.nvmlDeviceGetMemoryInfo(handle, version=version)
            return Memory(int(info.used), int(info.total), int(info.reserved), "v2")
        except Exception:
            pass  # older driver: no nvmlDeviceGetMemoryInfo_v2, fall back to v1
    try:
        info = _lib.nvmlDeviceGetMemoryInfo(handle)
        return Memory(int(info.used), int(info.total), None, "v1")
    except Exception:
        return None


def utilization(index: int) -> int | None:
    """GPU utilisation in percent, or None where not supported."""
    if not init():
        return None
    rates = _optional(lambda: _lib.nvmlDeviceGetUtilizationRates(_handle(index)))
    return None if rates is None else int(rates.gpu)


def device_info(index: int) -> DeviceInfo | None:
    handle = _device(index)
    if handle is None:
        return None
    reading = memory(index)
    name = _optional(_lib.nvmlDeviceGetName, handle)
    uuid = _optional(_lib.nvmlDeviceGetUUID, handle)
    return DeviceInfo(
        index=index,
        name=_text(name) if name is not None else f"GPU {index}",
        uuid=_text(uuid) if uuid is not None else None,
        total=reading.total if reading else 0,
        memory_api=reading.api if reading else "none",
    )


def driver_version() -> str | None:
    if not init():
        return None
    value = _optional(_lib.nvmlSystemGetDriverVersion)
    return None if value is None else _text(value)


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, as "12.4"."""
    if not init():
        return None
    value = _optional(_lib.nvmlSystemGetCudaDriverVersion)
    return None if value is None else f"{value // 1000}.{value % 1000 // 10}"


# --- what nvitop shows beside memory (the live device panel, read a few times a second) ---

@dataclass(frozen=True)
class ProcessUse:
    """A process with a context on a GPU: its pid and the GPU memory the driver charges to it."""
    pid: int
    used: int | None  # bytes; None where the driver does not say (Windows WDDM, some containers)


def _milliwatts(call, index: int) -> float | None:
    if not init():
        return None
    value = _optional(lambda: call(_handle(index)))
    return None if value is None else value / 1000


def power(index: int) -> float | None:
    """Power draw of GPU `index` in watts, or None where not supported."""
    return _milliwatts(lambda handle: _lib.nvmlDeviceGetPowerUsage(handle), index)


def power_limit(index: int) -> float | None:
    """The power limit the driver enforces on GPU `index`, in watts, or None."""
    return _milliwatts(lambda handle: _lib.nvmlDeviceGetEnforcedPowerLimit(handle), index)


def temperature(index: int) -> int | None:
    """The GPU die's temperature in °C, or None where not supported."""
    if not init():
        return None
    value = _optional(lambda: _lib.nvmlDeviceGetTemperature(_handle(index),
                                                            _lib.NVML_TEMPERATURE_GPU))
    return None if value is None else int(value)


def processes(index: int) -> list[ProcessUse] | None:
    """Every process with a compute or graphics context on GPU `index` (each once), with its
    memory: this run's and anyone else's. None where the driver does not list them."""
    if not init():
        return None
    found: dict[int, ProcessUse] = {}
    listed = False
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        rows = _optional(lambda name=call: getattr(_lib, name)(_handle(index)))
        if rows is None:
            continue
        listed = True
        for row in rows:
            used = getattr(row, "usedGpuMemory", None)
            known = found.get(int(row.pid))
            total = None if used is None else int(used) + ((known.used or 0) if known else 0)
            found[int(row.pid)] = ProcessUse(int(row.pid), total)
    return list(found.values()) if listed else None
