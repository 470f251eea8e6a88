"""What one run is, as every reader sees it: the `RunReport`, built from the store in one place.

`show` prints it, the pages and figures draw it, `export` writes it. A phase begins when its state
is reached (the tiny tensor is on the GPU, the weights are in) and ends when the next step
begins; its memory is the last sample at its end: the figure the walkthrough prints between its
steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from anatomy.analysis.components import MEASURED_STEPS, Components, with_nvml
from anatomy.analysis.lengths import Lengths
from anatomy.analysis.models import display_name
from anatomy.analysis.operations import OperationProfile
from anatomy.analysis.options import (
    ReportedOptions,
    RunOptions,
    lora_words,
    option_words,
)
from anatomy.store import (
    Message,
    Origin,
    RunFacts,
    RunRow,
    RunSource,
    Step,
    Store,
    TrainingSummary,
    device_key,
    rank_series,
    series_rank,
)
from anatomy.units import mib
from anatomy.vocabulary import (
    PHASES,
    Backend,
    MemoryApi,
    Phase,
    RecordedBy,
    SourceKind,
    Status,
)

__all__ = ["IMPORTED", "PHASES", "PhaseReading", "RankReading", "RunListing", "RunReport", "Summary",
           "first_occurrences", "report", "run_rows", "when"]


IMPORTED = "imported"  # the mark of a run copied in from another store (`transfer.import_runs`)


@dataclass(frozen=True)
class PhaseReading:
    """One phase of a run and the memory at its end (the latest reading while it lasts)."""

    name: str
    start_s: float
    end_s: float | None  # None while the phase lasts
    memory_bytes: int | None  # None when no sample was taken before its end

    @property
    def memory_mb(self) -> int | None:
        return mib(self.memory_bytes)

    @property
    def done(self) -> bool:
        return self.end_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start_s": self.start_s, "end_s": self.end_s,
                "memory_mb": self.memory_mb, "memory_bytes": self.memory_bytes}


@dataclass(frozen=True)
class RankReading:
    """One training process of several: its phases, with its GPU's memory (NVML) at
    each phase's end and at its peak, and its measured components. On the CPU the sampler reads
    the RSS of each rank's own processes apart (`gpu` None); a store of before it holds the
    whole tree's alone, every rank's the same one figure, all ranks together."""

    rank: int
    gpu: int | None  # the GPU it trained on (NVML index on its host); None for a CPU rank
    phases: tuple[PhaseReading, ...]
    peak_bytes: int | None  # the highest sample of its GPU (of its processes on the CPU)
    components: Components | None
    # A run on several hosts: the host it ran on; None for a run of one host.
    host: str | None = None
    device: int = 0  # the device its samples are stored under (`store.device_key`)

    @property
    def peak_mb(self) -> int | None:
        return mib(self.peak_bytes)

    @property
    def measured_alone(self) -> bool:
        """Its memory is its own: its GPU's, or its own processes' RSS (not every rank's)."""
        return self.gpu is not None or series_rank(self.device) is not None

    def phase(self, name: str) -> PhaseReading | None:
        """The phase's first occurrence (`first_occurrences`)."""
        return next((p for p in self.phases if p.name == name), None)

    def place(self) -> str | None:
        """Where it ran: "GPU 3", "node-1 · GPU 3" on a run of several hosts, "node-1" for a
        CPU rank there; None for a CPU rank of one host."""
        gpu = None if self.gpu is None else f"GPU {self.gpu}"
        return " · ".join(w for w in (self.host, gpu) if w is not None) or None

    def label(self) -> str:
        """"GPU 3 (rank 3)", "node-1 · GPU 3 (rank 11)"; "rank 1" on the CPU."""
        place = self.place()
        if self.gpu is None:
            return f"{place} · rank {self.rank}" if place else f"rank {self.rank}"
        return f"{place} (rank {self.rank})"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "gpu": self.gpu, "phases": [p.to_dict() for p in self.phases],
                "peak_mb": self.peak_mb, "peak_bytes": self.peak_bytes,
                "components": None if self.components is None else self.components.to_dict(),
                **({} if self.host is None else {"host": self.host})}


