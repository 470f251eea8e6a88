"""What a memory figure is, in words: which NVML figure, or CPU RSS; a run in a picker; what a
run's charts say where it recorded nothing. Every screen (the pages, the CLI, an exported chart)
says it the same way."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import PurePath

from anatomy.analysis import models
from anatomy.analysis.components import measured_batch, partial_micro_batch
from anatomy.analysis.data import DataChange
from anatomy.analysis.lengths import Lengths, TextBatch, longest_batches
from anatomy.analysis.models import display_name
from anatomy.analysis.options import FIELDS
from anatomy.analysis.report import (
    IMPORTED,
    PHASES,
    PhaseReading,
    RankReading,
    RunReport,
    known_options,
    when,
)
from anatomy.store import HOST_STRIDE, RunRow, Step, TrainingData, checks
from anatomy.units import in_mib, mib_text
from anatomy.vocabulary import Backend, MemoryApi, RecordedBy, SourceKind, Status, phase_name


def source(backend: Backend, memory_api: MemoryApi | None) -> str:
    if backend == Backend.CPU_RSS:
        return "CPU resident memory (RSS) of the training process tree: no GPU on this machine"
    if backend != Backend.NVML or memory_api not in (MemoryApi.V2, MemoryApi.V1, None):
        return f"{backend} ({memory_api}), which this anatomy does not know (a newer one's?)"
    if memory_api == MemoryApi.V2:
        return "NVML v2 'used' (driver-reserved memory excluded, as on the walkthrough's driver)"
    return "NVML v1 'used' (on R510+ drivers this includes driver-reserved memory)"


def occupied_line(memory_bytes: int | None, backend: Backend) -> str:
    """The walkthrough's line, `GPU memory occupied: N MiB.` (N = bytes // 2**20, as it computes:
    its "MB" is a MiB). A phase shorter than the sampling interval has no reading: it says so."""
    what = "GPU memory" if backend == Backend.NVML else "CPU memory (RSS)"
    if memory_bytes is None:
        return f"{what} occupied: not sampled (the phase ended between two readings)."
    return f"{what} occupied: {mib_text(memory_bytes)}."


def timing_lines(report: RunReport, status: Status | None = None) -> list[str]:
    """The walkthrough's `Time:` and `Samples/second:` of a run, as every front prints them (it
    prints no unit for the time); a stopped run's are its steps' until the stop, said so: its
    Trainer never reported its own. `status`: the run's as its front knows it, where the store
    could not take it yet."""
    summary = report.summary
    lines = []
    if summary.time_s is not None:
        stopped = (status or report.status) == Status.STOPPED and summary.steps is not None
        until = f" ({summary.steps} steps, until stopped)" if stopped else ""
        lines.append(f"Time: {summary.time_s:.2f} s{until}")
    if summary.samples_per_second is not None:
        every = " (all ranks together)" if report.world_size > 1 else ""
        lines.append(f"Samples/second: {summary.samples_per_second:.2f}{every}")
    return lines


def phase_line(report: RunReport, phase: PhaseReading, rank: RankReading | None = None) -> str:
    """A phase that has ended, as `anatomy run` and `watch` print it: the walkthrough's line and
    the phase's name (and the rank's, of several): "GPU memory occupied: 735 MiB.  (weights)"."""
    where = "" if rank is None else f", {rank.label()}"
    return (f"{occupied_line(phase.memory_bytes, report.backend)}  "
            f"({phase_name(phase.name, report.on_gpu)}{where})")


def phase_names(on_gpu: bool) -> str:
    """The walkthrough's four phases, as a device of this kind names them."""
    return ", ".join(phase_name(phase, on_gpu) for phase in PHASES)


# What Streamlit's Markdown would take for markup in a line of plain text: emphasis, code, links
# and its colour directives (":red[…]"), math, strikethrough. (An emoji's shortcode, ":rocket:",
# is still drawn as the emoji: Streamlit replaces it after the escapes are read.)
_MARKUP = re.compile(r"([\\`*_\[\]$~]|:(?=[A-Za-z]))")  # a colon before a word: a directive


