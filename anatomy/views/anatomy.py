"""The Anatomy page's tables and words, computed without Streamlit: measured next to predicted
for each component, the waterfall from the CUDA context to the peak, the moments of a step, the
bytes per parameter next to the walkthrough's, what the operation classes mean on this device,
and each rank of several processes.

The numbers come from anatomy/prediction/breakdown.py (the run's measured components and its
prediction); this module names and arranges them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from anatomy import strategies
from anatomy.analysis.components import TENSOR_PARTS, Components
from anatomy.analysis.operations import (
    CONTRACTION,
    ELEMENTWISE,
    NORMALIZATION,
    OTHER,
    PAPER_SHARES,
    OperationProfile,
)
from anatomy.analysis.options import lora_words, option_words
from anatomy.analysis.report import RunReport
from anatomy.prediction import (
    Prediction,
    RankPrediction,
    walkthrough_bytes_per_parameter,
)
from anatomy.prediction.breakdown import (
    DataReach,
    cpu_peak,
    error_percent,
    measured_components,
    measured_peak,
    parameters,
    training_peak,
)
from anatomy.store import Sample, Step
from anatomy.units import MIB_NAME, mib_float, mib_text
from anatomy.views import text
from anatomy.views.style import COMPONENT_LABELS as LABELS
from anatomy.views.style import MOMENT_LABELS
from anatomy.vocabulary import PHASE_NAMES, Part, Phase, Precision, RecordedBy, Status

# The totals say what they add up: with the measured CUDA context below the parts, or without.
ALL_AT_ONCE = {False: "all at once", True: "context + all parts"}
TENSOR_PEAK = {False: "peak (tensors)", True: "context + tensor peak"}
# A CPU run's RSS beyond its tensors: the interpreter, torch's libraries, the data (measured
# before training on the predicted side: no prediction covers it).
BEYOND_TENSORS = "the process beyond its tensors"
WATERFALL_ORDER = (LABELS[Part.CONTEXT], *(LABELS[n] for n in TENSOR_PARTS), *ALL_AT_ONCE.values(),
                   "never held at once", *TENSOR_PEAK.values(), LABELS[Part.ALLOCATOR_CACHE],
                   LABELS[Part.NON_TORCH], "peak (NVML)", BEYOND_TENSORS,
                   "peak (RSS, over the baseline)", "peak (RSS)")


class ComponentRow(NamedTuple):
    component: str
    measured: int | None  # bytes; None: not measured
    predicted: int | None  # bytes; None: not predicted
    error_percent: float | None  # (predicted − measured) / measured
    note: str


class WaterfallStep(NamedTuple):
    label: str
    measure: str  # "relative" (adds `bytes`) or "total" (the running sum so far)
    bytes: int


class MomentRow(NamedTuple):
    moment: str
    predicted: int | None
    measured: int | None


class BytesPerParameterRow(NamedTuple):
    component: str
    measured: float | None
    predicted: float | None
    walkthrough: float | None


def user_run_basis(report: RunReport, steps: Sequence[Step] = ()) -> str:
    """What a prediction for a user's own training was made from, in words. Its sequence length
    is the longest batch the run trained on (`steps`' lengths, which a collator that pads each
    batch to its own longest makes differ): the peak is made there."""
    options = report.options
    config = report.environment.model_config or {}
    lengths = [s.seq_len for s in steps if s.seq_len is not None]
    if "vocab_size" not in config:  # images: their size is in the config
        length = ""
    elif lengths:
        spread = (f"{min(lengths)} to {max(lengths)} tokens over {len(lengths)} steps"
                  if min(lengths) != max(lengths) else f"every one of its {len(lengths)} steps")
        length = (f", sequence length {max(lengths)} (the longest batch it trained on: "
                  f"{spread})")
    elif report.ran_with.seq_len is not None:
        length = f", sequence length {options.seq_len} (the training set's first example)"
    else:
        length = f", sequence length {options.seq_len} assumed (the training set could not be read)"
    lora = f", {lora_words(options)}" if options.lora else ""
    return (f"Predicted from what the run recorded: the model's config, batch size "
            f"{options.batch_size}, {option_words(options)}, "
            f"{options.optim}{lora}{length}; on "
            f"random data of that shape, as anatomy's own runs train.{_unquantized(config)}")


def _unquantized(config: Mapping) -> str:
    """The basis's last sentence: what the prediction leaves out of the config ("" for none)."""
    words = text.unquantized(config)
    return f" {words}." if words else ""


