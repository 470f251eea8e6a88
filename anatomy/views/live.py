"""The Live page's logic, computed without Streamlit: the form's values as RunOptions, what a run
should need and take before it starts (the forecast), the phase metrics, the progress, the run's
state in words, the summary as the walkthrough prints it, and the device panel (also drawn for a
stored run on the Runs page).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from anatomy.analysis import data, duration, models
from anatomy.analysis.machine import Machine
from anatomy.analysis.options import Checked, RunOptions
from anatomy.analysis.report import PHASES, PhaseReading, RunReport
from anatomy.prediction import (
    Answer,
    PredictionError,
    Request,
    Target,
    answer,
    breakdown,
    target,
)
from anatomy.prediction.batches import DataBatches
from anatomy.store import HOST_STRIDE, GpuStatus, HostStatus, Step, Store
from anatomy.units import GIB, gib_text, mib_text, size_text
from anatomy.views import gpus, text
from anatomy.vocabulary import Name, Phase, Status, phase_name


def refusal(errors: dict[str, str], drawn: Callable[[str], bool], started: bool) -> list[str]:
    """What the form says below itself of wrong options: in full, each error of a field it does
    not draw for these options (checkpointing, once the model sent is one that cannot recompute
    its activations), which no mark under a field shows; then, where fields are marked, to fix
    them. `started`: the answer to Start (nothing started), else to Predict or What fits?."""
    prefix = "Not started: " if started else ""
    lines = [prefix + text.form_error(name, message, under_field=False)
             for name, message in errors.items() if not drawn(name)]
    if len(lines) < len(errors):
        lines.append("Not started: fix the fields marked above." if started else
                     "Fix the fields marked above.")
    return lines


class PhaseState(Name):
    """How far a phase has come."""

    DONE = "done"
    OPEN = "open"  # it lasts
    PENDING = "pending"  # not reached


# Under a field the form greys out while a dataset is set: why (analysis/options.DATA_DECIDES).
DATASET_DECIDES = {"seq_len": "Ignored with a dataset: its texts and the padding make each "
                              "batch's length.",
                   "dataset_size": "Ignored with a dataset: its texts are the data."}


class PhaseMetric(NamedTuple):
    name: str  # as the screens name it (style.phase_name)
    state: PhaseState
    memory_mb: int | None  # at its end, or the latest reading while it lasts
    delta_mb: int | None  # over the previous phase


def _asked(model: str | None, question: Callable[[models.ModelSpec], bool],
           presets: bool) -> bool:
    """`question` of the model a form names; `presets` for none or a shipped preset, which are
    not asked (asking loads transformers: seconds, on the form's first draw), and for a model
    that cannot be resolved (judged when the form is sent)."""
    if not model or models.is_preset(model):
        return presets
    try:
        return question(models.resolve(model))
    except models.ModelError:
        return presets


def offers_checkpointing(model: str | None) -> bool:
    """Whether the form offers gradient checkpointing for this model: not where the model cannot
    recompute its activations (ResNet, ALBERT); the shipped presets all can."""
    return _asked(model, models.supports_checkpointing, True)


def offers_attention(model: str | None) -> bool:
    """Whether the form offers the attention: where the model's can be sdpa or eager (the
    shipped presets' can; not a ResNet's, which has none)."""
    return _asked(model, models.supports_sdpa, True)


def offers_target_length(model: str | None) -> bool:
    """Whether the form offers a target length: for a sequence-to-sequence model alone (no
    shipped preset is one)."""
    return _asked(model, lambda spec: spec.task == models.SEQ2SEQ, False)


def phase_metrics(report: RunReport) -> list[PhaseMetric]:
    """One entry per walkthrough phase: its memory, the increase over the previous phase, and
    whether it is done, open or still to come. A watched command that marks none of them: its
    own phase (the process), not four phases it never had."""
    if report.phases and not any(report.phase(name) for name in PHASES):
        return [PhaseMetric(phase_name(p.name, report.on_gpu), _state(p),
                            p.memory_mb, None)
                for p in report.phases]
    metrics = []
    previous_mb = None
    for name in PHASES:
        phase = report.phase(name)
        if phase is None:
            metrics.append(PhaseMetric(phase_name(name, report.on_gpu), PhaseState.PENDING, None,
                                       None))
            continue
        memory_mb = phase.memory_mb
        delta = None if memory_mb is None or previous_mb is None else memory_mb - previous_mb
        metrics.append(PhaseMetric(phase_name(name, report.on_gpu), _state(phase), memory_mb,
                                   delta))
        previous_mb = memory_mb
    return metrics


def _state(phase: PhaseReading) -> PhaseState:
    return PhaseState.DONE if phase.done else PhaseState.OPEN


# What the worker does after each phase ends, until the next begins: the curve rises here.
TRANSITIONS = {
    None: "starting the sampler and the training process",
    Phase.BASELINE: "loading torch and the CUDA context",
    Phase.KERNEL: "loading the model's weights",
    Phase.WEIGHTS: "building the Trainer",
    Phase.TRAINING: "finishing",
}
CPU_TRANSITIONS = {**TRANSITIONS, Phase.BASELINE: "loading torch"}  # no CUDA context to create


class Stage(NamedTuple):
    """Where a run is: the phase it is in (None between phases, while the memory rises), and
    that in words."""

    phase: Phase | str | None
    words: str


def stage(report: RunReport) -> Stage:
    """Where the run is: in a phase, or in the transition after one (while the memory rises)."""
    transitions = TRANSITIONS if report.on_gpu else CPU_TRANSITIONS
    if report.profiling is not None and not report.profiling.done:
        return Stage(Phase.PROFILING, f"profiling {report.options.profile_steps} steps with "
                     "torch.profiler (after training; not part of the run's peak)")
    if not report.phases:
        return Stage(None, transitions[None])
    last = report.phases[-1]
    if not last.done:
        return Stage(last.name, f"phase {phase_name(last.name, report.on_gpu)}")
    return Stage(None, f"{transitions[last.name]} (after {phase_name(last.name, report.on_gpu)})")


class Progress(NamedTuple):
    step: int
    total: int
    fraction: float
    seconds_left: float | None  # None until a step has been timed


def progress(report: RunReport, last_step: Step | None) -> Progress:
    """Training progress. Total steps come from the Trainer once it reports, else the options."""
    total = (last_step.total if last_step else None) or report.options.total_steps()
    step = last_step.step if last_step else 0
    training = report.training
    seconds_left = None
    if last_step and step and training is not None:
        per_step = (last_step.t - training.start_s) / step
        seconds_left = max(0.0, per_step * (total - step))
    return Progress(step, total, min(1.0, step / total) if total else 0.0, seconds_left)


def summary_lines(report: RunReport) -> list[str]:
    """The walkthrough's `print_summary`: Time, Samples/second, then memory occupied."""
    lines = text.timing_lines(report)
    training = report.training
    if training is not None and training.done:
        lines.append(text.occupied_line(training.memory_bytes, report.backend))
    if report.world_size > 1:  # several processes: each GPU's peak, or their spread
        lines.append(report.processes)
        on_gpus = [rank for rank in report.ranks if rank.gpu is not None]
        if len(on_gpus) > gpus.LISTED_AT_MOST:
            lines.append(gpus.spread_line(report))
        else:
            lines += [f"{rank.label()}: peak {mib_text(rank.peak_bytes)}" for rank in on_gpus]
    return lines


