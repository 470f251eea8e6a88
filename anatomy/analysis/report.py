"""What one run is, as every reader sees it: the `RunReport`, built from the store in one place.

`show` prints it, the pages and figures draw it, `export` writes it. A phase begins when its state
is reached (the tiny tensor is on the GPU, the weights are in) and ends when the next step
begins; its memory is the last sample at its end: the figure the walkthrough prints between its
steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from anatomy.analysis.components import Components, with_nvml
from anatomy.analysis.models import display_name
from anatomy.analysis.operations import OperationProfile
from anatomy.analysis.options import RunOptions
from anatomy.store import PHASES, Message, RunRow, Store
from anatomy.units import mib

__all__ = ["PHASES", "PhaseReading", "RunListing", "RunReport", "Summary", "report", "run_rows",
           "when"]

TRAINING = "training"


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
class Summary:
    """How the training went: the Trainer's figures (None until it reports them), and the peak
    and the end of training from the samples."""

    time_s: float | None
    samples_per_second: float | None
    peak_bytes: int | None  # the highest sample of the training device
    memory_bytes: int | None  # at the end of the training phase
    stored: Mapping[str, Any]  # the summary as the worker stored it (its own keys, in order)

    @property
    def peak_mb(self) -> int | None:
        return mib(self.peak_bytes)

    @property
    def memory_mb(self) -> int | None:
        return mib(self.memory_bytes)

    @property
    def steps(self) -> int | None:
        return self.stored.get("steps")

    @property
    def loss(self) -> float | None:
        return self.stored.get("loss")

    def to_dict(self) -> dict[str, Any]:
        out = {**self.stored, "peak_mb": self.peak_mb, "peak_bytes": self.peak_bytes,
               "memory_mb": self.memory_mb}
        out.setdefault("time_s", None)
        out.setdefault("samples_per_second", None)
        return out


@dataclass(frozen=True)
class RunReport:
    id: int
    name: str | None
    status: str
    error: str | None
    preset: str
    created_at: float
    ended_at: float | None
    stored_options: Mapping[str, Any]  # as stored, options this anatomy does not know included
    environment: Mapping[str, Any]  # versions, device, driver: free-form, as recorded
    backend: str  # "nvml" or "cpu-rss"
    memory_api: str | None
    gpu: int  # the device that trains (NVML index)
    tags: tuple[str, ...]
    sweep: str | None
    phases: tuple[PhaseReading, ...]
    samples: int
    samples_sent: int | None
    steps: int
    messages: tuple[Message, ...]
    summary: Summary
    components: Components | None
    operations: OperationProfile | None

    @property
    def options(self) -> RunOptions:
        """The options it ran with (those added since take their defaults: it ran with them)."""
        return RunOptions.from_dict(self.stored_options)

    @property
    def on_gpu(self) -> bool:
        return self.backend == "nvml"

    def phase(self, name: str) -> PhaseReading | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def training(self) -> PhaseReading | None:
        return self.phase(TRAINING)

    def phase_memory(self) -> dict[str, int | None]:
        """Bytes at the end of each walkthrough phase (None: not reached, or no sample)."""
        ended = {p.name: p.memory_bytes for p in self.phases if p.done}
        return {name: ended.get(name) for name in PHASES}

    @property
    def device_name(self) -> str:
        return self.environment.get("gpu_name") or "CPU"

    @property
    def device_total(self) -> int | None:
        """The training device's memory (a CPU run: the machine's RAM)."""
        return self.environment.get("gpu_total") or self.environment.get("ram_total")

    @property
    def parameters(self) -> int | None:
        """The model's parameters as the worker counted them (None for runs that predate it)."""
        return self.environment.get("parameters")

    def label(self) -> str:
        """The run in a few words: a legend entry, a list's line."""
        o = self.options
        words = [f"Run {self.id}", self.preset, f"bs {o.batch_size}", o.precision]
        if o.gradient_checkpointing:
            words.append("ckpt")
        if o.grad_accum > 1:
            words.append(f"accum {o.grad_accum}")
        if o.lora:
            words.append(f"LoRA r{o.lora_rank}")
        return " · ".join(words)

    def title(self) -> str:
        """The run in a sentence: a page's heading."""
        o = self.options
        extras = [o.precision]
        if o.gradient_checkpointing:
            extras.append("gradient checkpointing")
        if o.grad_accum > 1:
            extras.append(f"accumulation {o.grad_accum}")
        if o.lora:
            extras.append(f"LoRA rank {o.lora_rank}")
        return (f"Run {self.id}: {self.preset}, batch size {o.batch_size}, seq len {o.seq_len}, "
                f"{', '.join(extras)} on {self.device_name}")

    def to_dict(self) -> dict[str, Any]:
        """The report as `show --json` prints it and an export carries it."""
        return {
            "id": self.id, "name": self.name, "status": self.status, "error": self.error,
            "preset": self.preset, "created_at": self.created_at, "ended_at": self.ended_at,
            "options": dict(self.stored_options), "environment": dict(self.environment),
            "backend": self.backend, "memory_api": self.memory_api, "gpu": self.gpu,
            "tags": list(self.tags), "sweep": self.sweep,
            "phases": [p.to_dict() for p in self.phases],
            "samples": self.samples, "samples_sent": self.samples_sent, "steps": self.steps,
            "messages": [m._asdict() for m in self.messages],
            "summary": self.summary.to_dict(),
            "components": None if self.components is None else self.components.to_dict(),
            "operations": None if self.operations is None else self.operations.to_dict(),
        }