def kept_model_basis(report: RunReport) -> str | None:
    """What a prediction of anatomy's own run was made from, where the run keeps its model's
    config (a config file, a model folder, a cached Hub id); None for a preset."""
    origin = text.model_origin(report)
    if origin is None:
        return None
    return (f"Predicted from the config the run kept of its model, {report.model} ({origin}), "
            "whatever became of the file since."
            f"{_unquantized(report.environment.model_config or {})}")


def measured_batch_line(report: RunReport) -> str | None:
    """Which micro-batch a run on a dataset is measured next to predicted at: the one its
    activations were measured on; None for other runs (and for one stored before the probe said
    which: it is predicted at its longest batch)."""
    batch = text.measured_text_batch(report)
    if batch is None:
        return None
    allocator = (" The allocator's peaks are those of the first steps whose micro-batches all "
                 "had that shape." if report.on_gpu else "")
    return (f"Measured and predicted at the micro-batch the activations were measured on: "
            f"{text.batch_words(batch)}. Padded to each batch's own longest text, the first steps' batches "
            "differ: the prediction is made for this one, so that both columns describe the same "
            f"batch.{allocator}")


def evaluation_line(report: RunReport) -> str | None:
    """A user's Trainer that evaluated once it had trained a step (while it trained, or after):
    the table's measured peak is the training's before its first evaluation (what the
    prediction describes), and the run's peak with its evaluations is said beside it; None for
    a run that did not."""
    at, whole, peak = report.evaluated_from, measured_peak(report), training_peak(report)
    if at is None or whole is None or peak is None:
        return None
    batch = report.environment.eval_batch_size
    figure = _sampled_figure(report)
    return (f"The Trainer evaluated from {at:,.1f} s"
            + (f" (batch {batch:,} a device)" if batch else "") + ", after its first steps: "
            "the table's measured "
            f"peak is the training's before that first evaluation, {mib_text(peak)}, "
            "a training step's, which the prediction describes. With its evaluations the run's "
            f"sampled peak ({figure}) was {mib_text(whole)}"
            + (f", {mib_text(whole - peak)} more." if whole > peak else
               ": the evaluations reached no higher."))


def _sampled_figure(report: RunReport) -> str:
    """What a run's sampled peak is, in words: NVML's or the RSS, over the baseline if any."""
    if report.on_gpu:
        return "NVML, over the baseline"
    return rss_peak_label(report).removeprefix("peak (").removesuffix(")")


def reach_line(report: RunReport, reach: DataReach) -> str:
    """What a run's data can reach: the prediction at its longest batch, beside the run's
    sampled peak over every step (RSS or NVML, as the run measured it)."""
    prediction, steps = reach.prediction, report.steps
    over = " over all its " + (f"{steps:,} steps" if steps else "steps")
    sampled = measured_peak(report)
    if report.on_gpu:
        predicted = (f"{mib_text(prediction.nvml_peak)} as NVML counts it "
                     f"({mib_text(prediction.peak)} for tensors)" if prediction.nvml_peak is not None
                     else f"{mib_text(prediction.peak)} for tensors (this GPU has no calibrated "
                          "constants for NVML's figure)")
    else:
        expected = cpu_peak(report, prediction)
        predicted = (f"{mib_text(prediction.peak)} for tensors" if expected is None else
                     f"{mib_text(expected.peak)} of RSS ({mib_text(prediction.peak)} for tensors "
                     "+ what the process held before training)")
    measured = ("no sample" if sampled is None else
                f"{mib_text(sampled)} ({_sampled_figure(report)})")
    return (f"What the data can reach: its longest batch, {text.batch_words(reach.longest)}, is predicted "
            f"to peak at {predicted}. The run's sampled peak{over}: {measured}.")


def no_components(report: RunReport) -> str:
    """Why a run has no measured components, for the way it was recorded."""
    return {
        RecordedBy.WORKER: "No measured components for this run (recorded before they were "
                         "measured, or it ended before its first optimizer step): the prediction "
                         "alone.",
        RecordedBy.CALLBACK: "No measured components: the callback measures them over the first "
                           "optimizer steps, and this run ended before its first.",
        RecordedBy.PHASE_API: "No measured components: the phase API marks phases and steps, it "
                            "does not look inside the model (a Trainer with "
                            "anatomy.AnatomyCallback() measures them).",
        RecordedBy.COMMAND: "No measured components: a watched command is measured from outside, "
                          "its memory alone (a Trainer with anatomy.AnatomyCallback() measures "
                          "them).",
    }[report.recorded_by]


