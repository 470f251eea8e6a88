"""Predicted training memory, component by component, for any model: the training step's
operators run on fake tensors (no memory), their storages followed as they are made and freed,
and the allocator's view of that simulated. No formula per model family.

`predict(options, device=...)` records the run (tracing/record.py: the model built on the meta
device, one of each part of the Trainer's step on fake tensors, with CUDA's kernels where the
device is "cuda"), replays it for the steps the probe measures (replay.py), and reads the same
figures the probe and the allocator report: weights, gradients, optimizer states, activations,
the allocator's peak and reserve, and on a GPU the NVML figure (the CUDA context + the reserve +
what lives outside PyTorch, from the device's calibration: device_constants.py).
docs/PREDICTION.md states every modelled effect and constant.

Importing this module imports no torch: the tracing does, when a prediction is made.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.components import MEASURED_STEPS, Components, rest_of_peak
from anatomy.analysis.lengths import TextBatch
from anatomy.analysis.options import FIELDS, RunOptions
from anatomy.prediction import device_constants, recordings, replay
from anatomy.prediction.device_constants import DeviceCalibration
from anatomy.prediction.step import TracedRun
from anatomy.strategies import TracedRank
from anatomy.units import size_text
from anatomy.vocabulary import Moment, Name, Part, Precision

# The walkthrough's bytes per parameter ("Model training anatomy", Anatomy of Model's Memory),
# shown beside what a run predicts and measures.
WALKTHROUGH_BYTES_PER_PARAMETER: dict[str, float] = {
    "weights, fp32": 4,
    "weights, mixed precision (fp32 + fp16 copy)": 6,
    "gradients (always fp32)": 4,
    "optimizer states, AdamW": 8,
    "optimizer states, 8-bit AdamW": 2,
    "optimizer states, SGD with momentum": 4,
    "mixed precision AdamW, all three (plus activations)": 18,
}

COMPONENTS = (Part.WEIGHTS, Part.GRADIENTS, Part.OPTIMIZER_STATES, Part.ACTIVATIONS, Part.TEMPORARY,
              Part.PEAK)
DEVICES = ("cuda", "cpu")
CPU_PROCESS_FILE = Path(__file__).parent / "cpu_process.json"


@dataclass(frozen=True)
class CpuProcess:
    """What a CPU run's process holds beside its tensors at its peak, measured
    (bench/cpu_process_share.py: prediction/breakdown.py's `process_share` of CPU runs, the RSS
    peak less the tensors' predicted peak): a fixed part — the interpreter, torch,
    transformers, the data — and a fraction of the tensors' peak, what the C allocator keeps of
    the tensors it freed. A CPU run's tensors share the machine (or the container) with it and
    with the run's other processes (`companions_bytes`: the front and the sampler, interpreters
    without torch, their memory of their own): in a container of just enough memory the largest
    batch predicted to fit was killed for memory by theirs. `front_bytes`: the CLI front's part
    of them; a front that predicts the run it will start (the dashboard) tells its own
    (`dashboard_front`)."""
    fixed_bytes: int
    tensor_fraction: float
    companions_bytes: int
    front_bytes: int
    dashboard_bytes: int  # the dashboard's own memory once it has traced a forecast, measured
    measured: str

    def dashboard_front(self, now: int | None) -> int:
        """The dashboard's own memory for a run it starts: what it holds `now`, at least what it
        was measured to hold once its forecasts have loaded torch and traced (it holds less
        before its first, and a forecast made then undercounted the run's front)."""
        return max(now or 0, self.dashboard_bytes)

    def share(self, tensors: int) -> int:
        """What the run holds beside a tensors' peak of `tensors` bytes: its process's share and
        its other processes."""
        return self.fixed_bytes + self.companions_bytes + round(self.tensor_fraction * tensors)

    def capacity(self, total: int, front: int | None = None) -> int:
        """The largest tensors' peak whose run fits in `total` bytes of RAM; `front`: the
        anonymous memory of the process that starts the run, where it is known (None: the CLI's,
        measured)."""
        companions = self.companions_bytes - self.front_bytes + max(front or 0, self.front_bytes)
        return max(0, math.floor((total - self.fixed_bytes - companions)
                                 / (1 + self.tensor_fraction)))

    @classmethod
    def load(cls, path: Path = CPU_PROCESS_FILE) -> CpuProcess:
        data = json.loads(path.read_text())
        return cls(data["fixed_bytes"], data["tensor_fraction"], data["companions_bytes"],
                   data["front_bytes"], data["dashboard_bytes"], data["measured"])


CPU_PROCESS = CpuProcess.load()
# Sizes are linear in the batch size from 2 on: at 1 some reshapes are views (a dimension of
# size 1 leaves a tensor contiguous) that copy from 2 on.
LINEAR_FROM = 2


class PredictionError(ValueError):
    """A run that cannot be predicted (its model cannot be built), in one line."""


class Limit(Name):
    """What decides whether a run fits its device (prediction/limits.py)."""

    TENSORS = "tensors"  # the allocated peak alone passes what the allocator may hold
    RESERVE = "the allocator's reserve"  # the tensors fit; the caching allocator's segments do not
    NVML = "NVML's total"  # fits; its reserve would pass the device: the cache is released
    MARGIN = "the margin"  # fits the capacity, not with the device's margins kept free


@dataclass(frozen=True)
class Prediction:
    parameters: int
    trainable_parameters: int
    weights: int  # bytes of the parameters' storages
    gradients: int  # of the .grad tensors (the trainable parameters' only)
    optimizer_states: int
    # The probe's reading: on a GPU allocated at the end of the forward pass over its start; on
    # a CPU, which keeps no allocator statistics, the storages autograd saved in it
    activations: int
    peak: int  # the allocator's peak over the measured steps (CPU: the live tensors' peak)
    peak_at: str  # the stretch of a step the peak falls in: forward pass, backward pass, ...
    device: str  # "cuda" or "cpu": which kernels and allocator the figures assume
    moments: dict[str, int]  # the fullest moment of each stretch of a step, from step 2 on
    marks: dict[str, int] = field(default_factory=dict)  # allocated where the probe reads it
    peak_reserved: int = 0  # the caching allocator's reserve at its peak (CUDA)
    weights_allocated: int = 0  # the weights phase, as the allocator holds it
    weights_reserved: int = 0
    context: int | None = None  # the CUDA context (calibrated)
    outside: int | None = None  # NVML beyond the context and the reserve (calibrated)
    gpu: str | None = None  # the GPU model whose constants were used
    calibrated: bool = False  # False: DEFAULT's constants, not measured for this GPU
    attention_kernels: tuple[str, ...] = ()  # the attention kernels a forward pass calls (CUDA)
    lora: bool = False
    steps: int = MEASURED_STEPS
    # What cuDNN's convolution workspaces, not traced, may add to the reserve (the device's
    # `workspace_band` of the convolutions' share of the peak); 0 where there are no
    # convolutions or their workspaces were measured on this GPU and traced (`workspaces_measured`)
    workspace_band: int = 0
    workspaces_measured: bool = False

    @property
    def nvml_peak(self) -> int | None:
        """What nvidia-smi should show at the peak: the context, the allocator's reserve, and
        what lives outside PyTorch."""
        if self.device != "cuda" or self.context is None:
            return None
        return self.context + self.peak_reserved + (self.outside or 0)

    @property
    def nvml_high(self) -> int | None:
        """The top of NVML's band: `nvml_peak` with what cuDNN's workspaces may add (None
        without a band)."""
        nvml = self.nvml_peak
        return None if nvml is None or not self.workspace_band else nvml + self.workspace_band

    @property
    def allocator_cache(self) -> int:
        return max(0, self.peak_reserved - self.peak) if self.device == "cuda" else 0

    @property
    def temporary(self) -> int:
        """What the peak holds beyond the components alive at it, by the arithmetic the measured
        side uses (`components.rest_of_peak`), so the two compare like with like."""
        return rest_of_peak(self.weights, self.optimizer_states, self.activations,
                            self.gradients, self.peak)

    @property
    def sum_of_parts(self) -> int:
        """The walkthrough's arithmetic: every component at once. The real peak is smaller,
        since activations are freed in the backward pass while the gradients appear."""
        return (self.weights + self.gradients + self.optimizer_states + self.activations
                + self.temporary)

    def components(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COMPONENTS}

    def as_components(self) -> Components:
        """The predicted parts in the measured side's shape, to be read the same way."""
        return Components(weights=self.weights, gradients=self.gradients,
                          optimizer_states=self.optimizer_states, activations=self.activations,
                          temporary=self.temporary, peak_allocated=self.peak,
                          peak_reserved=self.peak_reserved if self.device == "cuda" else None,
                          allocator_cache=self.allocator_cache if self.device == "cuda" else None,
                          context=self.context, non_torch=self.outside, peak=self.nvml_peak)

    def bytes_per_parameter(self) -> dict[str, float]:
        """This prediction in the walkthrough's unit, for the components it gives one for."""
        per = {name: getattr(self, name) / self.parameters
               for name in (Part.WEIGHTS, Part.GRADIENTS, Part.OPTIMIZER_STATES)}
        per["weights + gradients + optimizer states"] = sum(per.values())
        return per

    def need_line(self) -> str:
        """The sentence the CLI and the run form show."""
        size = size_text(self.peak)
        if self.device == "cuda":
            nvml = self.nvml_peak
            return (f"this run should need about {size} of GPU memory for tensors (peak: "
                    f"{self.peak_at}), {size_text(nvml)} as nvidia-smi counts it (CUDA context"
                    " and the allocator's cache included)" + self._workspace_words())
        return (f"this run should need about {size} of CPU memory for tensors (peak: "
                f"{self.peak_at}), plus the Python process itself")

    def _workspace_words(self) -> str:
        if self.workspaces_measured:
            return "; cuDNN's convolution workspaces measured on this GPU"
        if self.nvml_high is None:
            return ""
        return (f"; up to {size_text(self.nvml_high)} with cuDNN's convolution workspaces "
                "(chosen as the run goes: not traced)")

    def to_dict(self) -> dict:
        out = {"parameters": self.parameters, "trainable_parameters": self.trainable_parameters,
               "components": self.components(), "sum_of_parts": self.sum_of_parts,
               "peak_at": self.peak_at, "moments": self.moments, "device": self.device,
               "steps": self.steps}
        if self.device == "cuda":
            out.update(peak_reserved=self.peak_reserved, allocator_cache=self.allocator_cache,
                       context=self.context, outside=self.outside, nvml_peak=self.nvml_peak,
                       gpu=self.gpu, calibrated=self.calibrated,
                       attention_kernels=sorted(set(self.attention_kernels)),
                       nvml_high=self.nvml_high, workspaces_measured=self.workspaces_measured)
        return out


def walkthrough_bytes_per_parameter(options: RunOptions) -> dict[str, float | None]:
    """The walkthrough's figure for this run's weights, gradients and optimizer states; None where
    it gives none (Adafactor, Adagrad, RMSprop, the Trainer's momentum-less SGD, and LoRA, which
    trains a fraction of the parameters)."""
    if options.lora:
        return {Part.WEIGHTS: 4.0 if options.precision == Precision.FP32 else 6.0,
                Part.GRADIENTS: None, Part.OPTIMIZER_STATES: None}
    states = {"adamw_torch": 8.0, "adamw_torch_fused": 8.0}.get(options.optim)
    return {Part.WEIGHTS: 4.0 if options.precision == Precision.FP32 else 6.0,
            Part.GRADIENTS: 4.0, Part.OPTIMIZER_STATES: states}


# --- recording (cached: the Anatomy page and the form ask again and again) ---

def _recording(traced: TracedRun, device: str, calibration: DeviceCalibration | None,
               steps: int, rank: TracedRank | None = None, workspaces=None) -> replay.Recording:
    if workspaces is not None:  # this machine's measurements: traced anew, never cached
        return _traced_recording(traced, device, calibration, steps, rank, workspaces)
    return _cached_recording(traced, device, calibration, steps, rank)


@lru_cache(maxsize=16)
def _cached_recording(traced: TracedRun, device: str, calibration: DeviceCalibration | None,
                      steps: int, rank: TracedRank | None = None) -> replay.Recording:
    return _traced_recording(traced, device, calibration, steps, rank)


def _traced_recording(traced: TracedRun, device: str, calibration: DeviceCalibration | None,
                      steps: int, rank: TracedRank | None = None, workspaces=None
                      ) -> replay.Recording:
    try:
        spec = models.resolve(traced.model)
    except models.ModelError as error:
        raise PredictionError(str(error)) from None
    try:
        return recordings.recording(spec, traced.step_for(spec.task == models.IMAGE_CLASSIFICATION),
                                    device=device, calibration=calibration, steps=steps,
                                    lora_rank=traced.lora_rank, lora_targets=traced.lora_targets,
                                    rank=rank, workspaces=workspaces,
                                    lora_dropout=traced.lora_dropout, weights=traced.weights)
    except models.ModelError as error:
        raise PredictionError(str(error)) from None
    except ImportError as error:  # a library the head needs and this machine lacks: run's words
        raise PredictionError(str(models.cannot_build(spec.display_name, error))) from None
    except Exception as error:  # noqa: BLE001 - whatever the trace cannot follow: one line
        raise PredictionError(f"cannot predict {spec.display_name}: "
                              f"{models.where_it_stopped(error)}{models.first_line(error)}"
                              ) from None


def calibration_for(device: str, gpu_name: str | None) -> DeviceCalibration | None:
    return device_constants.load(gpu_name) if device == "cuda" else None


def steps_measured(options: RunOptions) -> int:
    """The steps the probe measures: MEASURED_STEPS, or fewer when the run is shorter."""
    return max(1, min(MEASURED_STEPS, options.total_steps()))


def predict(options: RunOptions, *, device: str = "cuda", gpu_name: str | None = None,
            calibration: DeviceCalibration | None = None, total: int | None = None,
            measured: replay.Recording | None = None, text: TextBatch | None = None
            ) -> Prediction:
    """Predicted memory of a training run with these options, on `device`'s kernels and
    allocator ("cuda" or "cpu"); `gpu_name` picks the calibrated constants ("NVIDIA H200");
    `total`: the GPU's memory (default: the calibrated GPU's), whose capacity bounds the
    allocator's reserve (`_held_by_device`); `measured`: the run's recording with its
    convolutions' workspaces measured on this GPU (`measured_recording`), in place of the
    band; `text`: a dataset's batch as the collator pads it (lengths.py), instead of the dummy
    data's. PredictionError when the model cannot be built."""
    if device not in DEVICES:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and calibration is None:
        calibration = calibration_for(device, gpu_name)
    if text is not None:
        options = replace(options, batch_size=text.size, seq_len=text.padded_to)
    steps = steps_measured(options)
    recording = measured or recording_for(options, device, calibration, text=text)
    laid_out = replay.measure(replay.stream(recording, steps, options.grad_accum),
                              cuda=device == "cuda")
    if device == "cuda":
        known = calibration or device_constants.DEFAULT
        laid_out = _held_by_device(recording, laid_out, options, steps, capacity_for(
            device, known.total_bytes if total is None else total, calibration))
    return _prediction(recording, laid_out, options, device, calibration, steps,
                       measured_workspaces=measured is not None)


def measured_recording(options: RunOptions, calibration: DeviceCalibration | None, measure
                       ) -> replay.Recording | None:
    """The run traced for a GPU with its convolutions' cuDNN workspaces measured on this
    machine's GPU at its batch size (`measure`: prediction/workspaces.py's, each distinct
    convolution alone, forward then backward, as the largest batch size's search measures
    them), each call's in its place; None where the run has no convolution. WorkspaceError
    where one cannot be measured (transposed, not 2-D) or the measurement fails."""
    from anatomy.prediction import workspaces

    batch, steps = options.batch_size, steps_measured(options)
    placeholders = workspaces.Placeholders()
    recording = _recording(TracedRun.of(options), "cuda", calibration, steps,
                           workspaces=placeholders)
    if placeholders.unmeasurable:
        raise workspaces.WorkspaceError(
            f"{placeholders.unmeasurable} of the run's convolutions are transposed or not 2-D: "
            "their workspaces are not measured")
    if not placeholders.keys:
        return None
    placeholders.table.merge(measure(list(placeholders.keys), [batch]))
    if placeholders.short(batch):  # more workspaces than places for them
        placeholders = workspaces.Placeholders(placeholders.table)
        recording = _recording(TracedRun.of(options), "cuda", calibration, steps,
                               workspaces=placeholders)
    return replace(recording, events=placeholders.fill(recording.events, batch))


def _held_by_device(recording: replay.Recording, free: replay.Measurement, options: RunOptions,
                    steps: int, capacity: int) -> replay.Measurement:
    """The run as the device lets its allocator lay it out. Where its reserve with no device
    around it passes the capacity, the caching allocator, refused by cudaMalloc, releases every
    cached segment and asks again (CUDACachingAllocator.cpp, `malloc`: release_cached_blocks,
    then alloc_block), so its reserve, and NVML's figure, stay at what the replay at the
    capacity holds. A run that runs out of memory even so keeps the figures without the device
    (prediction/limits.py says it does not fit)."""
    if free.peak_reserved <= capacity:
        return free
    capped = replay.measure(replay.stream(recording, steps, options.grad_accum), cuda=True,
                            capacity=capacity)
    return free if capped.out_of_memory else capped


def recording_for(options: RunOptions, device: str, calibration: DeviceCalibration | None,
                  text: TextBatch | None = None) -> replay.Recording:
    """The run's recording for the steps the probe measures (cached: `predict` asked for it
    first, the judgment against the device asks again); `text`: a dataset's batch, `options`
    already sized to it."""
    return _recording(TracedRun.of(options, text), device, calibration, steps_measured(options))


def _prediction(recording: replay.Recording, measured: replay.Measurement, options: RunOptions,
                device: str, calibration: DeviceCalibration | None, steps: int,
                measured_workspaces: bool = False) -> Prediction:
    cuda = device == "cuda"
    return Prediction(
        parameters=recording.parameters, trainable_parameters=recording.trainable_parameters,
        weights=recording.weights_bytes, gradients=recording.gradient_bytes,
        optimizer_states=recording.optimizer_state_bytes,
        activations=measured.activations(steps) if cuda else recording.saved_bytes,
        peak=measured.peak_allocated, peak_at=measured.peak_stretch, device=device,
        moments=dict(measured.peaks_by_stretch), marks=probe_marks(measured, steps),
        peak_reserved=measured.peak_reserved,
        weights_allocated=measured.weights_allocated, weights_reserved=measured.weights_reserved,
        context=calibration.context_bytes if cuda and calibration else None,
        outside=calibration.outside_bytes if cuda and calibration else None,
        gpu=calibration.device if cuda and calibration else None,
        calibrated=bool(cuda and calibration and calibration.fitted),
        attention_kernels=recording.attention_kernels, lora=options.lora, steps=steps,
        workspace_band=0 if not cuda or measured_workspaces else round(
            (calibration or device_constants.DEFAULT).workspace_band
            * recording.convolution_share * measured.peak_allocated),
        workspaces_measured=measured_workspaces)


# The probe's readings (engine/probe.py): the latest end of a forward pass, and the largest
# reading before and after each optimizer step, over the measured steps.
PROBE_MARKS = {Moment.END_OF_FORWARD: "forward ends",
               Moment.END_OF_BACKWARD: "before optimizer step",
               Moment.AFTER_OPTIMIZER_STEP: "after optimizer step"}


def probe_marks(measured: replay.Measurement, steps: int) -> dict[Moment, int]:
    out = {Moment.END_OF_FORWARD: measured.at_marks.get((steps, "forward ends"), 0)}
    for name in (Moment.END_OF_BACKWARD, Moment.AFTER_OPTIMIZER_STEP):
        out[name] = max((value for (step, label), value in measured.at_marks.items()
                         if label == PROBE_MARKS[name]), default=0)
    return out


# --- what fits ---

@dataclass(frozen=True)
class BatchFit:
    """The largest batch size predicted to fit, how sure, and what it was judged against.

    On a GPU a size may fit when its run, replayed through the simulated caching allocator
    with the device's capacity, does not run out of memory (free memory the allocator cannot
    reuse near its capacity included); it fits when it does not with the calibrated edge
    margin less. Sizes between `batch_size` and `may_fit` may run out of memory."""
    batch_size: int | None  # None: not even 1 fits
    capacity: int  # bytes the run may fill (the allocator's on a GPU, tensors' on a CPU)
    device: str
    peak_at_fit: int | None  # the predicted peak (allocated) at that batch size
    searched: tuple[int, ...]  # the batch sizes tried, in order
    exact: bool  # False: sizes taken as linear in the batch size from two recordings
    may_fit: int | None = None  # the largest that may fit (>= batch_size)
    peak_at_may_fit: int | None = None
    limit: int = FIELDS["batch_size"].high  # the batch size option's largest value
    convolutions: bool = False  # the margin is cuDNN's convolutions' (their workspaces unknown)
    workspaces_measured: bool = False  # cuDNN's workspaces measured on this GPU, no margin
    decided_by: Limit | None = None  # what keeps the next size from fitting (limits.py)
    peak_beyond: int | None = None  # the next size's predicted peak (allocated)

    @property
    def at_limit(self) -> bool:
        """The search stopped at the option's limit: larger batches were not tried."""
        return self.batch_size is not None and self.batch_size >= self.limit

    @property
    def uncertain(self) -> bool:
        """Larger sizes than `batch_size` fit without the margin: they may not."""
        return bool(self.may_fit) and self.may_fit > (self.batch_size or 0)

    def size_text(self) -> str:
        return f"≥ {self.limit}" if self.at_limit else str(self.batch_size)

    def margin(self) -> float | None:
        """How close `may_fit`'s peak comes to the capacity, as a fraction of it."""
        if not self.may_fit or self.peak_at_may_fit is None:
            return None
        return (self.capacity - self.peak_at_may_fit) / self.capacity

    def line(self, where: str) -> str:
        if self.batch_size is None:
            if self.may_fit:
                return (f"not even batch size 1 is sure to fit {where}; {self.may_fit} may "
                        f"(within {self.margin():.1%} of capacity)")
            return f"not even batch size 1 is predicted to fit {where}"
        text = (f"largest batch size predicted to fit {where}: {self.size_text()} (peak "
                f"{size_text(self.peak_at_fit)} of the {size_text(self.capacity)} "
                f"{'the allocator may hold' if self.device == 'cuda' else 'a run may fill'})")
        if self.at_limit:
            return text + "; the batch size option's limit: larger sizes were not tried"
        if self.uncertain:
            text += f"; {self.may_fit} is within {self.margin():.1%} of capacity — may not"
            if self.convolutions:
                text += " (cuDNN chooses its convolutions' workspaces as it runs)"
        text += self._limit_words()
        if self.workspaces_measured:
            text += "; cuDNN's convolution workspaces measured on this GPU"
        return text

    def _limit_words(self) -> str:
        """What decides at the next size, in words."""
        beyond = (self.batch_size or 0) + 1
        if self.decided_by is None or self.peak_beyond is None or self.uncertain:
            return ""
        if self.decided_by == Limit.TENSORS:
            return (f"; at {beyond} its tensors decide ({size_text(self.peak_beyond)} at the "
                    "peak)")
        if self.decided_by == Limit.RESERVE:
            return (f"; at {beyond} the allocator's reserve decides (its tensors, "
                    f"{size_text(self.peak_beyond)} at the peak, would fit; its segments "
                    "would not)")
        return f"; at {beyond} the margin kept free near the capacity decides"


def capacity_for(device: str, total: int, calibration: DeviceCalibration | None,
                 front: int | None = None) -> int:
    """What a run's tensors may take: on a GPU, what CUDA lets a process allocate (NVML's total
    less the driver's own share) less the CUDA context and what lives outside PyTorch (the
    allocator may reserve the rest); on a CPU, the RAM less the process's measured share and
    its companions' (`CPU_PROCESS`; `front`: the starting process's own, where known)."""
    if device == "cuda":
        known = calibration or device_constants.DEFAULT
        return known.usable(total) - (calibration.context_bytes + calibration.outside_bytes
                                      if calibration else 0)
    return CPU_PROCESS.capacity(total, front)


def _linear_recording(one: replay.Recording, two: replay.Recording, batch: int
                      ) -> replay.Recording | None:
    """The recording at `batch` from those at batch sizes LINEAR_FROM and LINEAR_FROM + 1, when
    both took the same operators (every size is then linear in the batch size, but a reduction's
    staging buffer, made again from its layout: tracing/reductions.py); None when they did not.
    The setup is the second's: the first recording in a process also makes torch's
    one-time scalars."""
    from anatomy.prediction.tracing import reductions  # torch: loaded by the traces

    if set(one.segments) != set(two.segments):
        return None
    events = list(two.events)
    for name, (start, end) in two.segments.items():
        if name == "setup":
            continue
        first = one.segment(name)
        if len(first) != end - start:
            return None
        for i, (a, b) in enumerate(zip(first, events[start:end]), start):
            if a[0] != b[0]:
                return None
            if a[0] == replay.ALLOC:
                staged = reductions.extrapolated(a[2], b[2], batch - LINEAR_FROM)
                size = staged if staged is not None \
                    else a[2] + (b[2] - a[2]) * (batch - LINEAR_FROM)
                if isinstance(b[2], replay.Workspace):  # a workspace stays one
                    size = replay.Workspace(size, b[2].key)
                events[i] = (b[0], b[1], size)
    return replace(two, events=events)


class BatchSizes:
    """A run's memory at any batch size, other options unchanged: two recordings (batch sizes 2
    and 3: the others are linear in them; a size whose operators differ, or 1, is recorded on
    its own), each size replayed through the caching allocator once (`measure`)."""

    def __init__(self, options: RunOptions, device: str,
                 calibration: DeviceCalibration | None, workspaces=None):
        """`workspaces`: prediction/workspaces.py's seam for the traces (its `fill` gives each
        size its convolutions' measured workspaces)."""
        self.options, self.device, self.calibration = options, device, calibration
        self.workspaces = workspaces
        self.traced = TracedRun.of(options)
        self.linear = False  # some size was taken as linear in the batch size
        self.tried: list[int] = []
        self._measured: dict[int, replay.Measurement] = {}
        self._capped: dict[tuple[int, int], bool] = {}
        self._recorded = {batch: self._record(batch) for batch in (LINEAR_FROM, LINEAR_FROM + 1)}
        self.convolution_share = self._recorded[LINEAR_FROM].convolution_share  # on a GPU

    def steps_at(self, batch: int) -> int:
        """The steps the run at `batch` takes of those the probe measures: a dataset of fewer
        samples than three batches runs fewer steps at a larger batch size (the default 512
        samples at 355: two), as `predict` at that batch size replays it."""
        return steps_measured(replace(self.options, batch_size=batch))

    def _record(self, batch: int) -> replay.Recording:
        return _recording(self.traced.at_batch(batch), self.device, self.calibration,
                          self.steps_at(batch), workspaces=self.workspaces)

    def _recording(self, batch: int) -> replay.Recording:
        recording = self._recorded.get(batch)
        if recording is None and batch > LINEAR_FROM:
            recording = _linear_recording(self._recorded[LINEAR_FROM],
                                          self._recorded[LINEAR_FROM + 1], batch)
            self.linear = self.linear or recording is not None
        if recording is None:  # batch size 1, or operators that change with the batch size
            recording = self._record(batch)
        if hasattr(self.workspaces, "fill"):  # the placeholders get this size's measurements
            recording = replace(recording, events=self.workspaces.fill(recording.events, batch))
        return recording

    def measure(self, batch: int) -> replay.Measurement:
        if batch not in self._measured:
            self.tried.append(batch)
            self._measured[batch] = replay.measure(
                replay.stream(self._recording(batch), self.steps_at(batch),
                              self.options.grad_accum),
                cuda=self.device == "cuda")
        return self._measured[batch]

    def out_of_memory(self, batch: int, capacity: int) -> bool:
        """Whether the run at `batch` runs out of `capacity` bytes: on a GPU as the caching
        allocator would (a cache it cannot reuse is released and the request retried), on a
        CPU when its tensors pass it."""
        measured = self.measure(batch)
        if self.device != "cuda" or measured.peak_reserved <= capacity:
            return measured.peak_allocated > capacity
        if measured.peak_allocated > capacity:
            return True
        key = (batch, capacity)  # near the edge: the allocator's own answer at that capacity
        if key not in self._capped:
            self._capped[key] = replay.measure(
                replay.stream(self._recording(batch), self.steps_at(batch),
                              self.options.grad_accum),
                cuda=True, capacity=capacity).out_of_memory
        return self._capped[key]

    def peak(self, batch: int | None) -> int | None:
        return self._measured[batch].peak_allocated if batch in self._measured else None


def max_batch_size(options: RunOptions, *, device: str = "cuda", total: int,
                   gpu_name: str | None = None,
                   calibration: DeviceCalibration | None = None, measure=None,
                   front: int | None = None) -> BatchFit:
    """The largest batch size (1 to the option's largest) whose run is predicted to fit `total`
    bytes of device memory, other options unchanged, and the largest that may fit: each size
    replayed through the simulated caching allocator at the capacity, and at the capacity less
    the device's edge margin (`BatchSizes.out_of_memory`; on a CPU, exact bytes against the
    RAM). `measure` (prediction/workspaces.measure, or None): where the run has convolutions,
    their cuDNN workspaces measured on this machine's GPU take the convolution margin's place
    (WorkspaceError where they cannot be). `front`: the anonymous memory of the process that
    will start the run, where it is the caller (a CPU's capacity leaves it out)."""
    if device == "cuda" and calibration is None:
        calibration = calibration_for(device, gpu_name)
    capacity = capacity_for(device, total, calibration, front)
    constants = calibration or device_constants.DEFAULT
    least = 0
    sizes = BatchSizes(options, device, calibration)
    edge_margin, convolutions = margins(device, capacity, calibration, sizes.convolution_share)
    sure = max(edge_margin, convolutions)

    # Where the edge margin alone binds, the edge may be ragged as the allocator sees it
    # (DeiT-base bf16 on the H200: 1,916 and 1,918 ran, 1,917 and 1,919 did not): the sizes
    # between the bisection's answer and the largest that may fit are checked down from the top.
    fit, may = _search(sizes, capacity, least, sure, scan=convolutions < sure)
    if measure is not None and convolutions > 0:
        pad = round(constants.edge_margin * capacity)
        edge = _MeasuredEdge(options, calibration, measure, fit or LINEAR_FROM,
                             (may or LINEAR_FROM) + 1)
        may = _largest(lambda batch: not edge.out_of_memory(batch, capacity),
                       fit, (may or 0) + 1)
        fit = may if not may or not pad else _largest(
            lambda batch: not edge.out_of_memory(batch, capacity - pad), min(fit, may), may + 1)
        limit, next_peak = _limit_at(fit + 1, capacity, pad, edge.out_of_memory,
                                     lambda batch: edge.sizes.measure(batch).peak_allocated)
        return BatchFit(fit or None, capacity, device, edge.peak(fit), tuple(edge.tried),
                        not edge.sizes.linear, may_fit=may or None, peak_at_may_fit=edge.peak(may),
                        workspaces_measured=True, decided_by=limit, peak_beyond=next_peak)
    limit, next_peak = _limit_at(fit + 1, capacity, sure, sizes.out_of_memory,
                                 lambda batch: sizes.measure(batch).peak_allocated)
    return BatchFit(fit or None, capacity, device, sizes.peak(fit), tuple(sizes.tried),
                    not sizes.linear, may_fit=may or None, peak_at_may_fit=sizes.peak(may),
                    convolutions=convolutions > 0 and convolutions >= sure, decided_by=limit,
                    peak_beyond=next_peak)


def margins(device: str, capacity: int, calibration: DeviceCalibration | None,
            convolution_share: float) -> tuple[int, int]:
    """What a size sure to fit keeps free of the capacity, in bytes: the device's edge margin
    (the caching allocator near its capacity), and the convolution margin in the share the
    convolutions make of the forward passes' results (cuDNN's workspaces are chosen as the run
    goes: tracing/cuda.py), fitted on runs with convolutions at the edge. None on a CPU."""
    if device != "cuda":
        return 0, 0
    constants = calibration or device_constants.DEFAULT
    return (round(constants.edge_margin * capacity),
            round(constants.convolution_margin * convolution_share * capacity))


def _limit_at(batch: int, capacity: int, margin: int, out_of_memory, peak
              ) -> tuple[Limit | None, int | None]:
    """What keeps `batch` (the size after the largest that fits) from fitting, and its peak:
    its tensors alone, the allocator's reserve at the capacity, or the margin kept free
    (prediction/limits.py). None past the batch size option's limit."""
    if batch > FIELDS["batch_size"].high:
        return None, None
    if out_of_memory(batch, capacity):
        tensors = peak(batch)
        return (Limit.TENSORS if tensors > capacity else Limit.RESERVE), tensors
    return Limit.MARGIN, peak(batch)


def _search(sizes: BatchSizes, capacity: int, least: int, sure: int,
            scan: bool = False) -> tuple[int, int]:
    """The largest size sure to fit (`sure` of the capacity free) and the largest that may
    (`least` free): doubling from LINEAR_FROM, then bisection; 0 where none does. `scan`: the
    sure size found, the sizes above it up to the largest that may fit checked down from the
    top (`_scan_down`)."""
    def fits(batch: int, margin: int) -> bool:
        return not sizes.out_of_memory(batch, capacity - margin)

    if fits(LINEAR_FROM, least):
        low, high = LINEAR_FROM, 2 * LINEAR_FROM
        while high <= FIELDS["batch_size"].high and fits(high, least):
            low, high = high, high * 2
        high = min(high, FIELDS["batch_size"].high + 1)
    else:
        low, high = 0, LINEAR_FROM
    may = _bisect(low, high, lambda batch: fits(batch, least))
    # The largest sure to fit: no larger than that.
    fit = may if not may or sure <= least else _bisect(
        0, may + 1, lambda batch: fits(batch, sure))
    if scan and fit < may:
        fit = _scan_down(lambda batch: fits(batch, sure), fit, may)
    return fit, may


class _MeasuredEdge:
    """The run's memory with its convolutions' workspaces measured on this GPU at every batch
    size replayed (prediction/workspaces.py): the distinct convolutions logged by the trace that
    puts placeholders in their workspaces' place, measured first at `around` (the margin's
    answers), then at each size when it is first asked about."""

    def __init__(self, options: RunOptions, calibration: DeviceCalibration | None, measure,
                 *around: int):
        from anatomy.prediction import workspaces

        self.options, self.calibration, self.measure = options, calibration, measure
        self.table = workspaces.Table()
        self._traced()
        if self.placeholders.unmeasurable:
            raise workspaces.WorkspaceError(
                f"{self.placeholders.unmeasurable} of the run's convolutions are transposed or "
                "not 2-D: their workspaces are not measured")
        self.keys = list(self.placeholders.keys)
        self.asked = sorted(set(around))
        self.table.merge(measure(self.keys, list(self.asked)))
        if any(self.placeholders.short(batch) for batch in self.asked):
            self._traced()  # more workspaces than places for them
        self.tried: list[int] = []

    def _traced(self) -> None:
        from anatomy.prediction import workspaces

        self.placeholders = workspaces.Placeholders(self.table)
        self.sizes = BatchSizes(self.options, "cuda", self.calibration,
                                workspaces=self.placeholders)

    def out_of_memory(self, batch: int, capacity: int) -> bool:
        if batch not in self.asked:
            self.asked.append(batch)
            self.table.merge(self.measure(self.keys, [batch]))
            if self.placeholders.short(batch):  # more workspaces than places for them
                self._traced()
        if batch not in self.tried:
            self.tried.append(batch)
        return self.sizes.out_of_memory(batch, capacity)

    def peak(self, batch: int | None) -> int | None:
        return self.sizes.peak(batch)


# Sizes checked one by one down from the top of a ragged edge to the size bisection found.
EDGE_SCAN = 24


def _largest(fits, low: int, high: int) -> int:
    """The largest size that fits near the edge, where it may be ragged (a size runs out of
    memory and a larger one runs: cuDNN's engines, and so the workspaces, change with the size;
    RegNet-Y-040 fp32 on the H200 ran at 1,312 and 1,335, not at 1,307, 1,315 or 1,336): a size
    bisection finds to fit with the next out of memory, then each size above it down from
    `high` (at most EDGE_SCAN), the first that fits taken."""
    found = _edge_search(fits, low, high)
    return _scan_down(fits, found, min(max(high, found + 1), FIELDS["batch_size"].high))


def _scan_down(fits, found: int, top: int) -> int:
    """The first size that fits down from `top` to above `found` (at most EDGE_SCAN of them),
    else `found`."""
    for batch in range(top, max(found, top - EDGE_SCAN), -1):
        if fits(batch):
            return batch
    return found


def _edge_search(fits, low: int, high: int) -> int:
    """The largest size that fits, asking only about sizes near the edge: from `low` (believed
    to fit; 0: none) and `high` (believed not to), each checked — halving `low` while it does
    not fit, widening past `high` while it does — then bisection: a size that fits with the
    next one out of memory."""
    while low and not fits(low):
        low, high = low // 2, low
    while high <= FIELDS["batch_size"].high and fits(high):
        low, high = high, min(high + max(1, high - low), FIELDS["batch_size"].high + 1)
    return _bisect(low, min(high, FIELDS["batch_size"].high + 1), fits)


def _bisect(low: int, high: int, fits) -> int:
    """The largest size in [low, high) that fits, `low` fitting (0: none known) and `high` not."""
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


# --- several processes: each rank's memory, as its strategy has it (anatomy/strategies/) ---

@dataclass(frozen=True)
class RankPrediction:
    """One rank's predicted memory with `world_size` processes under `strategy`. Components in
    bytes, per rank.

    Worked out by the strategy from the single-process prediction of the same per-device batch
    (`alone`; DDP: plus the reducer's buckets, every rank holding all of the model states), or
    rank 0's own step traced on a fake process group by the strategy's tracer (`traced`; FSDP,
    tracing/fsdp.py: its shards of the parameters, gradients and optimizer states, and the
    buffers of its collectives as torch makes them, as much of each as is alive at the rank's
    live-tensor peak). `buffers`: the strategy's own, by its names for them. Activations are a
    rank's own batch's. NCCL's own memory (its buffers and streams, outside PyTorch's allocator,
    seen only by NVML) is the device calibration's `nccl_bytes`, None where it was never
    measured."""

    strategy: str
    world_size: int
    alone: Prediction
    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: dict[str, int]
    peak: int  # the allocator's peak on one rank
    nccl: int | None  # NVML only; None: not calibrated
    traced: Prediction | None = None  # a traced rank's own step

    @property
    def communication(self) -> int:
        """What the strategy adds inside PyTorch's allocator: its buffers."""
        return sum(self.buffers.values())

    @property
    def nvml_peak(self) -> int | None:
        """What NVML should show on each GPU at the peak: the process's figure (the traced
        rank's, or the single process's moved by the change of the allocator's peak), plus
        NCCL's own (None: not calibrated)."""
        base = self.traced or self.alone
        if base.nvml_peak is None or self.nccl is None:
            return None
        return base.nvml_peak + (self.peak - base.peak) + self.nccl

    def as_prediction(self) -> Prediction:
        """One rank's prediction in a single process's shape, so that a rank's measured
        components are read against it as any run's are: its own weights, gradients and states;
        its peak and every moment of a step (the traced rank's, or the single process's moved by
        the strategy's buffers, alive throughout a step); NCCL's memory outside PyTorch, and no NVML
        figure while it is not calibrated."""
        calibrated = self.nccl is not None
        base = self.traced
        if base is None:
            alone, delta = self.alone, self.peak - self.alone.peak
            base = replace(
                alone, weights=self.weights, gradients=self.gradients,
                optimizer_states=self.optimizer_states, activations=self.activations,
                peak=self.peak, moments={k: v + delta for k, v in alone.moments.items()},
                peak_reserved=alone.peak_reserved + delta if alone.peak_reserved else 0)
        return replace(base, context=base.context if calibrated else None,
                       outside=(base.outside or 0) + self.nccl if calibrated else None)

    def components(self) -> dict[str, int]:
        return {Part.WEIGHTS.value: self.weights, Part.GRADIENTS.value: self.gradients,
                Part.OPTIMIZER_STATES.value: self.optimizer_states,
                Part.ACTIVATIONS.value: self.activations,
                **{name: self.buffers.get(name, 0) for name in strategies.buffer_names()},
                "peak": self.peak}

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "world_size": self.world_size,
                "components": self.components(), "nccl": self.nccl,
                "nccl_calibrated": self.nccl is not None, "nvml_peak": self.nvml_peak}

    def line(self) -> str:
        """Each rank's tensors beside one process's; on GPUs, NCCL's own memory (gloo's, on a CPU,
        is the process's)."""
        nccl = ("" if self.alone.device != "cuda" else "; NCCL's own memory: not calibrated"
                if self.nccl is None else f"; NCCL's own {size_text(self.nccl)}")
        return (f"each of the {self.world_size} processes ({self.strategy}) should need about "
                f"{size_text(self.peak)} for tensors (one process alone: "
                f"{size_text(self.alone.peak)}){nccl}")

    def need_line(self) -> str:
        """`Prediction.need_line` for several processes: what each needs, which is what one GPU
        holds; on a CPU the processes share the RAM, so together too."""
        size, at = size_text(self.peak), (self.traced or self.alone).peak_at
        if self.alone.device == "cuda":
            nvml = (f", {size_text(self.nvml_peak)} as nvidia-smi counts it" if self.nvml_peak
                    is not None else " (NCCL's own memory not calibrated: no nvidia-smi figure)")
            return (f"each of the {self.world_size} GPUs ({self.strategy}) should need about "
                    f"{size} of GPU memory for tensors (peak: {at}){nvml}")
        return (f"each of the {self.world_size} processes ({self.strategy}) should need about "
                f"{size} of CPU memory for tensors (peak: {at}), "
                f"{size_text(self.peak * self.world_size)} together, plus each process itself")


