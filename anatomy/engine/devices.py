"""The devices a run can use: NVML's GPUs as CUDA_VISIBLE_DEVICES leaves them visible to torch.

NVML counts every GPU of the machine and ignores CUDA_VISIBLE_DEVICES; torch sees only the
visible ones, renumbered from 0. This is the one parser of that variable, so validation, the
sampler and the worker agree on which GPU "--gpu 1" is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from anatomy.analysis.machine import Device, Machine
from anatomy.engine import cgroups, nvml
from anatomy.store import checks
from anatomy.vocabulary import Backend, MemoryApi

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def visible_indices(value: str | None, uuids: Sequence[str | None]) -> list[int]:
    """NVML indices of the GPUs that CUDA_VISIBLE_DEVICES=`value` makes visible, in torch's order.

    `uuids` are the machine's GPUs' UUIDs by NVML index. As CUDA reads the variable: unset means
    every GPU, empty means none; an entry is an index or a UUID (or a unique prefix of one, with
    or without "GPU-"); the list ends at the first entry that names no GPU, or one named twice.
    """
    if value is None:
        return list(range(len(uuids)))
    found: list[int] = []
    for entry in (e.strip() for e in value.split(",")):
        index = _index_of(entry, uuids)
        if index is None or index in found:
            break
        found.append(index)
    return found


def _index_of(entry: str, uuids: Sequence[str | None]) -> int | None:
    index = checks.digits(entry)
    if index is not None:
        return index if index < len(uuids) else None
    if not entry:
        return None
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    matches = [i for i, uuid in enumerate(uuids) if uuid and uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def machine(environ: Mapping[str, str] = os.environ) -> Machine:
    """This machine's backend and the GPUs a run can use (NVML), or its RAM (no GPU): the RAM a
    run here can have, its container's limit where that is less than the machine's."""
    ram = cgroups.usable_ram()
    if nvml.available():
        infos = [nvml.device_info(i) for i in range(nvml.device_count())]
        visible = visible_indices(environ.get(VISIBLE_ENV), [d.uuid if d else None for d in infos])
        # A GPU NVML cannot describe is still one CUDA counts: it keeps its place in the order.
        devices = tuple(Device(index=k, nvml_index=i, name=infos[i].name, uuid=infos[i].uuid,
                               total=infos[i].total, memory_api=infos[i].memory_api)
                        if infos[i] else Device(index=k, nvml_index=i, name=f"GPU {i}", uuid=None,
                                                total=0, memory_api="none")
                        for k, i in enumerate(visible))
        if devices:
            return Machine(backend=Backend.NVML, memory_api=devices[0].memory_api, devices=devices,
                           driver=nvml.driver_version(), cuda_driver=nvml.cuda_driver_version(),
                           ram_total=ram, why_no_gpu=None)
        why = f"{VISIBLE_ENV}={environ.get(VISIBLE_ENV)!r} leaves no GPU visible"
    else:
        why = nvml.status()
    return Machine(backend=Backend.CPU_RSS, memory_api=MemoryApi.RSS, devices=(), driver=None,
                   cuda_driver=None, ram_total=ram, why_no_gpu=why, nvml_error=nvml.error())