@dataclass(frozen=True)
class Summary:
    """How the training went: the Trainer's figures (None until it reports them), and the peak
    and the end of training from the samples."""

    time_s: float | None
    samples_per_second: float | None
    peak_bytes: int | None  # the highest sample of the training device (profiling left out)
    memory_bytes: int | None  # at the end of the training phase
    trained: TrainingSummary  # the summary as the worker stored it
    # Samples a second once the first steps are done (`steady_rate`); not in to_dict (show --json
    # keeps its schema): derived from the steps, which every export carries.
    steady_samples_per_second: float | None = None
    # The training's own peak: before its first evaluation where it evaluated while it trained
    # (RunReport.evaluated_from), else `peak_bytes`; not in to_dict, for the same reason.
    training_peak_bytes: int | None = None

    @property
    def peak_mb(self) -> int | None:
        return mib(self.peak_bytes)

    @property
    def memory_mb(self) -> int | None:
        return mib(self.memory_bytes)

    @property
    def steps(self) -> int | None:
        return self.trained.steps

    @property
    def loss(self) -> float | None:
        return self.trained.loss

    def to_dict(self) -> dict[str, Any]:
        out = {**self.trained.trainer_figures(), "peak_mb": self.peak_mb,
               "peak_bytes": self.peak_bytes, "memory_mb": self.memory_mb}
        out.setdefault("time_s", None)
        out.setdefault("samples_per_second", None)
        return out


