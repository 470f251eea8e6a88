"""Which device a prediction is for, and how much of it: one answer for `predict`, `sweep`, the
run form and the Anatomy page.

This machine's GPU (the run's `gpu`), else its RAM, unless the caller names a device kind or a GPU
model (a GPU model named is that GPU's prediction, on a machine without one too: its calibrated
memory, or this machine's where it is the GPU here). A stored run's is the device it ran on.
"""

from __future__ import annotations

from typing import NamedTuple

from anatomy.analysis.machine import Machine
from anatomy.analysis.report import RunReport
from anatomy.prediction import device_constants


class Target(NamedTuple):
    device: str  # "cuda" or "cpu": the kernels and the allocator the prediction assumes
    gpu_name: str | None  # the GPU model whose calibrated constants it takes
    total: int | None  # the device's memory (NVML's total, or the RAM); None: not asked (a stored run)
    # A CPU's: the anonymous memory of the process that will start the run, where the caller is
    # it (the dashboard, larger than the CLI's measured front); it shares the RAM with the run.
    front: int | None = None

    @property
    def bound(self) -> int | None:
        """The memory that bounds the allocator's reserve: a GPU's (a CPU's RAM bounds none)."""
        return self.total if self.device == "cuda" else None


def target(machine: Machine, gpu: int = 0, *, device: str | None = None,
           gpu_model: str | None = None, front: int | None = None) -> Target:
    """The device a run with these options would use: `gpu` of this machine, or its RAM;
    `device` ("cuda", "cpu") and `gpu_model` (a calibrated name) choose another. `front`: the
    caller's anonymous memory, where the caller will start the run (a CPU run shares the RAM)."""
    device = device or ("cuda" if machine.has_gpu or gpu_model else "cpu")
    if device == "cpu":
        return Target(device, None, machine.ram_total, front)
    here = machine.devices[gpu] if machine.has_gpu and gpu < machine.gpu_count else None
    name = gpu_model or (here.name if here else None)
    constants = device_constants.load(name)
    total = here.total if here and here.name == (name or here.name) else constants.total_bytes
    return Target(device, name or constants.device, total)


def ran_on(report: RunReport) -> Target:
    """The device a stored run ran on, its GPU model's constants (its memory is not asked: the
    run has told what it held)."""
    return Target("cuda" if report.on_gpu else "cpu", report.environment.gpu_name, None)
