"""How long a run should take, before it starts: its steps × a measured time a step, plus the
time before training begins (loading torch and the model).

The time a step comes from the most alike run stored on this kind of device with as many
training processes (the same options if there is one, else the same model scaled by the tokens a
step trains; the estimate names every option in which it differs), else from a reference run of
the model measured on a named kind of machine. The live page replaces the estimate with the run's
own steps as soon as it has some (`views.live.progress`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from anatomy.analysis.lengths import Lengths, typical_batch
from anatomy.analysis.options import FIELDS, RunOptions
from anatomy.store import RunRow, Store, TrainingData
from anatomy.vocabulary import Backend, Phase, Status


class Reference(NamedTuple):
    """A model's time a step on one kind of device, measured: a fixed part (the Trainer's own
    work, the optimizer step) and a part per token trained; and the seconds before training."""
    step_s: float  # the fixed part
    token_s: float  # seconds per token of a step (batch size × seq len × accumulation)
    setup_s: float
    where: str  # what was measured, in the words of someone who never saw that machine

    def step(self, tokens: int) -> float:
        return self.step_s + self.token_s * tokens


# (preset, backend): docs/BENCHMARKS.md, "Run time", says how each was measured.
REFERENCES = {
    ("tiny", Backend.CPU_RSS): Reference(0.73, 6.7e-4, 14.0,
                                         "the tiny model measured on a busy 2-core CPU without a "
                                         "GPU"),
    ("bert-large-uncased", Backend.NVML): Reference(0.067, 2.6e-5, 18.4,
                                                    "bert-large measured on an NVIDIA H200"),
}
# Options that change the time a step beyond its token count: only a run with the same values
# (and as many training processes) is scaled from.
SAME_KIND = ("precision", "gradient_checkpointing", "optim", "strategy", "lora_rank",
             "lora_targets")


@dataclass(frozen=True)
class DurationEstimate:
    steps: int
    step_s: float | None  # None: nothing measured to go on
    setup_s: float | None
    basis: str  # what the time a step was measured on, in words

    @property
    def total_s(self) -> float | None:
        if self.step_s is None:
            return None
        return (self.setup_s or 0.0) + self.steps * self.step_s

    def line(self) -> str:
        """The sentence the run form shows."""
        if self.step_s is None:
            why = self.basis or "no run of this model was measured on this device yet"
            return f"{_steps(self.steps)}; {why}: the first steps will tell how long it takes"
        # Three figures, in plain digits: 1.41e+03 s is 1,410 s.
        step = f"{self.step_s:,.0f}" if self.step_s >= 100 else f"{self.step_s:.3g}"
        return (f"about {words(self.total_s)}: {_steps(self.steps)} × {step} s a "
                f"step ({self.basis}), plus {words(self.setup_s or 0.0)} to load torch and "
                "the model; refined from the run's own steps once it trains")


def _steps(count: int) -> str:
    return f"{count:,} step" + ("" if count == 1 else "s")


def words(seconds: float) -> str:
    """A duration as the form and the progress bar say it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def _tokens(options: RunOptions, data: TrainingData | None = None) -> int:
    """Tokens a step trains: a run on a dataset (`data`, its lengths) at its typical batch's
    padded length (analysis/lengths.py), not the sequence length it ignores."""
    length = options.seq_len
    if options.on_dataset and data is not None and data.lengths:
        length = typical_batch(Lengths(data.lengths), options.batch_size,
                               data.padding or options.padding, data.max_length or 0).padded_to
    return options.batch_size * length * options.grad_accum


def _step_time(run: RunRow) -> float | None:
    time_s, steps = run.summary.time_s, run.summary.steps
    return time_s / steps if time_s and steps else None


def estimate(store: Store, options: RunOptions, backend: str, device_name: str | None,
             data: TrainingData | None = None) -> DurationEstimate:
    """The estimate for a run with `options` on this device (`backend`, and the GPU's name),
    from the runs of its model stored here that trained until they ended or were stopped (a
    stopped run's time is its steps'); `data`: the dataset it trains on, read (its texts'
    lengths and count)."""
    options = options.located()  # as a run stores them
    runs = [run for run in store.find_runs(preset=options.preset)
            if run.status in (Status.COMPLETED, Status.STOPPED)]
    return estimate_from(runs, options, backend, device_name, store, data)