@dataclass(frozen=True)
class RunReport:
    id: int
    name: str | None
    status: Status
    error: str | None
    preset: str
    created_at: float
    ended_at: float | None
    stored_options: Mapping[str, Any]  # as stored, options this anatomy does not know included
    # The options as the run knows them, typed by the kind of run: every option of anatomy's own
    # (RunOptions); of a user's training only those it reported (ReportedOptions).
    ran_with: RunOptions | ReportedOptions
    environment: RunFacts  # versions, device, driver, model, as recorded
    backend: Backend
    memory_api: MemoryApi | None
    gpu: int  # the device that trains (NVML index)
    tags: tuple[str, ...]
    sweep: str | None
    phases: tuple[PhaseReading, ...]  # the walkthrough's, in order
    profiling: PhaseReading | None  # torch.profiler's steps after training: not in the peak
    samples: int | None  # None: not counted (`report(counted=False)`)
    samples_sent: int | None
    steps: int
    messages: tuple[Message, ...]
    summary: Summary
    components: Components | None
    operations: OperationProfile | None
    source: RunSource = field(default_factory=RunSource)  # who started it
    # Several training processes: each one's phases, GPU and memory; () for one.
    ranks: tuple[RankReading, ...] = ()
    imported: Origin | None = None  # where an imported copy was recorded; None: recorded here
    # A user's Trainer that evaluated after a step (while or after it trained): the run's clock at its
    # first evaluation, before which the training's peak is read (Summary.training_peak_bytes,
    # the components' sampled peak: a training step's, what the prediction describes); the
    # summary's peak is the whole run's. None: not cut.
    evaluated_from: float | None = None

    @property
    def world_size(self) -> int:
        """Training processes: 1, or the ranks of a run on several GPUs (or CPU processes)."""
        return self.environment.world_size or max(1, len(self.ranks))

    @property
    def strategy(self) -> str | None:
        """How several processes shared the training (a strategy's name); None for one
        process."""
        return self.environment.strategy if self.world_size > 1 else None

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPUs it trained on (NVML indices), rank by rank; () on the CPU."""
        if not self.on_gpu:
            return ()
        return self.environment.gpus or (self.gpu,)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts of a run on several, in the order they joined; () for one."""
        return self.environment.hosts or ()

    def gpu_peaks(self) -> dict[int, int | None]:
        """Each GPU's peak (bytes), by the device its samples are stored under (its NVML index
        on a run of one host): the run's GPU alone for one process."""
        if self.ranks and self.on_gpu:
            return {r.device: r.peak_bytes for r in self.ranks if r.gpu is not None}
        return {self.gpu: self.summary.peak_bytes} if self.on_gpu else {}

    @property
    def started_by_anatomy(self) -> bool:
        """Its own worker trained (`anatomy run`, the dashboard, a sweep): every option is known.
        Otherwise a user's script or command trained, and only the options it reported are."""
        return not self.source.by_user

    @property
    def recorded_by(self) -> RecordedBy:
        """What marked its phases and reported its steps (what the run can know)."""
        if self.started_by_anatomy:
            return RecordedBy.WORKER
        if self.environment.training_arguments is not None:  # the callback's description
            return RecordedBy.CALLBACK
        # A script's run is the phase API's (or a callback's that ended before the Trainer
        # began) even before it marks anything: it is no watched command.
        if self.source.kind == SourceKind.SCRIPT or self.steps or \
                any(p.name != Phase.PROCESS for p in self.phases):
            return RecordedBy.PHASE_API
        return RecordedBy.COMMAND

    @property
    def origin(self) -> str:
        """Where the run came from, in words."""
        return self.source.words()

    @property
    def option_names(self) -> tuple[str, ...]:
        """The options the run stored, in their order: those this anatomy does not know too."""
        return tuple(self.stored_options)

    @cached_property
    def options(self) -> RunOptions:
        """The options it ran with, as a run of anatomy's own has them: a user's training's where
        it reported them, the defaults for the rest (what a prediction of it assumes)."""
        if isinstance(self.ran_with, RunOptions):
            return self.ran_with
        return RunOptions.from_dict(self.stored_options)

    @property
    def on_gpu(self) -> bool:
        return self.backend == Backend.NVML

    def phase(self, name: str) -> PhaseReading | None:
        """The phase's first occurrence: a name a script or a Trainer marks again (training,
        eval, training; `train()` twice) is one phase per occurrence in `phases`, and a reader
        that names one phase reads its first (`first_occurrences`)."""
        return next((p for p in self.phases if p.name == name), None)

    @property
    def training(self) -> PhaseReading | None:
        return self.phase(Phase.TRAINING)

    def phase_memory(self) -> dict[str, int | None]:
        """Bytes at the end of each walkthrough phase (None: not reached, or no sample)."""
        ended = first_occurrences(p for p in self.phases if p.done)
        return {name: ended[name].memory_bytes if name in ended else None for name in PHASES}

    @property
    def device_name(self) -> str:
        return self.environment.device

    @property
    def devices(self) -> str:
        """What it trained on, in words: "NVIDIA H200", "CPU"; "2 × CPU (ddp)" for several
        processes (another class of run than one device's), "2 × CPU" where a user's launch did
        not say how they shared the training."""
        if self.world_size > 1:
            return f"{self.world_size} × {self.device_name}{self._strategy_words}"
        return self.device_name

    @property
    def processes(self) -> str:
        """Its training processes in words: "2 processes (ddp)", "2 processes" (no strategy said),
        "1 process"."""
        if self.world_size == 1:
            return "1 process"
        return f"{self.world_size} processes{self._strategy_words}"

    @property
    def _strategy_words(self) -> str:
        return f" ({self.strategy})" if self.strategy else ""

    @property
    def device_total(self) -> int | None:
        """The training device's memory (a CPU run: the machine's RAM)."""
        return self.environment.device_total

    @property
    def parameters(self) -> int | None:
        """The model's parameters as the worker counted them (None for runs that predate it)."""
        return self.environment.parameters

    def run_words(self) -> str:
        """"Run 7", or "Run 7 (imported)" for a copy imported from another store: every label,
        title and line that names the run says which it is (the copy has the same name and was
        started by the same)."""
        return f"Run {self.id}" + (f" ({IMPORTED})" if self.imported else "")

    def label(self) -> str:
        """The run in a few words: a legend entry, a list's line."""
        known = self.ran_with
        # A user's run that recorded no model: its script or command, unless it has a name.
        model = self.model or (None if self.name else self.preset)
        words = [self.run_words(), *(w for w in (self.name, model) if w)]
        words += [f"bs {known.batch_size}"] if known.batch_size is not None else []
        words += [known.precision] if known.precision else []
        if known.gradient_checkpointing:
            words.append("ckpt")
        if (known.grad_accum or 1) > 1:
            words.append(f"accum {known.grad_accum}")
        if known.lora_rank:
            words.append(f"LoRA r{known.lora_rank}")
        if known.frozen:
            words.append("part frozen")
        return " · ".join(words)

    def title(self) -> str:
        """The run in a sentence: a page's heading. The user's name for it comes first."""
        known = self.ran_with
        parts = [self.model] if self.model else []
        if known.batch_size is not None:
            parts.append(f"batch size {known.batch_size}")
        data = self.environment.data
        if self.environment.image_size:  # an image model: its images' side, not a seq len
            side = self.environment.image_size
            parts.append(f"{side}×{side} images")
        elif data is not None and data.lengths:  # its texts decided, not the options' seq len
            parts.append(f"seq len {data.max_length:,}" if data.padding == "max_length"
                         and data.max_length else
                         f"texts of up to {Lengths(data.lengths).longest:,} tokens")
        elif known.seq_len is not None:
            parts.append(f"seq len {known.seq_len}")
        extras = [option_words(known)] if known.precision else []
        if known.gradient_checkpointing:
            extras.append("gradient checkpointing")
        if (known.grad_accum or 1) > 1:
            extras.append(f"accumulation {known.grad_accum}")
        if known.lora_rank:
            extras.append(lora_words(known))
        where = "" if self.started_by_anatomy else f" ({self.source.short_words()})"
        what = ", ".join(str(p) for p in parts + extras)
        named = f"{self.run_words()}: {self.name}" if self.name else self.run_words()
        if what:
            named += f" — {what}" if self.name else f": {what}"
        return f"{named} on {self.devices}{where}"

    @property
    def model_name(self) -> str | None:
        """The model as the run was given it: a preset, a path or a Hub id of anatomy's own runs;
        the model class the callback recorded of a user's training (None where nothing did)."""
        return self.ran_with.model or self.environment.model_name

    @property
    def model(self) -> str | None:
        """The model as the run names it (`model_name`, as every page shows a model)."""
        return display_name(self.model_name) if self.model_name else None

    def to_dict(self) -> dict[str, Any]:
        """The report as `show --json` prints it and an export carries it."""
        return {
            "id": self.id, "name": self.name, "status": self.status, "error": self.error,
            "preset": self.preset, "created_at": self.created_at, "ended_at": self.ended_at,
            "options": dict(self.stored_options), "environment": self.environment.to_dict(),
            "backend": self.backend, "memory_api": self.memory_api, "gpu": self.gpu,
            "tags": list(self.tags), "sweep": self.sweep,
            "phases": [p.to_dict() for p in self.phases],
            **({} if self.profiling is None else {Phase.PROFILING.value: self.profiling.to_dict()}),
            "samples": self.samples, "samples_sent": self.samples_sent, "steps": self.steps,
            "messages": [m._asdict() for m in self.messages],
            "summary": self.summary.to_dict(),
            "components": None if self.components is None else self.components.to_dict(),
            "operations": None if self.operations is None else self.operations.to_dict(),
            # Runs of anatomy's own worker print as they always did.
            **({"source": source} if (source := self.source.to_dict()) else {}),
            # So do runs of one process: the ranks are said only where there are several.
            **({"world_size": self.world_size, "strategy": self.strategy,
                "gpus": list(self.gpus), "ranks": [r.to_dict() for r in self.ranks]}
               if self.world_size > 1 else {}),
        }


