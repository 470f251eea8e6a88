"""A run's memory taken apart, computed without Streamlit: measured next to predicted for each
component, the waterfall from the CUDA context to the peak, the moments of a step, the bytes per
parameter next to the walkthrough's, and what the operation classes mean on this device.

The measured side is `report()["components"]` (anatomy/components.py); the predicted side is
`predict()` (anatomy/prediction.py) for the run's own options, on the run's kind of device.
"""

from __future__ import annotations

from anatomy.operations import CONTRACTION, ELEMENTWISE, NORMALIZATION, OTHER, PAPER_SHARES
from anatomy.options import RunOptions
from anatomy.prediction import Prediction, predict, walkthrough_bytes_per_parameter
from anatomy.store import MIB

TENSOR_PARTS = ("weights", "gradients", "optimizer_states", "activations", "temporary")
LABELS = {
    "context": "CUDA context",
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "temporary": "temporary buffers",
    "allocator_cache": "allocator cache",
    "non_torch": "outside PyTorch",
}
# The totals say what they add up: with the measured CUDA context below the parts, or without.
ALL_AT_ONCE = {False: "all at once", True: "context + all parts"}
TENSOR_PEAK = {False: "peak (tensors)", True: "context + tensor peak"}
WATERFALL_ORDER = (LABELS["context"], *(LABELS[n] for n in TENSOR_PARTS), *ALL_AT_ONCE.values(),
                   "never held at once", *TENSOR_PEAK.values(), LABELS["allocator_cache"],
                   LABELS["non_torch"], "peak (NVML)")
# The predicted moments of a step, in step order, and the measured moment read at the same place.
MOMENTS = (
    ("end of the forward pass", "forward pass", "end of forward"),
    ("start of the backward pass", "start of the backward pass", None),
    ("end of the backward pass", "end of the backward pass", "end of backward"),
    ("optimizer step", "optimizer step", "after optimizer step"),
)


def prediction_for(report: dict) -> Prediction:
    """The prediction for the run's own options, with the kernels of the device it ran on."""
    device = "cuda" if report["backend"] == "nvml" else "cpu"
    return predict(RunOptions.from_dict(report["options"]), device=device)


def parameters(report: dict, prediction: Prediction) -> int:
    """The model's parameters as the worker counted them; the preset's count for older runs."""
    return report["environment"].get("parameters") or prediction.parameters


def measured_components(report: dict) -> dict:
    """The run's measured components; for a GPU run recorded without them, what its phases alone
    tell: the CUDA context (kernel − baseline) and NVML's peak over the baseline."""
    values = dict(report["components"] or {})
    if report["backend"] == "nvml" and not values:
        memory = {p["name"]: p["memory_bytes"] for p in report["phases"] if p["end_s"] is not None}
        if memory.get("kernel") is not None and memory.get("baseline") is not None:
            values["context"] = memory["kernel"] - memory["baseline"]
        if report["summary"]["peak_bytes"] is not None and memory.get("baseline") is not None:
            values["peak"] = report["summary"]["peak_bytes"] - memory["baseline"]
    return values


def predicted_components(prediction: Prediction) -> dict[str, int]:
    """The prediction's components; its `temporary` is computed as the measured side's is."""
    return prediction.components()


def sum_of_parts(values: dict) -> int | None:
    """The walkthrough's arithmetic: every tensor component at once (None if one is missing)."""
    return _sum_of_parts(values)


def _error(measured: int | None, predicted: int | None) -> float | None:
    if measured is None or predicted is None or measured == 0:
        return None
    return (predicted - measured) / measured * 100


def _sum_of_parts(values: dict, parts: tuple[str, ...] = TENSOR_PARTS) -> int | None:
    found = [values.get(name) for name in parts]
    return None if any(v is None for v in found) else sum(found)


def component_rows(report: dict, prediction: Prediction) -> list[dict]:
    """One row per component: `component`, `measured` and `predicted` bytes (None: not measured or
    not predicted), `error_percent` ((predicted − measured) / measured) and a `note`."""
    measured = measured_components(report)
    on_gpu = report["backend"] == "nvml"
    predicted = predicted_components(prediction)
    rows = []

    def row(name: str, m: int | None, p: int | None, note: str = "") -> None:
        rows.append({"component": name, "measured": m, "predicted": p,
                     "error_percent": _error(m, p), "note": note})

    if on_gpu:
        row("CUDA context", measured.get("context"), None,
            "not predicted: the kernel phase − the baseline")
    for name in TENSOR_PARTS:
        note = ""
        if name == "activations" and not on_gpu:
            note = "measured: the storages autograd saved in a forward pass"
        elif name == "temporary":
            note = ("the peak beyond weights, optimizer states and the larger of activations "
                    "and gradients" if on_gpu else "not measured on a CPU")
        row(LABELS[name], measured.get(name), predicted[name], note)
    if measured and measured.get("temporary") is None:
        # Like with like: without measured temporaries, the sums leave them out on both sides.
        four = TENSOR_PARTS[:4]
        row("sum of the parts", _sum_of_parts(measured, four), _sum_of_parts(predicted, four),
            "weights + gradients + optimizer states + activations, all at once: never reached")
    else:
        row("sum of the parts", _sum_of_parts(measured), _sum_of_parts(predicted),
            "every part at once: never reached")
    row("peak (tensors)", measured.get("peak_allocated"), prediction.peak,
        f"the allocator's peak; predicted at the {prediction.peak_at}" if on_gpu else
        "the CPU keeps no allocator statistics: not measured")
    if on_gpu:
        row("allocator cache", measured.get("allocator_cache"), None,
            "not predicted: reserved − allocated at the allocator's peak")
        row("outside PyTorch", measured.get("non_torch"), None,
            "not predicted: NVML's peak − the context − reserved")
        row("peak (NVML, over the baseline)", measured.get("peak"), None,
            "context + tensors + allocator cache + outside PyTorch")
    else:
        row("peak (RSS, over the baseline)", measured.get("peak"), None,
            "includes torch's libraries and the Python process: not predicted")
    return rows


