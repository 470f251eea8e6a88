"""Measured memory components of a training run: where the training phase's memory goes.

The worker's probe (anatomy/engine/probe.py) reads tensor sizes and the caching allocator over the
first steps, at the moments that matter:

- weights: bytes of the parameters;
- gradients: bytes of the `.grad` tensors just before the first optimizer step;
- optimizer_states: bytes of the optimizer's state tensors just after it;
- activations: memory held between the end of the forward pass and the start of the backward
  pass (the allocator's growth over the forward pass on a GPU; on a CPU, where torch keeps no
  allocator statistics, the unique storages autograd saved for the backward pass);
- temporary: what the allocator's peak holds beyond the components that can be alive together
  (`rest_of_peak`: workspaces, the optimizer's scratch, transient buffers of the backward pass);
- allocator_cache: memory the caching allocator reserved but did not hand out at its peak;
- peak_allocated / peak_reserved: the allocator's own peaks.

The CUDA context and the non-PyTorch rest come from the NVML samples (`with_nvml`).
Importing this module imports no torch: the CLI and the pages read stored components.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

MEASURED_STEPS = 3  # step 1 creates the optimizer's states; steps 2-3 are the steady state
ORDER = ("context", "weights", "gradients", "optimizer_states", "activations", "temporary",
         "allocator_cache", "non_torch", "peak")
TENSOR_PARTS = ("weights", "gradients", "optimizer_states", "activations", "temporary")


@dataclass(frozen=True)
class Components:
    """Bytes by component; None where this run did not measure one. Fields in the order a stored
    run's JSON lists them."""

    weights: int | None = None
    activations: int | None = None
    gradients: int | None = None
    optimizer_states: int | None = None
    temporary: int | None = None
    allocator_cache: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    moments: Mapping[str, int] | None = None  # the allocator at named moments of a step (GPU)
    steps_measured: int | None = None
    context: int | None = None  # the CUDA context: kernel phase − baseline (NVML)
    non_torch: int | None = None  # NVML's peak beyond the context and the allocator's reserve
    peak: int | None = None  # the sampled peak over the baseline
    extra: Mapping[str, Any] = field(default_factory=dict)  # what a newer anatomy stored
    stored_order: tuple[str, ...] = field(default=(), compare=False)  # the keys as stored

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Components:
        known = {f.name for f in fields(cls)} - {"extra", "stored_order"}
        return cls(**{k: v for k, v in values.items() if k in known},
                   extra={k: v for k, v in values.items() if k not in known},
                   stored_order=tuple(values))

    def to_dict(self) -> dict[str, Any]:
        """As stored (in the stored order), then what was computed when it was read, in the
        order it is computed: a stored run prints as it always did."""
        names = [f.name for f in fields(self) if f.name not in ("extra", "stored_order")]
        order = [*self.stored_order, *(n for n in names if n not in self.stored_order)]
        out = {}
        for name in order:
            value = self.extra.get(name) if name in self.extra else getattr(self, name, None)
            if value is not None:
                out[name] = dict(value) if isinstance(value, Mapping) else value
        return out

    def get(self, name: str) -> int | None:
        """A component by its name (ORDER's words), for tables that list them in turn."""
        return getattr(self, name)

    def sum_of(self, names: tuple[str, ...] = TENSOR_PARTS) -> int | None:
        """The walkthrough's arithmetic: these parts all at once (None if one is missing)."""
        found = [self.get(name) for name in names]
        return None if any(v is None for v in found) else sum(found)


def rest_of_peak(weights: int, optimizer_states: int, activations: int, gradients: int,
                 peak: int) -> int:
    """The peak beyond the components alive at it. Activations and gradients are never all alive
    at once (activations are freed in the backward pass as gradients appear), so the peak holds
    weights + optimizer states + the larger of the two. The same arithmetic serves the measured
    and the predicted side, so the two can be compared."""
    return max(0, peak - (weights + optimizer_states + max(activations, gradients)))


def with_nvml(measured: Components, memory: Mapping[str, int | None], peak: int | None,
              backend: str) -> Components:
    """The measured components completed with what only the samples know: the CUDA context
    (kernel phase − baseline) and, at the training phase's peak, what PyTorch's allocator does
    not hold (lazily loaded kernels, library workspaces outside the allocator). `memory` is the
    memory at the end of each phase, by name."""
    out = measured
    if out.peak_allocated is not None:  # computed when read: every stored run uses today's rule
        out = replace(out, temporary=rest_of_peak(
            out.weights or 0, out.optimizer_states or 0, out.activations or 0, out.gradients or 0,
            out.peak_allocated))
    kernel, baseline = memory.get("kernel"), memory.get("baseline")
    if backend == "nvml" and kernel is not None and baseline is not None:
        out = replace(out, context=kernel - baseline)
        if peak is not None and out.peak_reserved is not None:
            out = replace(out, non_torch=max(0, peak - kernel - out.peak_reserved))
    if peak is not None and baseline is not None:
        out = replace(out, peak=peak - baseline)
    return out