def rank_prediction(alone: Prediction, strategy: str, world_size: int, *,
                    nccl: int | None = None) -> RankPrediction:
    """A rank worked out by its strategy (no torch): `alone` is the single-process prediction.
    A strategy whose rank is traced has it from predict_ranks."""
    if world_size < 2:
        raise ValueError("several processes: world_size >= 2")
    rank = strategies.named(strategy).rank_memory(alone, world_size)
    return RankPrediction(strategy, world_size, alone, rank.weights, rank.gradients,
                          rank.optimizer_states, rank.activations, rank.buffers, rank.peak, nccl)


def alive_at_peak(events: list[tuple], kinds: dict[str, frozenset[int]]) -> dict[str, int]:
    """Bytes of each kind's storages alive at the events' live-tensor peak (the first moment
    the most bytes are alive)."""
    live: dict[int, int] = {}
    total = peak = 0
    at_peak: dict[str, int] = {kind: 0 for kind in kinds}
    for kind, tid, size in events:
        if kind == replay.ALLOC:
            live[tid] = size
            total += size
        elif kind == replay.FREE:
            total -= live.pop(tid, 0)
        if total > peak:
            peak = total
            at_peak = {name: sum(live.get(t, 0) for t in tids) for name, tids in kinds.items()}
    return at_peak