def literal(words: str) -> str:
    """`words` as a page's Markdown shows them, character for character: a run's name, a model's
    path or a word from the URL is the user's text, not markup (a run named "**v2**" was a bold
    "v2" in its heading, /runs?run=[x](http://…) a link in the page's warning, and Streamlit
    read ":red[x]" as its colour directive even with its brackets escaped: the colon is too)."""
    return _MARKUP.sub(r"\\\1", words)


def run_choice(run: RunRow) -> str:
    """A run in a picker: its id, the device it ran on (first: H200 and CPU runs must not look
    alike), its name, model, batch size, precision (what the run reported of them), how it ended
    and when it started."""
    started = datetime.fromtimestamp(run.created_at).strftime("%Y-%m-%d %H:%M")
    return f"{run_chip(run)} — {run.status} ({started})"


def run_chip(run: RunRow) -> str:
    """A run in a few words, as a chip of a multiple choice shows it: `run_choice` without how it
    ended and when. An imported copy says so after its id."""
    known = known_options(run)
    model = known.model or run.environment.model_name
    batch, precision = known.batch_size, known.precision
    words = [str(run.id) + (f" ({IMPORTED})" if run.origin else ""), run.environment.device,
             *([run.name] if run.name else []), display_name(model) if model else run.preset]
    details = [f"batch {batch}"] * (batch is not None) + [str(precision)] * bool(precision)
    return " · ".join(map(_short, words)) + "".join(f", {d}" for d in details)


def _short(words: str, most: int = 36) -> str:
    """A name or a command in a chip's room: its start, and an ellipsis where it goes on."""
    return words if len(words) <= most else words[:most - 1].rstrip() + "…"


def axis_title(backend: Backend) -> str:
    return in_mib("GPU memory used" if backend == Backend.NVML else "CPU memory, RSS")


def run_id(word: str) -> int | None:
    """A run's id as a URL writes it (?run=7, ?runs=1,2): ASCII digits within SQLite's
    integers (a run's id is one: beyond them, no run); None for anything else ("abc", "-1",
    "²", or 10²⁶, which SQLite cannot compare)."""
    return checks.digits(word.strip())


def missing_run(wanted: str, shown: int | None, filtered: bool = False, gone: bool = False
                ) -> str:
    """What a page says when the URL asks for a run it cannot show (`shown` is the one it shows
    instead, if any); `filtered`: the run exists but the page's filters leave it out; `gone`:
    the run the page showed has been deleted since (another tab, the CLI)."""
    if filtered:
        return f"Run {wanted} is not among the runs these filters keep: showing run {shown}."
    if gone:
        return (f"Run {wanted} is no longer stored (deleted in another tab or by the CLI)" +
                ("." if shown is None else f": showing run {shown}."))
    what = (f"Run {wanted} not found" if run_id(wanted) is not None else
            f"{literal(repr(wanted))} is not a run id")
    return what + ("." if shown is None else f": showing run {shown}.")


def no_steps(report: RunReport) -> str:
    """Why a run's step chart is empty, in the words of how it was recorded."""
    if report.status == Status.RUNNING:
        return "No training step recorded yet."
    return {
        RecordedBy.WORKER: "This run ended before its first training step.",
        RecordedBy.CALLBACK: "The Trainer reported no step: the run ended before its first "
                           "optimizer step.",
        RecordedBy.PHASE_API: "The script reported no step (the phase API's run.step(loss=…) "
                            "reports one).",
        RecordedBy.COMMAND: "A command watched without anatomy's callback or phase API reports no "
                          "steps: its memory alone.",
    }[report.recorded_by]


def no_samples(report: RunReport) -> str:
    """Why a run's memory chart has no curve: not one sample stored."""
    if report.status == Status.RUNNING:
        return "No memory sample yet: the curve starts with the sampler's first reading."
    return ("No memory sample was stored for this run: it ended before its sampler's first "
            "reading, so there is no curve to draw.")


def steps_caption(report: RunReport, steps: Sequence[Step]) -> str:
    """What the loss and step-time chart shows, for the way the run was recorded."""
    if report.recorded_by == RecordedBy.PHASE_API:
        return ("The loss each run.step(loss=…) reported, and the time each step took from the "
                "end of the one before.")
    return (f"The Trainer's loss {_logged(steps)} and the time each step took, from the end of "
            "the one before; step 1 also holds the Trainer's first-step setup.")


