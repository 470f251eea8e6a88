"""The Compare page's labels, tables and words, computed without Streamlit: each run labelled by
exactly what differs, the side-by-side table with the differing options marked "≠", the
differences to a reference run as text, a sweep's answer to "what fits?", and the runs a URL asks
for.

The numbers come from anatomy/analysis/compare.py (alignment, the options that differ, scaling
efficiency, differences); this module words and arranges them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from anatomy.analysis.compare import (
    Difference,
    difference,
    differing_options,
    memory_parts,
    option,
    phase_start,
    reported,
    scaling_efficiencies,
)
from anatomy.analysis.options import FIELDS
from anatomy.analysis.report import PHASES, RunReport
from anatomy.analysis.sweeps import LADDER, SweepGrid
from anatomy.units import MIB_NAME, in_mib, mib
from anatomy.views import gpus
from anatomy.views.style import COMPONENT_LABELS
from anatomy.views.text import data_name, literal, run_id
from anatomy.vocabulary import CPU_PHASE_NAMES, Part, Phase, RecordedBy, Status, Unsplit, phases_name

DIFFERS = "≠"  # the mark of a row whose values differ between the runs

# The parts of a run's bar (analysis/compare.py's PART_ORDER) in words: the components' names,
# but what the training increase holds beyond them is "the rest" (outside PyTorch's allocator,
# or on a CPU the process's own) and its temporary buffers are "temporary".
BAR_LABELS = {**COMPONENT_LABELS, Phase.KERNEL: CPU_PHASE_NAMES[Phase.KERNEL],
              Part.TEMPORARY: "temporary", Part.NON_TORCH: "the rest",
              Unsplit.BEFORE_RECORDING: "before the recording", Phase.BASELINE: "before the run"}


def bar_label(part: Part | Phase | Unsplit) -> str:
    return BAR_LABELS.get(part, str(part))

# How an option reads in a run's label, where it differs between the runs compared.
LABEL_WORDS = {
    "model": "{}", "batch_size": "bs {}", "seq_len": "seq {}", "dataset_size": "{} samples",
    "max_steps": "{} steps", "precision": "{}", "gradient_checkpointing": "ckpt {}",
    "grad_accum": "accum {}", "optim": "{}", "seed": "seed {}", "sample_rate": "{} Hz",
    "gpu": "GPU {}", "profile_steps": "profile {}", "gpus": "GPUs {}", "strategy": "{}",
    "lora_rank": "LoRA r{}", "lora_targets": "LoRA {}", "lora_dropout": "LoRA dropout {}",
    "weights": "{} weights", "label_smoothing": "label smoothing {}",
    "attention": "{} attention",
    "frozen": "{} frozen",
    "target_len": "target {}",
}


def shown(report: RunReport, name: str):
    """A run's option as Compare writes it: `option`, the model by its short name (a config
    file's, not its path)."""
    return report.model if name == "model" else option(report, name)


def _label_word(report: RunReport, name: str, value) -> str:
    """How an option that differs reads in a run's label; "" where the run has nothing to say
    (a user's training that did not report it, a single process's strategy)."""
    if name == "max_steps" and value is None and reported(report, name):
        return "by epochs"
    if name == "gpus" and not value and report.started_by_anatomy and report.on_gpu:
        return "1 GPU"
    if value is None or value == "":
        return ""
    if name == "lora_rank" and value == 0:  # a rank of 0 is no LoRA: every weight trains
        return "no LoRA"
    if name == "epochs":
        return f"{value} epoch{'s' if value != 1 else ''}"
    if name == "processes":
        return f"{value} process{'es' if value != 1 else ''}"
    if isinstance(value, bool):
        value = "on" if value else "off"
    return LABEL_WORDS.get(name, FIELDS[name].label.lower() + " {}").format(value)


def run_labels(reports: Sequence[RunReport]) -> dict[int, str]:
    """Each run's label in a comparison: its id, then exactly what differs between the runs (the
    differing options, and the device where the runs ran on different ones); "Run 3 · seq 256 ·
    adafactor". A run alone gets its usual label. Escaped for Plotly, which draws <b>, <a href>
    and their like in a legend or a tick: a user's name is text, not markup."""
    if len(reports) < 2:
        return {r.id: html.escape(r.label(), quote=False) for r in reports}
    differing = differing_options(reports)
    devices = len({r.device_name for r in reports}) > 1
    labels = {}
    for r in reports:
        words = [r.run_words()] + ([r.name] if r.name else [])  # the user's name for it
        if devices:
            words.append(r.device_name)
        words += [w for w in (_label_word(r, name, shown(r, name)) for name in differing) if w]
        labels[r.id] = html.escape(" · ".join(words), quote=False)
    return labels