def predict_ranks(options: RunOptions, *, device: str = "cuda", gpu_name: str | None = None,
                  calibration: DeviceCalibration | None = None, text: TextBatch | None = None
                  ) -> RankPrediction:
    """Each rank's predicted memory for a run of several processes (`options.world_size`,
    `options.strategy`): from the single-process prediction of the same per-device batch
    (`rank_prediction`), or from rank 0's own step, traced, where the strategy has a tracer."""
    if device == "cuda" and calibration is None:
        calibration = calibration_for(device, gpu_name)
    alone = predict(options, device=device, calibration=calibration, text=text)
    if text is not None:
        options = replace(options, batch_size=text.size, seq_len=text.padded_to)
    nccl = calibration.nccl_bytes if device == "cuda" and calibration else None
    key = strategies.named(options.strategy).recording_key(options.world_size)
    if key is None:
        return rank_prediction(alone, options.strategy, options.world_size, nccl=nccl)
    steps = steps_measured(options)
    recording = _recording(TracedRun.of(options, text), device, calibration, steps, rank=key)
    measured = replay.measure(replay.stream(recording, steps, options.grad_accum),
                              cuda=device == "cuda")
    traced = _prediction(recording, measured, options, device, calibration, steps)
    step_begins = recording.segments["batches"][0]  # the step's, not the sharding's peak
    buffers = alive_at_peak(recording.events[step_begins:], recording.rank_buffers)
    return RankPrediction(options.strategy, options.world_size, alone, traced.weights,
                          traced.gradients, traced.optimizer_states, traced.activations, buffers,
                          traced.peak, nccl, traced)