def no_training(report: RunReport) -> str:
    """Why a run's first steps cannot be shown."""
    if report.recorded_by == RecordedBy.COMMAND:
        return ("A watched command that marks no phases has no training phase to show: its "
                "memory is on the Runs page.")
    if report.status == Status.RUNNING:
        return "This run has not reached the training phase yet."
    return "This run never reached the training phase."


# A step's peak within this share of the highest is the same memory: CPU RSS readings differ by
# a few pages from one step to the next.
REPEATS_WITHIN = 0.02


class Repetition(NamedTuple):
    """How the steps after the first compare: each step's peak is the highest sample from the
    end of the step before to its own end."""
    repeats: bool
    low: int  # bytes: the lowest and the highest peak of a step from step 2 on
    high: int
    lengths: tuple[int, int] | None  # the batches' shortest and longest sequence, where they differ

    def note(self) -> str:
        """The first-steps chart's note at step 2's end."""
        if self.repeats:
            return "from step 2 on, the memory repeats"
        return ("from step 2 on, the memory follows each batch's length" if self.lengths else
                "from step 2 on, the memory differs from step to step")

    def sentence(self) -> str:
        """The same in the caption, with its figures."""
        if self.repeats:
            return f"From step 2 on the memory repeats: every step peaks at {mib_text(self.high)}."
        spread = f"its steps peak at {mib_text(self.low)} to {mib_text(self.high)}"
        if self.lengths:
            shortest, longest = self.lengths
            return (f"From step 2 on the memory does not repeat: {spread}, as each batch is "
                    f"as long as its longest example ({shortest} to {longest} tokens).")
        return f"From step 2 on the memory does not repeat: {spread}."


def repetition(report: RunReport, samples: Sequence[Sample], steps: Sequence[Step]
               ) -> Repetition | None:
    """Whether the memory repeats from step 2 on, judged from the steps' peaks (on the GPU the
    run trains on); None before two steps after the first have samples."""
    training = report.training
    rows = sorted((s for s in samples if s.gpu == report.gpu), key=lambda s: s.t)
    if training is None or not rows:
        return None
    times = np.array([s.t for s in rows])
    used = np.array([s.used for s in rows])
    ends = [training.start_s, *(s.t for s in steps)]
    peaks, lengths = [], []
    for step, start, end in zip(steps, ends, ends[1:]):
        first, last = np.searchsorted(times, [start, end], side="right")
        if step.step >= 2 and last > first:
            peaks.append(int(used[first:last].max()))
            if step.seq_len is not None:
                lengths.append(step.seq_len)
    if len(peaks) < 2:
        return None
    low, high = min(peaks), max(peaks)
    return Repetition(high - low <= REPEATS_WITHIN * high, low, high,
                      (min(lengths), max(lengths)) if lengths and min(lengths) < max(lengths)
                      else None)


def first_steps_caption(report: RunReport, repeated: Repetition | None) -> str:
    """How the first steps build what training keeps, in the run's own terms: its optimizer where
    it is known to be AdamW, whether its steps repeat, its steps as the Trainer or run.step()
    reported them."""
    optim = report.ran_with.optim
    states = (" (AdamW: two fp32 tensors a parameter)"
              if isinstance(optim, str) and optim.startswith("adamw") else "")
    reported = ("run.step() reported it" if report.recorded_by == RecordedBy.PHASE_API
                else "the Trainer reports it")
    return ("Step 1 builds what the rest of training keeps: its forward pass makes the "
            "activations, its backward pass frees them as the gradients appear, and its optimizer "
            f"step creates the optimizer states{states}. "
            + ("" if repeated is None else repeated.sentence() + " ")
            + f"A dotted line is the end of a step as {reported}."
            + (" The caching allocator keeps what it reserved, so NVML's curve rises and stays up."
               if report.on_gpu else ""))