def _logged(steps: Sequence[Step]) -> str:
    """How often the Trainer logged the loss, from the steps that carry one (its logging_steps;
    a first step logged apart, logging_first_step, aside)."""
    logged = [s.step for s in steps if s.loss is not None]
    if not logged:
        return "(none logged: its logging_steps is more than the steps it ran)"
    gaps = {b - a for a, b in zip(logged[1:], logged[2:])} or {logged[-1] - logged[0]}
    if len(logged) == len(steps):
        return "at each step (logged every step)"
    if len(gaps) == 1 and (every := gaps.pop()) > 0:
        return f"every {every} steps, as it logged it ({len(logged)} of {len(steps)} steps)"
    return f"at the {len(logged)} of {len(steps)} steps it logged"


def unquantized(config: Mapping | None = None, model: str | None = None) -> str | None:
    """What a prediction leaves out of a model's config (`config`, else the one `model` names),
    its quantization, as a sentence without its full stop (None for none): the weights are
    predicted, and trained, unquantized."""
    quantized = (models.quantization_left_out(config) if config is not None else
                 models.named_quantization(model))
    return f"The config's {quantized.removeprefix('its ')}" if quantized else None


def model_origin(report: RunReport) -> str | None:
    """Where a run's model came from, where the run keeps its config ("config file
    /home/u/mine.json", "Hub cache Qwen/Qwen2-0.5B", "folder /home/u/my-model"); None where the
    run names its model alone (a preset, a run stored before runs kept their config)."""
    facts = report.environment
    if facts.model_config is None:
        return None
    source = facts.model_source or "folder"  # a Trainer's model (the callback): from a folder
    if facts.model_path:
        return f"{source} {facts.model_path}"
    if facts.model_source:  # a cached Hub id
        return f"{source} {report.options.model}"
    return None


def partial_micro_batch_words(report: RunReport) -> str | None:
    """That a run never had a full micro-batch, where so: its activations are a smaller one's
    than the prediction's."""
    batch = report.ran_with.batch_size
    samples = partial_micro_batch(report.components, batch)
    if samples is None:
        return None
    # A run on a dataset that said which batch it measured is predicted at that batch.
    predicted = samples if measured_text_batch(report) else batch
    return (f"This run never had a full micro-batch of {batch} samples (its data held fewer): "
            f"its activations were measured on a micro-batch of {samples}, and the prediction is "
            f"for {predicted}.")


def measured_text_batch(report: RunReport) -> TextBatch | None:
    """The micro-batch of a run on a dataset that its components were measured on; None for
    other runs and for one stored before the probe said which."""
    if not report.options.on_dataset:
        return None
    return measured_batch(report.components, report.environment.data)


def batch_words(batch: TextBatch) -> str:
    """A micro-batch of texts in words: "4 × 17 tokens, its texts 5 to 17 tokens long"."""
    shortest = min(batch.lengths, default=batch.padded_to)
    if shortest == batch.padded_to:
        return f"{batch.words()}, without padding"
    return f"{batch.words()}, its texts {shortest:,} to {max(batch.lengths):,} tokens long"


def measured_batch_words(report: RunReport) -> str | None:
    """`show`'s line under a dataset's run's components: the micro-batch they were measured on
    (the first steps' batches differ), and the longest its data can form."""
    batch, data = measured_text_batch(report), report.environment.data
    if batch is None:
        return None
    longest = longest_batches(Lengths(data.lengths or ()), report.options.batch_size,
                              data.padding or report.options.padding, data.max_length or 0)[0]
    return (f"measured on a micro-batch of {batch_words(batch)}; the data's longest batch: "
            f"{longest.words()} (`anatomy predict` with the run's options predicts its peak)")


DATA_WIDTH = 24  # a run's data named in a table: a path's folders would widen every line


def data_name(dataset: str) -> str:
    """A run's data in a table (`anatomy runs`, the Runs page): its file or folder name (a Hub
    id's last part), cut in its middle where long, so that its suffix still says what it is."""
    name = PurePath(dataset).name
    if len(name) <= DATA_WIDTH:
        return name
    tail = (DATA_WIDTH - 1) // 2 + 1
    return f"{name[:DATA_WIDTH - 1 - tail]}…{name[-tail:]}"