def report(store: Store, run_id: int, run: RunRow | None = None) -> RunReport | None:
    """The run's report, from the store; None when there is no such run."""
    run = run or store.run(run_id)
    if run is None:
        return None
    phases = tuple(PhaseReading(span.name, span.start_s, span.end_s,
                                store.memory_before(run_id, run.gpu, span.end_s))
                   for span in store.phases(run_id))
    peak = store.peak(run_id, run.gpu)
    stored = dict(run.summary)
    measured = stored.pop("components", None)
    operations = stored.pop("operations", None)
    training = next((p for p in phases if p.name == TRAINING), None)
    summary = Summary(time_s=stored.get("time_s"),
                      samples_per_second=stored.get("samples_per_second"), peak_bytes=peak,
                      memory_bytes=training.memory_bytes if training else None, stored=stored)
    memory = {p.name: p.memory_bytes for p in phases}
    return RunReport(
        id=run.id, name=run.name, status=run.status, error=run.error,
        preset=display_name(run.preset),
        created_at=run.created_at, ended_at=run.ended_at, stored_options=run.options,
        environment=run.environment, backend=run.backend, memory_api=run.memory_api, gpu=run.gpu,
        tags=run.tags, sweep=run.sweep, phases=phases, samples=store.sample_count(run_id),
        samples_sent=run.samples_sent, steps=store.step_count(run_id),
        messages=tuple(store.messages(run_id)), summary=summary,
        components=(None if measured is None else
                    with_nvml(Components.from_dict(measured), memory, peak, run.backend)),
        operations=None if operations is None else OperationProfile.from_dict(operations))


@dataclass(frozen=True)
class RunListing:
    """One line of the list of stored runs: what the CLI's `runs` prints and the Runs page
    shows."""

    id: int
    name: str | None
    created: str  # local time, "YYYY-MM-DD HH:MM:SS"
    status: str
    preset: str
    batch_size: int | None
    seq_len: int | None
    precision: str | None
    gradient_checkpointing: bool | None
    grad_accum: int | None
    optim: str | None
    backend: str
    tags: list[str]
    sweep: str | None
    peak_mb: int | None
    time_s: float | None
    samples_per_second: float | None


def when(timestamp: float | None) -> str:
    """A wall-clock time as every list shows it."""
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else ""


def run_rows(store: Store, tag: str | None = None, preset: str | None = None,
             status: str | None = None) -> list[RunListing]:
    """One line per stored run (those with the tag, preset and status given), newest first."""
    rows = []
    for run in store.find_runs(tag=tag, preset=preset, status=status):
        summary = report(store, run.id, run).summary
        o = run.options
        rows.append(RunListing(
            id=run.id, name=run.name, created=when(run.created_at), status=run.status,
            preset=display_name(run.preset), batch_size=o.get("batch_size"),
            seq_len=o.get("seq_len"),
            precision=o.get("precision"), gradient_checkpointing=o.get("gradient_checkpointing"),
            grad_accum=o.get("grad_accum"), optim=o.get("optim"), backend=run.backend,
            tags=list(run.tags), sweep=run.sweep, peak_mb=summary.peak_mb, time_s=summary.time_s,
            samples_per_second=summary.samples_per_second))
    return rows