def not_profiled(report: RunReport) -> str:
    """How to get the operation classes a run does not have."""
    if report.started_by_anatomy:
        return ("This run was not profiled. Start a run with the run option **Profile steps** set "
                "to a few steps (or `anatomy run --profile-steps 3`): after training, "
                "torch.profiler profiles that many steps and every operator is put in a class.")
    return ("Only anatomy's own runs are profiled (the run option **Profile steps**, or "
            "`anatomy run --profile-steps 3`): a user's training is not.")


# The component table's notes in full, by whether the run was on a GPU.
NOTES = {
    True: f"the CUDA context is measured as the {PHASE_NAMES[Phase.KERNEL]} phase − the baseline "
          "and predicted by the "
          "GPU's calibrated constants; temporary buffers are the allocator's peak beyond the "
          "weights, the optimizer states and the larger of activations and gradients; the "
          "allocator cache is reserved − allocated at the allocator's peak, predicted by "
          "simulating PyTorch's caching allocator; outside PyTorch is NVML's peak − the context − "
          "reserved, predicted by the calibration.",
    False: "activations are measured as the tensors autograd saved in a forward pass; the CPU "
           "keeps no allocator statistics, so temporary buffers and the tensors' peak are "
           "predicted only; the RSS peak's prediction adds, to the tensors' predicted peak, what "
           "the process held before training beyond its weights (the interpreter, torch's "
           "libraries, the data: measured at the weights phase's end, never predicted).",
}


def component_rows(report: RunReport, prediction: Prediction) -> list[ComponentRow]:
    """One row per component, measured next to predicted."""
    measured = measured_components(report)
    on_gpu = report.on_gpu
    predicted = prediction.as_components()
    rows = []

    def row(name: str, m: int | None, p: int | None, note: str = "") -> None:
        rows.append(ComponentRow(name, m, p, error_percent(m, p), note))

    if on_gpu:
        row("CUDA context", measured.context, prediction.context,
            f"{PHASE_NAMES[Phase.KERNEL]} phase − baseline; predicted: calibrated")
    for name in TENSOR_PARTS:
        note = ""
        if name == Part.ACTIVATIONS and not on_gpu:
            note = "what autograd saved in a forward pass"
        elif name == Part.TEMPORARY:
            note = ("the peak beyond the parts it holds" if on_gpu else
                    "not measured on a CPU")
        row(LABELS[name], measured.get(name), predicted.get(name), note)
    parts = summed_parts(measured)
    row("sum of the parts", measured.sum_of(parts), predicted.sum_of(parts),
        "the four above at once: never reached" if parts != TENSOR_PARTS else
        "every part at once: never reached")
    row("peak (tensors)", measured.peak_allocated, prediction.peak,
        f"the allocator's peak; predicted in the {prediction.peak_at}" if on_gpu else
        "the CPU keeps no allocator statistics: not measured")
    # A dataset's run: the peak sampled over every step held other batches than the one
    # predicted here; it is held against the longest batch's prediction apart (`reach_line`).
    every_step = text.measured_text_batch(report) is not None
    apart = "sampled over every step's batch: see what the data can reach"
    if on_gpu:
        row("allocator cache", measured.allocator_cache, prediction.allocator_cache,
            "reserved − allocated at the peak (simulated)")
        row("outside PyTorch", measured.non_torch, None if every_step else prediction.outside,
            apart if every_step else "NVML's peak − context − reserved; calibrated")
        row("peak (NVML, over the baseline)", measured.peak,
            None if every_step else prediction.nvml_peak,
            apart if every_step else "context + tensors + allocator cache + outside PyTorch"
            + _workspace_band(prediction))
    else:
        expected = None if every_step else cpu_peak(report, prediction)
        row(rss_peak_label(report), training_peak(report),
            None if expected is None else expected.peak,
            apart if every_step else "tensors' peak + the process (not predicted)")
    return rows


def _workspace_band(prediction: Prediction) -> str:
    """NVML's band where cuDNN's convolution workspaces were not measured (not traced)."""
    if prediction.nvml_high is None:
        return ""
    return (f"; up to {mib_text(prediction.nvml_high)} with cuDNN's convolution workspaces "
            "(chosen as the run goes: not traced)")


def rss_peak_label(report: RunReport) -> str:
    """The RSS peak's name in the table and the waterfall: over the baseline where there is one
    (a callback started without anatomy.start() measured none)."""
    return ("peak (RSS, over the baseline)" if report.phase_memory()[Phase.BASELINE] is not None
            else "peak (RSS)")