def status_line(report: RunReport) -> str:
    """How the run ended, in one line (the error's own text is shown apart: it can be long)."""
    peak = report.summary.peak_bytes
    peak_text = f"peak {mib_text(peak)}" if peak is not None else "no memory sample"
    return {
        Status.RUNNING: Status.RUNNING.value,
        Status.COMPLETED: f"completed: {peak_text}",
        Status.OOM: f"out of memory: {peak_text} before it failed",
        Status.FAILED: f"failed: {peak_text}",
        # who stopped it: the user, a signal to the CLI (SIGTERM, SIGHUP, Ctrl-C)
        Status.STOPPED: f"{_stop_words(report.error)}: {peak_text}",
    }.get(report.status, report.status)


def _stop_words(error: str | None) -> str:
    if error and error.startswith(Status.STOPPED) and "\n" not in error and len(error) < 120:
        return error
    return Status.STOPPED.value


class Forecast(NamedTuple):
    line: str | None  # what the run should need; None for options with errors
    warning: str | None  # when that is more than the device holds, or it cannot be predicted
    duration: str | None = None  # how long it should take (`run_forecast`)
    data: DataBatches | None = None  # a dataset's lengths and the batches it was predicted at


def _target(options: RunOptions, machine: Machine, front: int | None) -> tuple[Target, str]:
    """The device the run would use, and its words; `front`: the page's process's own memory,
    that of the process that will start the run (prediction/target.py)."""
    aimed = target(machine, options.gpu, front=front)
    where = (f"GPU {options.gpu}'s {gib_text(aimed.total)}" if aimed.device == "cuda" else
             f"this machine's {gib_text(aimed.total)} of RAM")
    return aimed, where