def steps_caption(reports: Sequence[RunReport]) -> str:
    """What the loss and step-time overlay shows, in the terms of the runs compared."""
    loops = [r for r in reports if r.recorded_by == RecordedBy.PHASE_API]
    loss = ("each run's loss as the Trainer logged it" if not loops else
            "each run's loss as run.step(loss=…) reported it" if len(loops) == len(reports) else
            "each run's loss as the Trainer logged it or run.step(loss=…) reported it")
    setup = " (step 1 holds the Trainer's setup)" if len(loops) < len(reports) else ""
    return (f"Against the training step: {loss}, and the time each step took from the end of "
            f"the one before{setup}.")


def not_drawn(reports: Sequence[RunReport], phase: Phase) -> str | None:
    """Which runs the overlay aligned at `phase` leaves out, and why: anatomy's own run never
    reached it (or has not yet), a user's training did not mark it (a Trainer's callback begins
    at the weights, a watched command marks none)."""
    missing = [r for r in reports if phase_start(r, phase) is None]
    if not missing:
        return None

    def runs(group: list[RunReport]) -> str:
        return ", ".join(f"run {r.id}" for r in group)

    named = phases_name(phase, (r.on_gpu for r in missing))
    groups = (
        ([r for r in missing if r.started_by_anatomy and r.status != Status.RUNNING],
         f"never reached the {named} phase"),
        ([r for r in missing if r.started_by_anatomy and r.status == Status.RUNNING],
         f"has not reached the {named} phase yet"),
        ([r for r in missing if not r.started_by_anatomy],
         f"did not mark a {named} phase (a user's training marks the phases it chooses)"))
    return "Not drawn: " + "; ".join(f"{runs(group)} {why}" for group, why in groups
                                     if group) + "."


RECORDERS = {RecordedBy.WORKER: "anatomy's own run", RecordedBy.CALLBACK: "a Trainer's callback",
             RecordedBy.PHASE_API: "the phase API", RecordedBy.COMMAND: "a watched command"}


def bars_notes(reports: Sequence[RunReport]) -> list[str]:
    """What a run's bar cannot show, for a run that did not mark the walkthrough's phases."""
    notes = []
    for r in reports:
        parts = {p.part for p in memory_parts(r)}
        if not parts:
            notes.append(f"Run {r.id} ({RECORDERS[r.recorded_by]}) marked no phase to split: no "
                         "bar, its peak alone.")
        elif Unsplit.BEFORE_RECORDING in parts:
            notes.append(f"Run {r.id} ({RECORDERS[r.recorded_by]}) was recorded from its weights "
                         "phase on: what it held then is one part, 'before the recording' (the "
                         "process, its libraries and the model, not split).")
    return notes


def _text(value) -> str:
    if value is None or value == "":  # an empty option (no LoRA targets, the default split)
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def column(report: RunReport) -> str:
    return f"Run {report.id}"


# The results rows of the side-by-side table and of the differences: (heading, unit, value).
def _results(report: RunReport, reports: Sequence[RunReport]
             ) -> list[tuple[str, str, float | None]]:
    """`report`'s rows, headed for `reports` side by side (a phase by its names on their devices)."""
    memory = report.phase_memory()
    summary = report.summary
    return [("Time (s)", "s", summary.time_s),
            ("Samples/second", "", summary.samples_per_second),
            *((in_mib(phases_name(name, (r.on_gpu for r in reports))), MIB_NAME, mib(memory[name]))
              for name in PHASES),
            (in_mib("peak"), MIB_NAME, summary.peak_mb)]


def side_by_side(reports: Sequence[RunReport]) -> list[dict]:
    """The table with one column per run: the device, the status, every option (those that differ
    marked DIFFERS in the "" column), then Time, Samples/second, the memory at the end of each
    phase and the peak. Values are text, formatted as the rest of the dashboard writes them."""
    differing = set(differing_options(reports))
    rows = []

    def row(what: str, values: list, differs: bool = False) -> None:
        rows.append({"": DIFFERS if differs else "", "what": what,
                     **{column(r): _text(v) for r, v in zip(reports, values)}})

    devices = [r.device_name for r in reports]
    row("device", devices, len(set(devices)) > 1)
    row("status", [r.status for r in reports])
    for name, field in FIELDS.items():
        values = [shown(r, name) for r in reports]
        if name == "dataset":  # by its name, as the Runs table: whole below (`datasets_line`)
            values = [data_name(v) if v else v for v in values]
        row(field.label, values, name in differing)
    for index, (heading, _, _) in enumerate(_results(reports[0], reports)):
        row(heading, [_results(r, reports)[index][2] for r in reports])
    if any(r.world_size > 1 for r in reports):  # 1 vs N processes (the count, each GPU's peak)
        row("processes", [r.world_size for r in reports])
        row(in_mib("peak per GPU") if any(r.on_gpu for r in reports) else
            in_mib("peak per process"), [per_gpu_peaks_text(r) for r in reports])
        # What the efficiency is computed from (the Trainer's Samples/second above includes the
        # first step's one-time costs).
        row("samples/s after the first steps",
            [None if r.summary.steady_samples_per_second is None
             else round(r.summary.steady_samples_per_second, 2) for r in reports])
        efficiency = scaling_efficiencies(reports)
        row("scaling efficiency", [None if efficiency.get(r.id) is None
                                   else f"{efficiency[r.id]:.0%}" for r in reports])
    return rows