def data_line(data: TrainingData) -> str:
    """What a run on a dataset trained on, in a line: the data, its split and column, the
    tokenizer, the padding and where texts were cut, and its texts' lengths."""
    cut = f", cut at {data.max_length:,} tokens" if data.max_length else ""
    return (f"data: {data.dataset} ({data.split}, column {data.text_column}), tokenizer "
            f"{data.tokenizer}, padding {data.padding}{cut}: "
            f"{Lengths(data.lengths or ()).words()}")


def data_change_line(change: DataChange) -> str:
    """`show`'s line under a run's data where the path now holds other data, or none: the run's
    lengths are still its own."""
    kept = "the lengths above are the run's own, kept in the store"
    if change.now is None:
        return f"data gone: no data is at {change.path} now: {kept}"
    if change.now.size == change.then.size:
        # Files touched, or copied without their times, say nothing of their bytes: not "is
        # not what it trained on" where the content may be the very same.
        moved = "its files' names differ" if change.now.modified == change.then.modified else \
            f"modified {when(change.then.modified)} then, {when(change.now.modified)} now"
        return (f"data modified: {change.path} may not be what this run trained on (the same "
                f"{change.now.size:,} bytes; {moved}): {kept}")
    then, now = (f"{stamp.size:,} bytes, modified {when(stamp.modified)}"
                 for stamp in (change.then, change.now))
    return f"data changed: {change.path} is not what this run trained on (then {then}; now {now}): {kept}"


def unrecorded_ranks(rep: RunReport) -> str | None:
    """Where a run of several processes holds readings of fewer ranks than it had, which of
    them recorded nothing and why that may be; None where every rank recorded. A launch's
    script records with its rank 0 alone unless `anatomy watch` follows the launch: `show`
    said "2 processes; each rank's memory …" over one rank's row."""
    if not rep.ranks:
        return None
    missing = sorted(set(range(rep.world_size)) - {r.rank for r in rep.ranks})
    if not missing:
        return None
    which = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
    if rep.source.kind == SourceKind.SCRIPT:
        return (f"{which} recorded nothing: a launch's ranks record with rank 0 alone unless "
                "`anatomy watch -- torchrun …` follows the launch")
    return f"{which} recorded nothing (ended, or silent, before its first phase)"


def panel_host(hosts: Sequence[str], host: int) -> str:
    """A host of the device panel: "Host" on a run of one host, else its name on the run's
    (`hosts`: the run's hosts, by their place)."""
    if len(hosts) <= 1:
        return "Host"
    return hosts[host] if host < len(hosts) else f"host {host}"


def panel_gpu(hosts: Sequence[str], key: int) -> str:
    """A GPU of the device panel by the key it is stored under (store.device_key): "GPU i", its
    host's name before it on a run across hosts."""
    name = f"GPU {key % HOST_STRIDE}"
    return name if len(hosts) <= 1 else f"{panel_host(hosts, key // HOST_STRIDE)}: {name}"


# A CLI flag in an option's error ("give --dataset too", "--gpus 0,1", "--lora-rank R"), with
# the value or placeholder after it, and the "give" before it.
_FLAG = re.compile(r"(?P<give>\bgive )?--(?P<flag>[a-z][a-z0-9-]*)(?: (?P<value>[A-Z]+\b|\d[\d,]*))?")


def form_error(name: str, message: str, under_field: bool) -> str:
    """An option's error as a form says it: the messages are the CLI's and the API's ("grad_accum:
    0 is out of range: 1 to 64", "give --dataset too"), and the form has labels, not flags or
    field names. Under the field the error marks, its name goes; elsewhere its label leads; a
    flag of an option becomes that option's label (a flag no option has stays as it is)."""
    field = FIELDS.get(name)
    if field is not None and message.startswith(f"{name}: "):
        rest = message[len(name) + 2:]
        message = rest if under_field else f"{field.label}: {rest}"

    def label(match: re.Match) -> str:
        option = FIELDS.get(match["flag"].replace("-", "_"))
        if option is None:
            return match[0]
        shown, value = f"“{option.label}”", match["value"]
        if value is None or value.isalpha():  # none, or a placeholder (R, N, DIR)
            return f"fill in {shown}" if match["give"] else shown
        return f"set {shown} to {value}" if match["give"] else f"{shown}: {value}"

    return _FLAG.sub(label, message)