def memory_forecast(checked: Checked, machine: Machine, store: Store | None = None,
                    front: int | None = None) -> Forecast:
    """What the run form says before a run starts: the predicted need, and a warning when it is
    more than the device holds (options judged already: wrong ones get no forecast, the form
    shows their errors). On a CPU, one process: the RSS in all, the process itself as the latest
    CPU run in `store` held it before training (the Anatomy page's figure,
    `breakdown.stored_cpu_peak`)."""
    options = checked.options
    aimed, where = _target(options, machine, front)
    device, total = aimed.device, aimed.total
    try:
        options, texts = data.prepared(options, progress=False)
        said = answer(Request(options, aimed, texts.facts if texts is not None else None))
        found = said.data
        forecast = said.ranks if options.distributed else said.alone
    except (PredictionError, data.DataError) as error:
        return Forecast(None, f"cannot predict this run: {error}")
    line = forecast.need_line()
    if found is not None:
        line = (f"{line}, at its longest batch ({found.batches.longest.words()}); a typical "
                f"batch ({found.batches.typical.words()}) about {size_text(found.typical.peak)}")
    if options.distributed:
        # A GPU holds one process's figure; a CPU's RAM holds every process's.
        need = ((forecast.nvml_peak or forecast.peak) if device == "cuda" else
                forecast.peak * options.world_size)
        warning = None
        if need > total:
            warning = (f"predicted peak {gib_text(need)} is more than {where}: "
                       "this run will most likely end out of memory")
        return Forecast(_unquantized(line, options), warning,
                        data=found.batches if found else None)
    stored = (breakdown.stored_cpu_peak(store, forecast)
              if device == "cpu" and store is not None and found is None else None)
    if stored is not None:
        run_id, expected = stored
        line = (f"this run should need about {size_text(expected.rss)} of RAM in all: "
                f"{size_text(expected.tensors)} for tensors (peak: {forecast.peak_at}) and "
                f"{size_text(expected.process)} for the process itself (the interpreter, torch's "
                f"libraries, the data: as run {run_id} held them before training)")
    try:
        warning = _fit_warning(said, where)
    except PredictionError as error:
        return Forecast(None, f"cannot predict this run: {error}")
    return Forecast(_unquantized(line, options), warning, data=found.batches if found else None)


def _unquantized(line: str, options: RunOptions) -> str:
    """The forecast's line, and a sentence on what it leaves out of the model's config: its
    quantization (the page ends the line's last sentence)."""
    words = text.unquantized(model=options.model)  # its file gone since: the line alone
    return f"{line}. {words}" if words else line


def _fit_warning(said: Answer, where: str) -> str | None:
    """One process against its device: nothing where it fits surely; else that it does not
    (or may not) fit, which limit decides, and the largest batch size that does
    (prediction/limits.py); a dataset's at its longest batch."""
    verdict = said.verdict
    if verdict.sure:
        return None
    line = verdict.line(where)
    return line[0].upper() + line[1:]


def run_forecast(checked: Checked, machine: Machine, store: Store, front: int | None = None
                 ) -> Forecast:
    """What the run form says before a run starts: the memory it should need and how long it
    should take (from the runs stored here, `analysis.duration`); `front`: as `_target`'s."""
    memory = memory_forecast(checked, machine, store, front)
    if memory.line is None:
        return memory
    options = checked.options
    device_name = machine.devices[options.gpu].name if machine.has_gpu else None
    # A dataset's run: its steps are its texts', its tokens a step its typical batch's.
    estimate = duration.estimate(store, options, machine.backend, device_name,
                                 memory.data.facts if memory.data is not None else None)
    return memory._replace(duration=estimate.line())


# --- the device panel (what nvitop shows), from the readings the run's sampler stored ---

STATUS_CAPTION = ("Read by the run's own sampler every 0.5 s, beside the memory samples: NVML for "
                  "each GPU's utilisation, power, temperature and processes (every process with "
                  "a context on the GPU, this run's or not), psutil for the host (CPU over all "
                  "cores; RAM used = total − available). A process of another container has no "
                  "name here.")


class PanelMetric(NamedTuple):
    label: str
    value: str
    history: list[float] | None  # the window's readings, oldest first (a sparkline)


class GpuLine(NamedTuple):
    gpu: int  # as stored (store.device_key)
    name: str  # "GPU 0"; on a run across hosts, its host's name before it
    metrics: list[PanelMetric]


class HostLine(NamedTuple):
    name: str  # "Host"; on a run across hosts, the host's name
    metrics: list[PanelMetric]


class ProcessLine(NamedTuple):
    gpu: int  # its index on its host
    pid: int
    name: str | None
    used: int | None  # bytes
    ours: bool  # this run's training process
    host: str | None = None  # a run across hosts': the host's name


