"""Whether a run fits its device, and which limit decides: its tensors, the caching allocator's
reserve, or NVML's total against the device.

A GPU's limits, from the inside out (memory.capacity_for): the tensors alive at the peak
(`torch.cuda.max_memory_allocated`); the allocator's reserve, its segments, which near the edge
hold free blocks no request can use (a split 20 MiB segment, a large block another block keeps
reserved); and what NVML counts, the CUDA context and what lives outside PyTorch on top of the
reserve, against the memory CUDA lets a process have. The allocator may reserve the device's
usable memory less the context and the rest (`capacity`); past it, it releases every free
segment and retries, and where that does not do, the run is out of memory.

- **tensors** decide when the allocated peak alone passes the capacity: no allocator could
  hold it;
- **the allocator's reserve** decides when the tensors fit the capacity and the replay through
  the simulated caching allocator at that capacity still runs out of memory (a request the
  free blocks of its segments cannot take);
- **NVML's total** decides, for a run that fits, how much the allocator keeps: where its reserve
  would pass the device's total, it releases its cache and reserves again, and nvidia-smi shows
  the device nearly full rather than the reserve the run would keep on a larger device.

A run that fits only without the device's edge margin (or its convolution margin: cuDNN's
workspaces are chosen as it runs) may not fit: said so. A run that does not fit is said not to,
with the largest batch size that does (memory.max_batch_size). Pure Python but the trace, which
memory.py makes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import RunOptions
from anatomy.prediction import replay
from anatomy.prediction.device_constants import DeviceCalibration
from anatomy.prediction.memory import (
    BatchFit,
    Limit,
    calibration_for,
    capacity_for,
    margins,
    max_batch_size,
    recording_for,
    steps_measured,
)
from anatomy.units import size_text


@dataclass(frozen=True)
class Verdict:
    """One run judged against its device."""

    fits: bool  # its replay at the device's capacity does not run out of memory
    sure: bool  # nor with the device's margins kept free (`fits` and not `sure`: may not fit)
    limit: Limit | None  # what decides: the limit passed (or, sure to fit, the one it meets)
    peak: int  # the tensors at the peak (allocated)
    reserved: int  # the allocator's reserve at its peak on this device (released at its total)
    capacity: int  # what the allocator may reserve (a CPU: what the tensors may fill)
    total: int  # the device's memory
    device: str
    refused: int = 0  # the request the allocator could not hold, where it runs out of memory
    nvml_peak: int | None = None  # NVML's figure on this device (the reserve as it allows it)
    largest: BatchFit | None = None  # where it does not fit, or may not: what does

    def line(self, where: str) -> str:
        """The verdict in words: fits or not on `where` (the device, said), the limit that
        decides, and the largest batch size that fits where this one does not surely."""
        if self.device != "cuda":
            if self.fits:
                return (f"fits {where}: {size_text(self.peak)} of tensors at the peak, of the "
                        f"{size_text(self.capacity)} a run may fill")
            return (f"does not fit {where}: its tensors decide — {size_text(self.peak)} at the "
                    f"peak, more than the {size_text(self.capacity)} a run may fill"
                    + self._largest_words())
        held = (f"{size_text(self.peak)} of tensors at the peak, of the "
                f"{size_text(self.capacity)} the allocator may hold")
        if not self.fits:
            if self.limit == Limit.TENSORS:
                return (f"does not fit {where}: its tensors decide — {size_text(self.peak)} at "
                        f"the peak, more than the {size_text(self.capacity)} the allocator may "
                        f"hold (the device less the CUDA context and what lives outside "
                        f"PyTorch)" + self._largest_words())
            return (f"does not fit {where}: the allocator's reserve decides — its tensors "
                    f"({size_text(self.peak)} at the peak) fit the {size_text(self.capacity)} it "
                    f"may hold, but near that its segments' free blocks cannot take a request "
                    f"of {size_text(self.refused)}" + self._largest_words())
        if not self.sure:
            kept = ("the caching allocator's edge, cuDNN's convolution workspaces"
                    if self._convolutions else "the caching allocator's edge")
            return (f"may not fit {where}: {held}, inside the margin kept free near it ({kept})"
                    + self._largest_words(surely=True))
        if self.limit == Limit.NVML:
            return (f"fits {where}: {held}; NVML's total decides what the allocator keeps — "
                    f"its reserve would pass the device, so it releases its cache and reserves "
                    f"again: about {size_text(self.nvml_peak)} as nvidia-smi counts it")
        return f"fits {where}: {held}"

    @property
    def _convolutions(self) -> bool:
        return bool(self.largest and self.largest.convolutions)

    def _largest_words(self, surely: bool = False) -> str:
        fit = self.largest
        if fit is None:
            return ""
        if fit.batch_size is None:
            return "; not even batch size 1 is sure to fit"
        return (f"; the largest batch size {'sure to fit' if surely else 'that fits'}: "
                f"{fit.size_text()}")

    def to_dict(self) -> dict:
        return {"fits": self.fits, "sure": self.sure,
                "limit": None if self.limit is None else self.limit.value, "peak": self.peak,
                "reserved": self.reserved, "capacity": self.capacity, "total": self.total,
                "refused": self.refused or None, "nvml_peak": self.nvml_peak,
                "largest_batch_size": None if self.largest is None else self.largest.batch_size}


def judge(options: RunOptions, *, device: str = "cuda", total: int, gpu_name: str | None = None,
          calibration: DeviceCalibration | None = None,
          measured: replay.Recording | None = None, text: TextBatch | None = None,
          front: int | None = None) -> Verdict:
    """Whether the run fits a device of `total` bytes and which limit decides (the module's
    rules), with the largest batch size that fits where it does not surely. `measured`: the
    run's recording with its convolutions' workspaces measured on this GPU
    (memory.measured_recording): then no convolution margin is kept. `text`: a dataset's batch
    (its longest): judged at it, with no largest batch size (each batch size forms its own
    longest batch). `front`: the anonymous memory of the process that will start the run, where
    it is the caller (a CPU's capacity leaves it out)."""
    if device == "cuda" and calibration is None:
        calibration = calibration_for(device, gpu_name)
    capacity = capacity_for(device, total, calibration, front)
    if text is not None:
        options = replace(options, batch_size=text.size, seq_len=text.padded_to)
    steps = steps_measured(options)
    recording = measured or recording_for(options, device, calibration, text=text)

    def replayed(capacity: int | None) -> replay.Measurement:
        return replay.measure(replay.stream(recording, steps, options.grad_accum),
                              cuda=device == "cuda", capacity=capacity)

    free = replayed(None)  # as `predict` lays it out: no device around it
    if device != "cuda":
        fits = free.peak_allocated <= capacity
        verdict = Verdict(fits, fits, None if fits else Limit.TENSORS, free.peak_allocated,
                          free.peak_allocated, capacity, total, device)
    else:
        verdict = _on_gpu(replayed, free, capacity, total, calibration,
                          max(margins(device, capacity, calibration,
                                      0.0 if measured else recording.convolution_share)))
    if verdict.sure or text is not None:
        return verdict
    return replace(verdict, largest=max_batch_size(
        options, device=device, total=total, gpu_name=gpu_name, calibration=calibration,
        front=front))


def _on_gpu(replayed, free: replay.Measurement, capacity: int, total: int,
            calibration: DeviceCalibration | None, margin: int) -> Verdict:
    outside = (calibration.context_bytes + calibration.outside_bytes) if calibration else 0
    if free.peak_reserved <= capacity - margin:  # never near the capacity: the replay as it is
        return Verdict(True, True, None, free.peak_allocated, free.peak_reserved, capacity,
                       total, "cuda", nvml_peak=outside + free.peak_reserved)
    capped = replayed(capacity)
    if capped.out_of_memory:
        limit = Limit.TENSORS if free.peak_allocated > capacity else Limit.RESERVE
        return Verdict(False, False, limit, free.peak_allocated, capped.peak_reserved,
                       capacity, total, "cuda", refused=capped.refused)
    sure = not margin or not replayed(capacity - margin).out_of_memory
    limit = Limit.MARGIN if not sure else Limit.NVML if free.peak_reserved > capacity else None
    return Verdict(True, sure, limit, free.peak_allocated, capped.peak_reserved, capacity,
                   total, "cuda", nvml_peak=outside + capped.peak_reserved)