def waterfall(report: dict, prediction: Prediction) -> dict[str, list[tuple[str, str, int]]]:
    """The steps from the CUDA context to the peak, per side ("measured", "predicted"): (label,
    "relative" or "total", bytes), in the order of `WATERFALL_ORDER`. Each side adds its parts,
    then takes away what is never held at once to reach the tensor peak; a GPU run's measured
    side goes on to NVML's peak."""
    measured = measured_components(report)
    on_gpu = report["backend"] == "nvml"
    sides: dict[str, list[tuple[str, str, int]]] = {}
    context = measured.get("context") if on_gpu else None

    def climb(values: dict, peak: int | None) -> list[tuple[str, str, int]]:
        steps = [] if context is None else [(LABELS["context"], "relative", context)]
        steps += [(LABELS[n], "relative", values[n]) for n in TENSOR_PARTS
                  if values.get(n) is not None]
        steps.append((ALL_AT_ONCE[context is not None], "total", 0))
        if peak is not None:
            steps.append(("never held at once", "relative", peak - sum(
                values.get(n) or 0 for n in TENSOR_PARTS)))
            steps.append((TENSOR_PEAK[context is not None], "total", 0))
        return steps

    if _sum_of_parts(measured, TENSOR_PARTS[:4]) is not None:
        steps = climb(measured, measured.get("peak_allocated"))
        # A CPU run's RSS peak adds torch's libraries and Python: hundreds of MB that would
        # dwarf the parts, so it stays in the table.
        if on_gpu and "peak_allocated" in measured and measured.get("peak") is not None:
            steps += [(LABELS["allocator_cache"], "relative", measured.get("allocator_cache", 0)),
                      (LABELS["non_torch"], "relative", measured.get("non_torch", 0)),
                      ("peak (NVML)", "total", 0)]
        sides["measured"] = steps
    sides["predicted"] = climb(predicted_components(prediction), prediction.peak)
    return sides


def moment_rows(report: dict, prediction: Prediction) -> list[dict]:
    """Memory at each moment of a step (after the first), predicted and, on a GPU, measured."""
    measured = (report["components"] or {}).get("moments") or {}
    return [{"moment": label, "predicted": prediction.moments.get(predicted),
             "measured": measured.get(measured_key) if measured_key else None}
            for label, predicted, measured_key in MOMENTS]


def _mb(value: float) -> str:
    return f"{value / MIB:,.0f} MB"


def peak_explanation(report: dict, prediction: Prediction) -> str:
    """Why the peak is less than the sum of the parts, in this run's numbers."""
    measured = measured_components(report)
    predicted = predicted_components(prediction)
    text = (f"Added up, the parts come to {_mb(_sum_of_parts(predicted))} (predicted), but no "
            f"moment of a step holds them all. The activations ({_mb(prediction.activations)}) "
            "are held from the forward pass into the backward pass and freed layer by layer as "
            f"the gradients ({_mb(prediction.gradients)}) appear, so the peak holds only the "
            f"larger of the two: {_mb(prediction.peak)}, at the {prediction.peak_at}.")
    if measured.get("peak_allocated") is not None and _sum_of_parts(measured) is not None:
        text += (f" Measured: the parts add up to {_mb(_sum_of_parts(measured))}; the allocator's "
                 f"peak was {_mb(measured['peak_allocated'])}.")
    return text


def bytes_per_parameter_rows(report: dict, prediction: Prediction) -> list[dict]:
    """Weights, gradients, optimizer states (and their sum) per parameter: measured, predicted,
    and the walkthrough's figure for this run's precision and optimizer."""
    measured = report["components"] or {}
    count = parameters(report, prediction)
    walkthrough = walkthrough_bytes_per_parameter(RunOptions.from_dict(report["options"]))
    rows = []
    for name in ("weights", "gradients", "optimizer_states"):
        value = measured.get(name)
        rows.append({"component": LABELS[name],
                     "measured": None if value is None else value / count,
                     "predicted": getattr(prediction, name) / prediction.parameters,
                     "walkthrough": walkthrough[name]})
    total = {key: (None if any(r[key] is None for r in rows) else sum(r[key] for r in rows))
             for key in ("measured", "predicted", "walkthrough")}
    rows.append({"component": "weights + gradients + optimizer states", **total})
    return rows


def operations_explanation(profile, precision: str) -> str:
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