def first_occurrences(phases: Iterable[PhaseReading]) -> dict[str, PhaseReading]:
    """Each phase by its name, at its first occurrence: what every reader that names a phase
    reads (its memory in the walkthrough's figures and the components, Compare's alignment at
    it). The memory the walkthrough reads at a phase is where the run first reached it; a later
    training (a second `train()`, training after an evaluation) is listed, drawn and exported
    with its own span, never folded into the first."""
    first: dict[str, PhaseReading] = {}
    for phase in phases:
        first.setdefault(phase.name, phase)
    return first


def steady_rate(span: tuple[Step, Step] | None, batch: Any, grad_accum: int | None,
                processes: int) -> float | None:
    """Samples a second from the end of step MEASURED_STEPS to the end of the last step (`span`,
    `Store.step_span`): the first step's one-time costs — kernels chosen, memory first reserved —
    and the component probe's synchronised steps left out, every process's samples counted; None
    without enough steps or a known batch (a user's run may not say it). The Trainer's own
    figure averages over the whole training, so in a short run its first step decides it
    (bert-large, 10 steps on an H200: 2.2 s of 2.9)."""
    if not isinstance(batch, int) or span is None or span[1].t <= span[0].t:
        return None
    first, last = span
    samples = (last.step - first.step) * batch * (grad_accum or 1)
    return samples * processes / (last.t - first.t)


