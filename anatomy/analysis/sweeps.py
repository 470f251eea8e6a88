"""Sweeps on paper: one base configuration, one or two options varied. `plan` checks every planned
option set before anything starts; `grid` turns a sweep's stored runs into the table of peak
memory, speed and the largest batch size that fit. The engine's `Sweep` (anatomy/engine/sweep.py)
runs a plan.

Batch sizes form a ladder: they run smallest first, and at a ladder's first out-of-memory run its
larger batch sizes are skipped (they would not fit either). With `until_oom`, a ladder that runs
out of planned sizes keeps doubling until a run is out of memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from anatomy.analysis.options import FIELDS, Checked, InvalidOptions, Kind, RunOptions, validated
from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.vocabulary import Status

LADDER = "batch_size"
MAX_VARIED = 2
FLAG_WORDS = {"on": True, "true": True, "yes": True, "1": True,
              "off": False, "false": False, "no": False, "0": False}

# What a sweep may vary: every option but the GPU list (its commas are the values' separator;
# a sweep of 1 vs 2 GPUs is two runs, compared side by side).
VARIABLE = tuple(name for name in FIELDS if name != "gpus")


def parse_value(name: str, text: str) -> Any:
    """One value of an option as typed (`--vary`): flags take on/off/true/false, numbers whole
    numbers (a share any number: a dropout), choices their names (checked against their range
    by `plan`)."""
    field = FIELDS[name]
    text = text.strip()
    dashed = name.replace("_", "-")
    if field.kind in (Kind.CHOICE, Kind.TEXT, Kind.LIST):
        return text
    if field.kind == Kind.FLAG:
        if text.lower() not in FLAG_WORDS:
            raise ValueError(f"{dashed}: {text!r} is not on, off, true or false")
        return FLAG_WORDS[text.lower()]
    try:
        return int(text) if field.whole else float(text)
    except ValueError:
        raise ValueError(f"{dashed}: {text!r} is not a "
                         f"{'whole number' if field.whole else 'number'}") from None


def parse_values(name: str, text: str) -> list:
    """An option's values as typed, comma-separated (`--vary`, the Compare page's sweep form):
    a list's empty item is a value of its own (nothing frozen, LoRA's default targets:
    `,model.embed_tokens`), another option's a stray comma. ValueError naming a wrong one."""
    keep_empty = FIELDS[name].kind == Kind.LIST
    return [parse_value(name, v) for v in text.split(",") if v.strip() or keep_empty]


def shown_value(name: str, value: Any) -> Any:
    """A varied option's value as a sweep's lines and tables show it: a list's names
    comma-separated, an empty one as what it means ("none" frozen, "the architecture's" LoRA
    targets); another option's as it is."""
    field = FIELDS[name]
    if field.kind != Kind.LIST:
        return value
    names = value.split(",") if isinstance(value, str) else list(value or ())
    return ",".join(n for n in names if n) or field.unset or "none"


def parse_vary(specs: list[str]) -> dict[str, list]:
    """`["batch-size=1,2,4", "precision=fp32,bf16"]` -> {"batch_size": [1, 2, 4], ...}; a
    list's values are one name each, its empty one none (`frozen=,lm_head`).

    InvalidOptions with a message per wrong spec."""
    vary: dict[str, list] = {}
    errors: dict[str, str] = {}
    for spec in specs:
        option, equals, values = spec.partition("=")
        name = option.strip().replace("-", "_")
        if not equals or not values.strip():
            errors[spec] = f"--vary {spec}: write OPTION=V1,V2,… (e.g. batch-size=1,2,4)"
        elif name not in VARIABLE:
            errors[spec] = (f"--vary {spec}: {option.strip()!r} is not an option (one of "
                            f"{', '.join(n.replace('_', '-') for n in VARIABLE)})")
        elif name in vary:
            errors[spec] = f"--vary {spec}: {option.strip()} is varied twice"
        else:
            try:
                vary[name] = parse_values(name, values)
            except ValueError as error:
                errors[spec] = str(error)
    if errors:
        raise InvalidOptions(errors)
    return vary