def estimate_from(runs: list[RunRow], options: RunOptions, backend: str, device_name: str | None,
                  store: Store | None = None, data: TrainingData | None = None
                  ) -> DurationEstimate:
    """`estimate` from these runs (newest first); `store` gives a run's training start."""
    if options.on_dataset and data is not None and data.lengths:
        options = options.with_texts(Lengths(data.lengths).texts)  # its steps are its texts'
    tokens = _tokens(options, data)
    steps = options.total_steps()
    alike, unlike = [], set()
    for run in runs:
        if run.backend != backend or run.environment.gpu_name != device_name:
            continue
        step_s = _step_time(run)
        if step_s is None:
            continue
        ran = RunOptions.from_dict(run.options)
        kinds = _other_kind(ran, options)
        if kinds:
            unlike.update(kinds)
            continue
        alike.append((run, ran, step_s, _tokens(ran, run.environment.data)))
    reference = REFERENCES.get((options.preset, backend))
    if alike:
        # The same options first, then the same tokens a step, then the newest.
        run, ran, step_s, theirs = min(alike, key=lambda a: (bool(_differences(a[1], options)),
                                                             a[3] != tokens))
        training = next((p for p in (store.phases(run.id) if store else ())
                         if p.name == Phase.TRAINING), None)
        # Scaled as the reference's fixed and per-token parts say; without one, by the tokens.
        scale = (reference.step(tokens) / reference.step(theirs) if reference
                 else tokens / theirs)
        return DurationEstimate(steps, step_s * scale, training.start_s if training else None,
                                _basis(run.id, ran, options, theirs != tokens))
    # Why no stored run is the basis: none of this model, or those stored ran another kind.
    stored = (f"the runs of it stored here differ in {', '.join(sorted(unlike))}" if unlike
              else "no run of it is stored here yet")
    if reference is None:
        return DurationEstimate(steps, None, None, stored if unlike else "")
    # The references trained one process: several on the same machine share it.
    where = reference.where + ("" if options.world_size == 1 else
                               f"; one process there, {options.world_size} here")
    return DurationEstimate(steps, reference.step(tokens), reference.setup_s,
                            f"{where}; {stored}")


def _other_kind(ran: RunOptions, options: RunOptions) -> list[str]:
    """What makes a stored run's time a step another kind than this one's (none: it scales by
    the tokens), in the form's words."""
    kinds = ["processes"] if ran.world_size != options.world_size else []
    return kinds + [FIELDS[n].label.lower() for n in SAME_KIND
                    if getattr(ran, n) != getattr(options, n)]


def _differences(ran: RunOptions, options: RunOptions) -> list[str]:
    """The options in which a stored run differs from this one, in words: "dataset size 32 (here
    512)". Its sampling and its GPU's index are left out: neither changes how long it trains;
    so is what either run ignores (a dataset's run its sequence length: its texts decide)."""
    found = []
    for name, field in FIELDS.items():
        if name in ("sample_rate", "gpu", "gpus"):  # gpus: the world size is the same
            continue
        if not (ran.applies(name) and options.applies(name)):
            continue
        theirs, ours = getattr(ran, name), getattr(options, name)
        if theirs != ours:
            found.append(f"{field.label.lower()} {_value(theirs)} (here {_value(ours)})")
    return found


def _value(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "not set" if value is None or value == "" else str(value)


def _basis(run_id: int, ran: RunOptions, options: RunOptions, rescaled: bool) -> str:
    """What the time a step was measured on: the stored run, and how it differs from this one
    (`rescaled`: in the tokens a step trains)."""
    differences = _differences(ran, options)
    if not differences:
        return f"run {run_id}, the same options"
    scaled = ", scaled to this step's tokens" if rescaled else ""
    return f"run {run_id}, which had {', '.join(differences)}{scaled}"