def trained_until_stopped(store: Store, run_id: int) -> TrainingSummary | None:
    """The figures a Trainer reports at its end, for a run stopped before it did (its Trainer
    never returned): the steps made, the time from the training phase's start to the last step,
    and the samples a second over it (every process's; unknown where the batch size is). None
    without a training step."""
    run = store.run(run_id)
    training = next((p for p in store.phases(run_id) if p.name == Phase.TRAINING), None)
    last = store.last_step(run_id)
    if run is None or training is None or last is None:
        return None
    ran_with = known_options(run)
    batch = ran_with.batch_size
    samples = (None if not isinstance(batch, int) else
               last.step * batch * (ran_with.grad_accum or 1) * (run.environment.world_size or 1))
    return TrainingSummary.measured(last.step, last.t - training.start_s, samples)


def report(store: Store, run_id: int, run: RunRow | None = None, counted: bool = True
           ) -> RunReport | None:
    """The run's report, from the store; None when there is no such run. `counted=False` leaves
    its samples uncounted (None), for a reader that does not show the count: a count reads
    every sample, seconds at millions of them (the Live page's refresh, docs/BENCHMARKS.md)."""
    run = run or store.run(run_id)
    if run is None:
        return None
    spans = [PhaseReading(span.name, span.start_s, end, store.memory_before(run_id, run.gpu, end))
             for span, end in _ends(store, run, store.phases(run_id))]
    phases = tuple(p for p in spans if p.name != Phase.PROFILING)  # the walkthrough's, or PROCESS
    profiling = next((p for p in spans if p.name == Phase.PROFILING), None)
    until = _peak_until(store, run, profiling)
    peak = store.peak(run_id, run.gpu, before=until)
    evaluated_from = _evaluated_from(store, run)
    training_peak = peak if evaluated_from is None else store.peak(run_id, run.gpu,
                                                                   before=evaluated_from)
    trained = run.summary
    ran_with = known_options(run)
    first = first_occurrences(phases)
    training = first.get(Phase.TRAINING)
    memory = {name: p.memory_bytes for name, p in first.items()}
    summary = Summary(time_s=trained.time_s, samples_per_second=trained.samples_per_second,
                      peak_bytes=peak, memory_bytes=training.memory_bytes if training else None,
                      training_peak_bytes=training_peak,
                      trained=trained, steady_samples_per_second=steady_rate(
                          store.step_span(run_id, MEASURED_STEPS), ran_with.batch_size,
                          ran_with.grad_accum, run.environment.world_size or 1))
    return RunReport(
        id=run.id, name=run.name, status=run.status, error=run.error,
        preset=display_name(run.preset),
        created_at=run.created_at, ended_at=run.ended_at, stored_options=run.options,
        ran_with=ran_with,
        environment=run.environment, backend=run.backend, memory_api=run.memory_api, gpu=run.gpu,
        tags=run.tags, sweep=run.sweep, phases=phases, profiling=profiling,
        samples=store.sample_count(run_id) if counted else None,
        samples_sent=run.samples_sent, steps=store.step_count(run_id),
        messages=tuple(store.messages(run_id)), summary=summary,
        components=(None if trained.components is None else
                    with_nvml(trained.components, memory, training_peak, run.backend)),
        operations=(None if trained.operations is None else
                    OperationProfile.from_dict(trained.operations)),
        source=run.source,
        ranks=_ranks(store, run, until), imported=run.origin, evaluated_from=evaluated_from)