def waterfall(report: RunReport, prediction: Prediction) -> dict[str, list[WaterfallStep]]:
    """The steps from the CUDA context to the peak, per side ("measured", "predicted"), in the
    order of `WATERFALL_ORDER`. Each side adds its parts,
    then takes away what is never held at once to reach the tensor peak; a GPU run's measured
    side goes on to NVML's peak, a CPU run's to the RSS peak, and so does the predicted side
    but for a run on a dataset (the table gives that row no prediction)."""
    measured = measured_components(report)
    on_gpu = report.on_gpu
    sides: dict[str, list[WaterfallStep]] = {}

    def climb(values: Components, peak: int | None, context: int | None) -> list[WaterfallStep]:
        steps = [] if context is None else [WaterfallStep(LABELS[Part.CONTEXT], "relative", context)]
        steps += [WaterfallStep(LABELS[n], "relative", values.get(n)) for n in TENSOR_PARTS
                  if values.get(n) is not None]
        steps.append(WaterfallStep(ALL_AT_ONCE[context is not None], "total", 0))
        if peak is not None:
            steps.append(WaterfallStep("never held at once", "relative", peak - sum(
                values.get(n) or 0 for n in TENSOR_PARTS)))
            steps.append(WaterfallStep(TENSOR_PEAK[context is not None], "total", 0))
        return steps

    if measured.sum_of(TENSOR_PARTS[:4]) is not None:
        steps = climb(measured, measured.peak_allocated, measured.context if on_gpu else None)
        if on_gpu and measured.peak_allocated is not None and measured.peak is not None:
            steps += [WaterfallStep(LABELS[Part.ALLOCATOR_CACHE], "relative",
                                    measured.allocator_cache or 0),
                      WaterfallStep(LABELS[Part.NON_TORCH], "relative", measured.non_torch or 0),
                      WaterfallStep("peak (NVML)", "total", 0)]
        peak = training_peak(report)
        if not on_gpu and peak is not None:  # on to the RSS peak, as the table says it
            steps += [WaterfallStep(BEYOND_TENSORS, "relative",
                                    peak - sum(s.bytes for s in steps if s.measure == "relative")),
                      WaterfallStep(rss_peak_label(report), "total", 0)]
        sides["measured"] = steps
    # The predicted side climbs from the predicted context to the predicted NVML figure.
    context = prediction.context if on_gpu else None
    predicted = climb(prediction.as_components(), prediction.peak, context)
    if text.measured_text_batch(report) is not None:
        # A dataset's run: as the table, no prediction beside the peak sampled over every step's
        # batch (one batch's would be held against another's; `reach_line` says the longest's):
        # the predicted side ends at the tensor peak, where the table's predictions end.
        sides["predicted"] = predicted
        return sides
    if on_gpu and prediction.nvml_peak is not None:
        predicted += [WaterfallStep(LABELS[Part.ALLOCATOR_CACHE], "relative",
                                    prediction.allocator_cache),
                      WaterfallStep(LABELS[Part.NON_TORCH], "relative", prediction.outside or 0),
                      WaterfallStep("peak (NVML)", "total", 0)]
    expected = cpu_peak(report, prediction)
    if expected is not None:  # the process before training: measured, as the table says
        predicted += [WaterfallStep(BEYOND_TENSORS, "relative", expected.before_training),
                      WaterfallStep(rss_peak_label(report), "total", 0)]
    sides["predicted"] = predicted
    return sides


def moment_rows(report: RunReport, prediction: Prediction) -> list[MomentRow]:
    """The allocator where the probe reads it (the latest forward pass, the fullest step before
    and after the optimizer), predicted and, on a GPU, measured; then the step's peak."""
    components = report.components
    measured = (components.moments if components else None) or {}
    rows = [MomentRow(label, prediction.marks.get(moment), measured.get(moment))
            for moment, label in MOMENT_LABELS.items()]
    rows.append(MomentRow(f"peak ({prediction.peak_at})", prediction.peak,
                          components.peak_allocated if components else None))
    return rows


def summed_parts(measured: Components) -> tuple[str, ...]:
    """The parts the sum of the parts adds, on both sides: like with like, without temporaries
    where they were not measured."""
    if measured.weights is not None and measured.temporary is None:
        return TENSOR_PARTS[:4]
    return TENSOR_PARTS


