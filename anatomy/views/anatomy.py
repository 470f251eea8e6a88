"""The Anatomy page's tables and words, computed without Streamlit: measured next to predicted
for each component, the waterfall from the CUDA context to the peak, the moments of a step, the
bytes per parameter next to the walkthrough's, what the operation classes mean on this device,
and each rank of several processes.

The numbers come from anatomy/analysis/breakdown.py (the run's measured components and its
prediction); this module names and arranges them.
"""

from __future__ import annotations

from typing import NamedTuple

from anatomy.analysis.breakdown import error_percent, measured_components, parameters
from anatomy.analysis.components import TENSOR_PARTS, Components
from anatomy.analysis.operations import (
    CONTRACTION,
    ELEMENTWISE,
    NORMALIZATION,
    OTHER,
    PAPER_SHARES,
    OperationProfile,
)
from anatomy.analysis.prediction import (
    Prediction,
    RankPrediction,
    walkthrough_bytes_per_parameter,
)
from anatomy.analysis.report import RunReport
from anatomy.units import mb_text
from anatomy.views.style import COMPONENT_LABELS as LABELS
from anatomy.views.style import MOMENT_LABELS
from anatomy.vocabulary import Part

# The totals say what they add up: with the measured CUDA context below the parts, or without.
ALL_AT_ONCE = {False: "all at once", True: "context + all parts"}
TENSOR_PEAK = {False: "peak (tensors)", True: "context + tensor peak"}
WATERFALL_ORDER = (LABELS[Part.CONTEXT], *(LABELS[n] for n in TENSOR_PARTS), *ALL_AT_ONCE.values(),
                   "never held at once", *TENSOR_PEAK.values(), LABELS[Part.ALLOCATOR_CACHE],
                   LABELS[Part.NON_TORCH], "peak (NVML)")


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


def user_run_basis(report: RunReport) -> str:
    """What a prediction for a user's own training was made from, in words."""
    options, stored = report.options, report.stored_options
    config = report.environment.model_config or {}
    length = ("" if "vocab_size" not in config else  # images: their size is in the config
              f", sequence length {options.seq_len} (the training set's first example)"
              if "seq_len" in stored else
              f", sequence length {options.seq_len} assumed (the training set could not be read)")
    lora = f", LoRA rank {options.lora_rank}" if options.lora else ""
    return (f"Predicted from what the run recorded: the model's config, batch size "
            f"{options.batch_size}, {options.precision}, {options.optim}{lora}{length}; on "
            "random data of that shape, as anatomy's own runs train.")


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
            "measured: the kernel phase − the baseline; predicted: the GPU's calibration")
    for name in TENSOR_PARTS:
        note = ""
        if name == "activations" and not on_gpu:
            note = "measured: the storages autograd saved in a forward pass"
        elif name == "temporary":
            note = ("the peak beyond weights, optimizer states and the larger of activations "
                    "and gradients" if on_gpu else "not measured on a CPU")
        row(LABELS[name], measured.get(name), predicted.get(name), note)
    if measured.weights is not None and measured.temporary is None:
        # Like with like: without measured temporaries, the sums leave them out on both sides.
        four = TENSOR_PARTS[:4]
        row("sum of the parts", measured.sum_of(four), predicted.sum_of(four),
            "weights + gradients + optimizer states + activations, all at once: never reached")
    else:
        row("sum of the parts", measured.sum_of(), predicted.sum_of(),
            "every part at once: never reached")
    row("peak (tensors)", measured.peak_allocated, prediction.peak,
        f"the allocator's peak; predicted in the {prediction.peak_at}" if on_gpu else
        "the CPU keeps no allocator statistics: not measured")
    if on_gpu:
        row("allocator cache", measured.allocator_cache, prediction.allocator_cache,
            "reserved − allocated at the allocator's peak (predicted: the caching allocator "
            "simulated)")
        row("outside PyTorch", measured.non_torch, prediction.outside,
            "NVML's peak − the context − reserved (predicted: the GPU's calibration)")
        row("peak (NVML, over the baseline)", measured.peak, prediction.nvml_peak,
            "context + tensors + allocator cache + outside PyTorch")
    else:
        row("peak (RSS, over the baseline)", measured.peak, None,
            "includes torch's libraries and the Python process: not predicted")
    return rows