def _peak_until(store: Store, run: RunRow, profiling: PhaseReading | None) -> float | None:
    """Where the run's peak is read up to (None: its every sample). The profiler's own buffers
    are no memory the training needed (638 vs 540 MB on a CPU). After the last phase of
    anatomy's own worker ends comes nothing but the worker's exit, and on a CPU the
    interpreter's and torch's teardown rises above the training (a tiny run: 934 MiB in
    training, 986 MiB as the worker exited, the same without anatomy); a GPU's memory only falls
    there. A user's script or command may do more after its last mark (evaluate, save): its
    samples all count."""
    if profiling is not None:
        return profiling.start_s
    if run.source.by_user or run.status == Status.RUNNING:
        return None
    ends = [end for _, end in _ends(store, run, store.phases(run.id, None))]
    # Just after the end (`peaks` reads before it): a phase's memory is its last sample at or
    # before its end, and the peak never below it.
    return math.nextafter(max(ends), math.inf) if ends and None not in ends else None


def _evaluated_from(store: Store, run: RunRow) -> float | None:
    """When the run's Trainer first evaluated, where a step had ended before (an evaluation
    before any step, eval_on_start, leaves no training step's peak to read apart)."""
    evaluated = run.environment.evaluated_at
    if evaluated is None:
        return None
    first = store.step_span(run.id, 0)
    return evaluated if first is not None and first[0].t < evaluated else None


def reports(store: Store, run_ids: Iterable[int]) -> list[RunReport]:
    """The runs' reports, in the order asked; KeyError naming the first run not there (an export
    writes nothing until it has every run)."""
    found = []
    for run_id in run_ids:
        rep = report(store, run_id)
        if rep is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        found.append(rep)
    return found


def known_options(run: RunRow) -> RunOptions | ReportedOptions:
    """The options as the run knows them: every option of anatomy's own runs (those added since
    at their defaults: it ran with them); of a user's training only those it reported (None for
    the rest: never a default it did not use)."""
    if run.source.by_user:
        return ReportedOptions.from_dict(run.options)
    return RunOptions.from_dict(run.options)


def _ends(store: Store, run: RunRow, spans: list) -> list[tuple]:
    """Each phase with where it ends: a run that ended without a word (store/liveness.py) left
    its last phase open, and it is read as ending at the run's last sample, as the next manager
    will write it."""
    if run.status == Status.RUNNING or all(span.end_s is not None for span in spans):
        return [(span, span.end_s) for span in spans]
    last = store.last_time(run.id)
    return [(span, span.end_s if span.end_s is not None else max(span.start_s, last))
            for span in spans]


def _ranks(store: Store, run: RunRow, until: float | None) -> tuple[RankReading, ...]:
    """Each rank's reading, for a run of several training processes; () for one."""
    if (run.environment.world_size or 1) <= 1:
        return ()
    gpus = run.environment.gpus or ()
    # Several hosts: each rank's host, by its index in the run's hosts.
    hosts = run.environment.hosts or ()
    rank_hosts = run.environment.rank_hosts or ()
    on_gpu = run.backend == Backend.NVML
    rank_components = run.summary.rank_components or {}
    spans: dict[int, list] = {}
    # Every rank's at once (a run may have 64), each ended where readers read it (_ends).
    for span, end in _ends(store, run, store.phases(run.id, None)):
        if span.name != Phase.PROFILING:
            spans.setdefault(span.rank, []).append(span._replace(end_s=end))
    baseline_end = next((s.end_s for s in spans.get(0, []) if s.name == Phase.BASELINE), None)
    where = {}
    locals_on: dict[int, int] = {}  # each host's ranks so far: a rank's local rank there
    for rank in store.ranks(run.id):
        gpu = gpus[rank] if on_gpu and rank < len(gpus) else None
        host = rank_hosts[rank] if rank < len(rank_hosts) else 0
        local = locals_on[host] = locals_on.get(host, -1) + 1
        # The CPU: the rank's own processes' RSS where the sampler read it apart (a store of
        # before reads its host's tree's, every rank's together).
        where[rank] = (gpu, host, device_key(host, gpu if gpu is not None else run.gpu)
                       if on_gpu else device_key(host, rank_series(local)))
    if not on_gpu:
        found = store.peaks(run.id, sorted({device for _, _, device in where.values()}))
        where = {rank: (gpu, host, device if found.get(device) is not None else
                        device_key(host, run.gpu)) for rank, (gpu, host, device) in where.items()}
    # The memory at each rank's phase ends, and at the worker's baseline (rank 0 has it).
    points = [(device, span.end_s) for rank, (_, _, device) in where.items()
              for span in spans.get(rank, [])]
    points += [(device, baseline_end) for _, _, device in where.values()]
    readings = iter(store.readings_before(run.id, points))
    ends = {rank: [next(readings) for _ in spans.get(rank, [])] for rank in where}
    baselines = {rank: next(readings) for rank in where}
    peaks = store.peaks(run.id, sorted({device for _, _, device in where.values()}),
                        before=until)  # the run's own peak's (`_peak_until`)
    out = []
    for rank, (gpu, host, device) in where.items():
        phases = tuple(PhaseReading(span.name, span.start_s, span.end_s, memory)
                       for span, memory in zip(spans.get(rank, []), ends[rank]))
        values = run.summary.components if rank == 0 else rank_components.get(rank)
        memory = {name: p.memory_bytes for name, p in first_occurrences(phases).items()}
        memory.setdefault(Phase.BASELINE, baselines[rank])  # the worker's, before the ranks
        components = (None if values is None else
                      with_nvml(values, memory, peaks[device], run.backend))
        out.append(RankReading(rank, gpu, phases, peaks[device], components,
                               hosts[host] if host < len(hosts) and len(hosts) > 1 else None,
                               device))
    return tuple(out)