def predicted_sum_of_parts(report: RunReport, prediction: Prediction) -> int:
    """The sum of the parts as the table adds it, predicted: what the words and the moments'
    line say the peak stays below."""
    return prediction.as_components().sum_of(summed_parts(measured_components(report)))


def peak_is_below_the_parts(report: RunReport, prediction: Prediction) -> bool:
    """Whether the predicted peak is below the sum of the parts (no moment holds the activations
    and the gradients at once); the step's temporaries, where the parts leave them out (a CPU
    run's), can lift it above."""
    return prediction.peak < predicted_sum_of_parts(report, prediction)


def peak_title(report: RunReport, prediction: Prediction) -> str:
    """The section's title, as this run's numbers have it."""
    return ("Why the peak is less than the sum of the parts"
            if peak_is_below_the_parts(report, prediction)
            else "Why the peak is more than the sum of the parts")


def _apart(first: float, second: float) -> tuple[str, str]:
    """Two sizes said side by side, each in whole MiB unless that reads them alike while they
    differ: then both to a tenth, as the table has them (a small model's parts, 5.5 MiB, and its
    peak, 5.96 MiB, were "5 MiB" and "5 MiB", the peak "more" than the parts)."""
    whole = mib_text(first), mib_text(second)
    if whole[0] != whole[1] or first == second:
        return whole
    return f"{mib_float(first):,.1f} {MIB_NAME}", f"{mib_float(second):,.1f} {MIB_NAME}"


def peak_explanation(report: RunReport, prediction: Prediction) -> str:
    """Why the peak is less (or, a step's temporaries on top, more) than the sum of the parts,
    in this run's numbers."""
    measured = measured_components(report)
    parts = summed_parts(measured)
    all_parts, peak = _apart(predicted_sum_of_parts(report, prediction), prediction.peak)
    if peak_is_below_the_parts(report, prediction):
        text = (f"Added up, the parts come to {all_parts} (predicted), but no moment "
                f"of a step holds them all. The activations ({mib_text(prediction.activations)})"
                " are held from the forward pass into the backward pass and freed layer by layer"
                f" as the gradients ({mib_text(prediction.gradients)}) appear, so the peak holds"
                f" only the larger of the two: {peak}, in the {prediction.peak_at}.")
    else:  # said so, not as the story of a peak below them, whose numbers it contradicted
        text = (f"Added up, the parts come to {all_parts} (predicted); the peak, "
                f"{peak} in the {prediction.peak_at}, is more: the step's "
                "temporaries held at that moment (a kernel's workspace, the optimizer's "
                "intermediates), which the parts leave out, come on top of what they hold.")
    if measured.peak_allocated is not None and measured.sum_of(parts) is not None:
        summed, allocated = _apart(measured.sum_of(parts), measured.peak_allocated)
        text += (f" Measured: the parts add up to {summed}; the allocator's peak was "
                 f"{allocated}.")
    return text