def waterfall(report: RunReport, prediction: Prediction) -> dict[str, list[WaterfallStep]]:
    """The steps from the CUDA context to the peak, per side ("measured", "predicted"), in the
    order of `WATERFALL_ORDER`. Each side adds its parts,
    then takes away what is never held at once to reach the tensor peak; a GPU run's measured
    side goes on to NVML's peak."""
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
        # A CPU run's RSS peak adds torch's libraries and Python: hundreds of MB that would
        # dwarf the parts, so it stays in the table.
        if on_gpu and measured.peak_allocated is not None and measured.peak is not None:
            steps += [WaterfallStep(LABELS[Part.ALLOCATOR_CACHE], "relative",
                                    measured.allocator_cache or 0),
                      WaterfallStep(LABELS[Part.NON_TORCH], "relative", measured.non_torch or 0),
                      WaterfallStep("peak (NVML)", "total", 0)]
        sides["measured"] = steps
    # The predicted side climbs from the predicted context to the predicted NVML figure.
    context = prediction.context if on_gpu else None
    predicted = climb(prediction.as_components(), prediction.peak, context)
    if on_gpu and prediction.nvml_peak is not None:
        predicted += [WaterfallStep(LABELS[Part.ALLOCATOR_CACHE], "relative",
                                    prediction.allocator_cache),
                      WaterfallStep(LABELS[Part.NON_TORCH], "relative", prediction.outside or 0),
                      WaterfallStep("peak (NVML)", "total", 0)]
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


def peak_explanation(report: RunReport, prediction: Prediction) -> str:
    """Why the peak is less than the sum of the parts, in this run's numbers."""
    measured = measured_components(report)
    all_parts = prediction.as_components().sum_of()
    text = (f"Added up, the parts come to {mb_text(all_parts)} (predicted), but no "
            f"moment of a step holds them all. The activations ({mb_text(prediction.activations)}) "
            "are held from the forward pass into the backward pass and freed layer by layer as "
            f"the gradients ({mb_text(prediction.gradients)}) appear, so the peak holds only the "
            f"larger of the two: {mb_text(prediction.peak)}, in the {prediction.peak_at}.")
    if measured.peak_allocated is not None and measured.sum_of() is not None:
        text += (f" Measured: the parts add up to {mb_text(measured.sum_of())}; the allocator's "
                 f"peak was {mb_text(measured.peak_allocated)}.")
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

    rows.append(BytesPerParameterRow("weights + gradients + optimizer states",
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
                                        if precision == "fp32" else "."))
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
                    " stay fp32." if precision != "fp32" else "."))
    return text


# --- several processes (issue 12): each GPU measured next to its rank's prediction ---

class RankRow(NamedTuple):
    """One component of one rank: measured on its GPU, predicted for its rank (MB text)."""
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
            what = ("DDP's gradient buckets" if predicted.strategy == "ddp"
                    else "FSDP's all-gather and reduce-scatter buffers")
            add(what + " (in the peak)", None, predicted.communication)
        add("allocator's peak", parts.peak_allocated, guess.get("peak"))
        if not report.on_gpu:  # the sampler's RSS is the whole tree's: no figure per rank
            rows.append(RankRow(rank.label(), "peak RSS (every rank together)",
                                _mb_or_dash(rank.peak_bytes), "—"))
            continue
        nvml = None if predicted is None else predicted.nvml_peak
        rows.append(RankRow(rank.label(), "peak as NVML counts it", _mb_or_dash(rank.peak_bytes),
                            mb_text(nvml) if nvml is not None else
                            ("NCCL's memory not calibrated" if predicted is not None else "—")))
    return rows


def _mb_or_dash(value: int | None) -> str:
    return "—" if value is None else mb_text(value)