@dataclass(frozen=True)
class RunListing:
    """One line of the list of stored runs: what the CLI's `runs` prints and the Runs page
    shows."""

    id: int
    name: str | None
    created: str  # local time, "YYYY-MM-DD HH:MM:SS"
    status: Status
    preset: str  # the model of anatomy's own runs; a user's model, or its script or command
    batch_size: int | None
    seq_len: int | None
    precision: str | None
    gradient_checkpointing: bool | None
    grad_accum: int | None
    optim: str | None
    backend: Backend
    device: str  # the GPU's name, or "CPU"; "2 × NVIDIA H200 (ddp)" for several processes
    tags: list[str]
    sweep: str | None
    peak_mb: int | None
    time_s: float | None
    samples_per_second: float | None
    model: str | None = None  # as the run names it (None: a user's training recorded none)
    processes: int = 1  # training processes
    lora_rank: int | None = None  # None: a user's training did not say
    source: str = ""  # who started it: "" for anatomy's own worker, else its few words
    imported: str = ""  # where an imported copy was recorded (`Origin.words`); "": here
    dataset: str = ""  # the data it trained on: an absolute path, or a Hub id; "": the dummy data


def when(timestamp: float | None) -> str:
    """A wall-clock time as every list shows it."""
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else ""


def _dataset(rep: RunReport) -> str:
    """The data a run trained on: as it read it (a path made absolute), else as its options name
    it (a run that failed before it read it); "" on the dummy data."""
    data = rep.environment.data
    return (data.dataset if data is not None and data.dataset else None) or \
        (rep.options.dataset or "")


def run_rows(store: Store, tag: str | None = None, preset: str | None = None,
             status: str | None = None) -> list[RunListing]:
    """One line per stored run (those with the tag, preset and status given), newest first."""
    rows = []
    for run in store.find_runs(tag=tag, preset=preset, status=status):
        rep = report(store, run.id, run)
        summary, known = rep.summary, rep.ran_with
        rows.append(RunListing(
            id=run.id, name=run.name, created=when(run.created_at), status=run.status,
            preset=display_name(run.preset), batch_size=known.batch_size,
            seq_len=known.seq_len, precision=known.precision,
            gradient_checkpointing=known.gradient_checkpointing, grad_accum=known.grad_accum,
            optim=known.optim, backend=run.backend, device=rep.devices, tags=list(run.tags),
            sweep=run.sweep, peak_mb=summary.peak_mb, time_s=summary.time_s,
            samples_per_second=summary.samples_per_second, model=rep.model,
            processes=rep.world_size, lora_rank=known.lora_rank,
            source="" if rep.started_by_anatomy else rep.source.short_words(),
            imported="" if run.origin is None else run.origin.words(),
            dataset=_dataset(rep)))
    return rows