def bytes_per_parameter_rows(report: RunReport, prediction: Prediction
                             ) -> list[BytesPerParameterRow]:
    """Weights, gradients, optimizer states (and their sum) per parameter: measured, predicted,
    and the walkthrough's figure for this run's precision and optimizer."""
    measured = report.components or Components()
    count = parameters(report, prediction)
    walkthrough = walkthrough_bytes_per_parameter(report.options)
    rows = []
    for name in (Part.WEIGHTS, Part.GRADIENTS, Part.OPTIMIZER_STATES):
        value = measured.get(name)
        rows.append(BytesPerParameterRow(
            LABELS[name], None if value is None else value / count,
            getattr(prediction, name) / prediction.parameters, walkthrough[name]))

    def total(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(values)

    # "all three", not the three names: a label that long pushed the walkthrough's column out of
    # a 1,000 px window.
    rows.append(BytesPerParameterRow("all three",
                                     total([r.measured for r in rows]),
                                     total([r.predicted for r in rows]),
                                     total([r.walkthrough for r in rows])))
    return rows


def operations_explanation(profile: OperationProfile, precision: str) -> str:
    """What the difference to the paper's shares means on the device the run was profiled on."""
    time = profile.time_shares()
    contraction = time.get(CONTRACTION, 0.0) * 100
    paper = PAPER_SHARES[CONTRACTION]["runtime"] * 100
    memory_bound = (time.get(NORMALIZATION, 0.0) + time.get(ELEMENTWISE, 0.0)) * 100
    paper_memory_bound = (PAPER_SHARES[NORMALIZATION]["runtime"]
                          + PAPER_SHARES[ELEMENTWISE]["runtime"]) * 100
    other = time.get(OTHER, 0.0) * 100
    if profile.device == "cuda":
        text = ("On this GPU a fused attention kernel (flash, memory-efficient or cuDNN) computes "
                "the softmax and the dropout inside the two matrix products, so their time counts "
                "as tensor contraction; the paper's PyTorch ran them as separate normalization and "
                "element-wise operators. ")
        if contraction > paper:
            text += (f"Contractions take {contraction:.0f}% of the time against the paper's "
                     f"{paper:.0f}%" + (": in fp32 the matrix products run without tensor cores "
                                        "(PyTorch keeps TF32 off for them), so they dominate."
                                        if precision == Precision.FP32 else "."))
        else:
            text += (f"Contractions take {contraction:.0f}% of the time against the paper's "
                     f"{paper:.0f}%: the products run fast on the tensor cores, and the "
                     f"memory-bound normalization and element-wise operators ({memory_bound:.0f}%,"
                     f" paper {paper_memory_bound:.0f}%) catch up.")
    else:
        text = ("On a CPU, time is each operator's own CPU time. SDPA's math path runs the "
                "softmax and the dropout as separate operators, as in the paper. "
                f"Contractions take {contraction:.0f}% of the time against the paper's "
                f"{paper:.0f}%; normalization and element-wise {memory_bound:.0f}% against "
                f"{paper_memory_bound:.0f}%: a tiny model's small matrices leave the per-operator "
                "overhead and memory traffic a larger share.")
    if other >= 5:
        text += (f" \"Other\" (copies, casts, views, fills, embedding lookups) takes {other:.0f}%"
                 + (": under autocast mostly the casts between fp32 and 16 bits, since the weights"
                    " stay fp32." if precision != Precision.FP32 else "."))
    return text


# --- several processes: each GPU measured next to its rank's prediction ---

class RankRow(NamedTuple):
    """One component of one rank: measured on its GPU, predicted for its rank (MiB text)."""
    gpu: str  # "GPU 1 (rank 1)"
    component: str
    measured: str
    predicted: str


def rank_rows(report: RunReport, predicted: RankPrediction | None) -> list[RankRow]:
    """Per GPU: weights, gradients, optimizer states, activations (the probe's, on that rank),
    the strategy's buffers (predicted only), the allocator's peak and NVML's peak."""
    rows = []
    for rank in report.ranks:
        parts = rank.components or Components()
        guess = {} if predicted is None else predicted.components()

        def add(name: str, measured, predicted_value, rank=rank) -> None:
            rows.append(RankRow(rank.label(), name, _mb_or_dash(measured),
                                _mb_or_dash(predicted_value)))

        for name in (Part.WEIGHTS, Part.GRADIENTS, Part.OPTIMIZER_STATES, Part.ACTIVATIONS):
            add(name.replace("_", " "), getattr(parts, name), guess.get(name))
        if predicted is not None and predicted.communication:
            what = strategies.named(predicted.strategy).communication
            add(what + " (in the peak)", None, predicted.communication)
        # The CPU keeps no allocator: its peak of tensors is predicted only, named as one run's.
        add("allocator's peak" if report.on_gpu else "peak (tensors)", parts.peak_allocated,
            guess.get("peak"))
        if not report.on_gpu:  # RSS: each rank's own processes (every rank's in old stores)
            rows.append(RankRow(rank.label(), "peak RSS (its own processes)" if
                                rank.measured_alone else "peak RSS (every rank together)",
                                _mb_or_dash(rank.peak_bytes), "—"))
            continue
        nvml = None if predicted is None else predicted.nvml_peak
        rows.append(RankRow(rank.label(), "peak as NVML counts it", _mb_or_dash(rank.peak_bytes),
                            mib_text(nvml) if nvml is not None else
                            ("NCCL's memory not calibrated" if predicted is not None else "—")))
    return rows


def _mb_or_dash(value: int | None) -> str:
    return "—" if value is None else mib_text(value)