def plan(base: RunOptions | Mapping[str, Any], vary: dict[str, list], until_oom: bool,
         gpu_count: int) -> list[Checked]:
    """Every run of the sweep (the cartesian product of the varied values over the `base` values),
    each judged once as a run would be: InvalidOptions, with one message per wrong option, before
    anything starts."""
    errors: dict[str, str] = {}
    if not vary:
        errors["vary"] = "vary: choose one or two options to vary"
    elif len(vary) > MAX_VARIED:
        errors["vary"] = (f"vary: at most {MAX_VARIED} options, got {len(vary)}: "
                          f"{', '.join(n.replace('_', '-') for n in vary)}")
    for name, values in vary.items():
        if name not in VARIABLE:
            errors[name] = f"{name}: not an option (one of {', '.join(VARIABLE)})"
        elif not values:
            errors[name] = f"{name}: no values to try"
    if until_oom and LADDER not in vary:
        errors["until_oom"] = "until_oom: needs batch_size among the varied options (its ladder)"
    if errors:
        raise InvalidOptions(errors)
    vary = ordered(vary)
    values = base.to_dict() if isinstance(base, RunOptions) else dict(base)
    planned = []
    for varied in itertools.product(*vary.values()):
        try:
            planned.append(validated({**values, **dict(zip(vary, varied))}, gpu_count))
        except InvalidOptions as error:
            for name, message in error.errors.items():
                errors.setdefault(name, message)
    if errors:
        raise InvalidOptions(errors)
    return planned


def ladders(planned: list[Checked]) -> list[list[Checked]]:
    """Consecutive runs that differ only in batch size (one run each when it is not varied)."""
    return [list(group) for _, group in itertools.groupby(
        planned, key=lambda run: replace(run.options, batch_size=1))]


def ordered(vary: dict[str, list]) -> dict[str, list]:
    """Each option's values once; batch sizes smallest first (a ladder climbs); the ladder's
    option last, so each value of the other option gets a whole ladder."""
    out = {name: list(dict.fromkeys(values)) for name, values in vary.items()}
    if LADDER in out:
        sizes = out.pop(LADDER)
        out[LADDER] = sorted(sizes) if all(type(v) is int for v in sizes) else sizes
    return out


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep as its grid shows it."""
    run: int
    values: dict[str, Any]  # the varied options' values
    status: str
    peak_mb: int | None
    samples_per_second: float | None
    time_s: float | None


@dataclass(frozen=True)
class SweepGrid:
    """A sweep's progress and results, from the store alone."""
    sweep: int
    name: str | None
    status: str
    error: str | None
    vary: dict[str, list]
    until_oom: bool
    planned: int
    skipped: int
    runs: list[SweepRun]  # oldest first
    # The largest batch size that completed: per value of the other varied option when there are
    # two; None when batch size is not varied.
    largest_fitting: int | dict | None

    def ran_out(self, value: Any = None) -> bool:
        """Whether a batch size ran out of memory (of the ladder for `value` of the other varied
        option, when there are two)."""
        other = next((name for name in self.vary if name != LADDER), None)
        return any(r.status == Status.OOM for r in self.runs
                   if other is None or r.values.get(other) == value)

    def largest_tried(self, value: Any = None) -> int | None:
        """The largest batch size that ran (of the ladder for `value`, when there are two)."""
        other = next((name for name in self.vary if name != LADDER), None)
        return max((r.values[LADDER] for r in self.runs
                    if other is None or r.values.get(other) == value), default=None)

    def to_dict(self) -> dict[str, Any]:
        """What `sweep --json` prints."""
        return {"sweep": self.sweep, "runs": [asdict(r) for r in self.runs],
                "largest_fitting": self.largest_fitting}


def grid(store: Store, sweep_id: int) -> SweepGrid:
    """A sweep's progress and results, from the store alone."""
    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise KeyError(f"sweep {sweep_id} is not in {store.path}")
    runs = []
    for run in reversed(store.find_runs(sweep=sweep.key)):
        summary = report(store, run.id, run).summary
        runs.append(SweepRun(run=run.id, values={n: run.options.get(n) for n in sweep.vary},
                             status=run.status, peak_mb=summary.peak_mb,
                             samples_per_second=summary.samples_per_second,
                             time_s=summary.time_s))
    return SweepGrid(sweep=sweep.id, name=sweep.name, status=sweep.status, error=sweep.error,
                     vary=sweep.vary, until_oom=sweep.until_oom, planned=sweep.planned,
                     skipped=sweep.skipped, runs=runs,
                     largest_fitting=largest_fitting(sweep.vary, runs))


def largest_fitting(vary: dict[str, list], runs: list[SweepRun]) -> int | dict | None:
    if LADDER not in vary:
        return None
    other = next((name for name in vary if name != LADDER), None)

    def largest(rows: list[SweepRun]) -> int | None:
        return max((r.values[LADDER] for r in rows if r.status == Status.COMPLETED), default=None)

    if other is None:
        return largest(runs)
    return {value: largest([r for r in runs if r.values[other] == value])
            for value in vary[other]}