class DevicePanel(NamedTuple):
    gpus: list[GpuLine]
    host: list[HostLine]  # each host's
    processes: list[ProcessLine]
    hosts: list[HostStatus]  # every reading in the window, for a chart
    gpu_readings: list[GpuStatus]
    caption: str
    host_names: tuple[str, ...] = ()  # a run across hosts': its hosts, by their place


def _gib(value: int | None) -> str:
    return "—" if value is None else gib_text(value)


def _metric(label: str, rows: list, key: str, text_of) -> PanelMetric:
    values = [getattr(r, key) for r in rows if getattr(r, key) is not None]
    latest = rows[-1] if rows else None
    return PanelMetric(label, "—" if latest is None or getattr(latest, key) is None
                       else text_of(latest), values or None)


def device_panel(store: Store, report: RunReport, window_s: float | None) -> DevicePanel | None:
    """The device panel of a run: the last `window_s` seconds of readings (None: the whole run),
    the latest of each as the metric's value; the processes on the GPUs at the last reading (for
    a finished run: at the end of training). None when the run has no readings."""
    end = store.last_time(report.id)
    since = 0.0 if window_s is None else max(0.0, end - window_s)
    hosts = store.host_status(report.id, since)
    if not hosts:
        return None
    readings = store.gpu_status(report.id, since)
    latest = {s.gpu: s for s in store.latest_samples(report.id)}
    lines = []
    for gpu in sorted({r.gpu for r in readings}):
        rows = [r for r in readings if r.gpu == gpu]
        sample = latest.get(gpu)
        lines.append(GpuLine(gpu, text.panel_gpu(report.hosts, gpu), [
            _metric("GPU utilisation", rows, "util", lambda r: f"{r.util} %"),
            # The limit and the total go in the label: a card 170 px wide holds a short value.
            _metric("Power" + ("" if rows[-1].power_limit_w is None else
                               f" (of {rows[-1].power_limit_w:.0f} W)"), rows, "power_w",
                    lambda r: f"{r.power_w:.0f} W"),
            _metric("Temperature", rows, "temperature_c", lambda r: f"{r.temperature_c} °C"),
            PanelMetric("Memory" if sample is None else f"Memory (of {_gib(sample.total)})",
                        _gib(None if sample is None else sample.used), None)]))
    host = []
    for place in sorted({h.host for h in hosts}):
        rows = [h for h in hosts if h.host == place]
        host.append(HostLine(text.panel_host(report.hosts, place), [
            _metric("CPU (all cores)", rows, "cpu_percent", lambda r: f"{r.cpu_percent:.0f} %"),
            PanelMetric(f"RAM (of {_gib(rows[-1].ram_total)})", _gib(rows[-1].ram_used),
                        [h.ram_used / GIB for h in rows])]))
    at = None
    if window_s is None and report.training is not None and report.training.done:
        at = report.training.end_s
    worker = store.run(report.id).worker_pid
    across = len(report.hosts) > 1
    processes = [ProcessLine(p.gpu % HOST_STRIDE, p.pid, p.name, p.used, p.pid == worker,
                             text.panel_host(report.hosts, p.gpu // HOST_STRIDE) if across
                             else None)
                 for p in store.gpu_processes(report.id, at)]
    return DevicePanel(lines, host, processes, hosts, readings, STATUS_CAPTION, report.hosts)


def batch_size_forecast(checked: Checked, machine: Machine, front: int | None = None
                        ) -> Forecast:
    """The form's "What fits?": the largest batch size predicted to fit the chosen device."""
    options = checked.options
    if options.on_dataset:
        return Forecast(None, "What fits? searches the dummy data's batches of one length; a "
                              "dataset's batch sizes each form their own longest batch: Predict "
                              "memory and time tells what the longest batch of this batch size "
                              "needs")
    if options.distributed:
        # The search replays one process alone: a rank of several holds more (DDP's gradient
        # buckets) or less (FSDP's shards), and CPU ranks share one RAM.
        n = options.world_size
        return Forecast(None, f"What fits? answers for one process alone, not for {n} "
                              f"({options.strategy}): with one process it gives its answer, and "
                              f"Predict memory and time tells what each of the {n} needs at "
                              "this batch size")
    aimed, where = _target(options, machine, front)
    try:
        fit = answer(Request(options, aimed)).largest_batch()
    except PredictionError as error:
        return Forecast(None, f"cannot predict this run: {error}")
    if fit.batch_size is None:
        return Forecast(None, fit.line(where))
    return Forecast(fit.line(where), None)