def datasets_line(reports: Sequence[RunReport]) -> str | None:
    """The runs' datasets in full, which the table names by their file or folder name (a path
    cut at the column's width said only its folders); None where no run trained on a dataset."""
    paths = {r.id: shown(r, "dataset") for r in reports}
    if not any(paths.values()):
        return None
    if len(set(paths.values())) == 1:
        return f"Dataset: {next(iter(paths.values()))} (every run)."
    return "Datasets: " + "; ".join(f"run {run}: {path or 'the dummy data'}"
                                    for run, path in paths.items()) + "."


def per_gpu_peaks_text(report: RunReport) -> str:
    """Each GPU's peak: "GPU 0: 12,345 · GPU 1: 12,400" (MiB), their spread beyond eight GPUs;
    each CPU process's ("rank 0: 640 · rank 1: 612", its own processes' RSS), or where a store
    of before read them together, their one figure, said so."""
    if report.on_gpu or not report.ranks:
        return gpus.peaks_text(report) or _text(report.summary.peak_mb)
    if all(rank.measured_alone for rank in report.ranks):
        return " · ".join(f"{rank.label()}: {_text(rank.peak_mb)}" for rank in report.ranks)
    return f"{_text(report.summary.peak_mb)} (every process together)"


def _difference_text(diff: Difference, unit: str) -> str:
    if diff.absolute is None:
        return "—"
    text = (f"{diff.absolute:+,d}" if isinstance(diff.absolute, int)
            else f"{diff.absolute:+,.2f}")
    text += f" {unit}" if unit else ""
    if diff.percent is not None:
        text += f" ({diff.percent:+.1f}%)"
    return text


def differences(reports: Sequence[RunReport], reference_id: int) -> list[dict]:
    """One row per result (Time, Samples/second, each phase's memory, the peak), one column per
    run: its difference to the reference run, absolute and in %, as text ("+1,024 MiB (+33.3%)")."""
    reference = next(r for r in reports if r.id == reference_id)
    base = _results(reference, reports)
    rows = []
    for index, (heading, unit, ref_value) in enumerate(base):
        row = {"what": heading}
        for r in reports:
            row[column(r)] = ("reference" if r.id == reference_id else
                              _difference_text(difference(_results(r, reports)[index][2], ref_value),
                                               unit))
        rows.append(row)
    return rows


def parse_ids(text: str | None) -> list[int]:
    """`?runs=1,2,3` as ids, in order, each once; anything else in it is ignored."""
    ids = []
    for word in (text or "").split(","):
        run = run_id(word)
        if run is not None and run not in ids:
            ids.append(run)
    return ids


def missing_runs(words: list[str]) -> str:
    """What the Compare page says of ids in its URL that are not stored runs."""
    return (f"Run{'s' if len(words) > 1 else ''} {literal(', '.join(words))} not found: left "
            "out of the comparison.")


def _fitting(grid: SweepGrid, size: int | None, value=None) -> str:
    """The ladder's answer: what fitted, and whether anything did not."""
    if grid.ran_out(value):
        return "**none** (no run completed)" if size is None else f"**{size}**"
    tried = grid.largest_tried(value)
    if size is None:
        if tried is not None:
            return "**none** (no run completed)"
        return "no run yet" if grid.status == Status.RUNNING else "no run (the sweep ended first)"
    return f"all fitted; the largest tried was **{tried}**"


def largest_fitting(grid: SweepGrid) -> str | None:
    """The sweep's answer to "what is the largest batch size that fits?", or None when batch size
    is not varied. Without an out-of-memory run, the largest that fit is only the largest tried."""
    if LADDER not in grid.vary:
        return None
    largest = grid.largest_fitting
    if not isinstance(largest, dict):
        return "Largest batch size that fit: " + _fitting(grid, largest)
    other = FIELDS[next(n for n in grid.vary if n != LADDER)].label.lower()
    return "Largest batch size that fit: " + "; ".join(
        f"{other} {value}: {_fitting(grid, size, value)}" for value, size in largest.items())
