"""A run's recording, as fast as it can be had: from the disk cache, else traced — at a small
depth and extrapolated (layers.py) where the model's layers repeat (blocks.py: the depth
stand-in, its config cut to the layers traced), else in full — and cached.

The cache (analysis/cache.py's folder) keeps one file per recording, named by a hash of all that
makes it: the model's config itself (not its name), the options the memory depends on, the
device's kernels and constants, the steps, the versions of torch, transformers, peft and
accelerate, and the source of the prediction and the model building (a change to either is a
new key). A recording is plain data (lists of tuples), pickled; the oldest files go beyond
CACHE_FILES. Imports no torch until something must be traced.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.cache import cache_dir, write_atomically
from anatomy.prediction import blocks, layers
from anatomy.prediction.device_constants import DeviceCalibration
from anatomy.prediction.replay import Recording
from anatomy.prediction.step import StepOptions
from anatomy.strategies import TracedRank

CACHE_FILES = 256
_SOURCES = (Path(__file__).parent, Path(models.__file__).parent, Path(strategies.__file__).parent)


@lru_cache(maxsize=1)
def _code_version() -> str:
    digest = hashlib.sha256()
    for source in _SOURCES:
        files = sorted(source.rglob("*.py")) if source.is_dir() else [source]
        for path in files:
            digest.update(path.read_bytes())
    for package in ("torch", "transformers", "peft", "accelerate"):
        try:
            digest.update(f"{package} {metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(package.encode())
    return digest.hexdigest()


def _key(spec: models.ModelSpec, step: StepOptions, device: str, calibration: DeviceCalibration | None,
         steps: int, lora_rank: int, lora_targets: tuple[str, ...], rank: TracedRank | None,
         lora_dropout: float = 0.0, weights: str = "fp32") -> str:
    made_of = {"config": spec.config, "task": spec.task, "step": repr(step), "device": device,
               "calibration": calibration.to_dict() if calibration else None, "steps": steps,
               # a dropout only where there is one: the keys of recordings without it stand
               "lora": [lora_rank, list(lora_targets)] + ([lora_dropout] if lora_dropout else []),
               "rank": list(rank) if rank else None,
               **({"weights": weights} if weights != "fp32" else {}),  # fp32's keys stand
               "code": _code_version()}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()
                          ).hexdigest()[:32]


def _read(path: Path) -> Recording | None:
    try:
        with path.open("rb") as file:
            found = pickle.load(file)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError):
        return None
    return found if isinstance(found, Recording) else None


def _write(folder: Path, path: Path, recording: Recording) -> None:
    if not write_atomically(path, pickle.dumps(recording, protocol=pickle.HIGHEST_PROTOCOL)):
        return
    try:
        kept = sorted(folder.glob("*.recording"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-CACHE_FILES]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # an old file gone meanwhile (another process pruned it)


def recording(spec: models.ModelSpec, step: StepOptions, *, device: str,
              calibration: DeviceCalibration | None, steps: int, lora_rank: int = 0,
              lora_targets: tuple[str, ...] = (), rank: TracedRank | None = None,
              workspaces=None, lora_dropout: float = 0.0, weights: str = "fp32") -> Recording:
    """The run's recording (tracing/record.py's), from the cache when it has it; `rank`: one rank's
    step under a strategy that traces it (the strategy's recording key), else one process's.
    With `workspaces` (prediction/workspaces.py's seams: this machine's measurements) traced
    anew, never cached."""
    folder = cache_dir() if workspaces is None else None
    path = None
    if folder is not None:
        key = _key(spec, step, device, calibration, steps, lora_rank, lora_targets, rank,
                   lora_dropout, weights)
        path = folder / f"{key}.recording"
        found = _read(path)
        if found is not None:
            return found
    made = trace(spec, step, device=device, calibration=calibration, steps=steps,
                 lora_rank=lora_rank, lora_targets=lora_targets, rank=rank,
                 workspaces=workspaces, lora_dropout=lora_dropout, weights=weights)
    if path is not None:
        _write(folder, path, made)
    return made


def trace(spec: models.ModelSpec, step: StepOptions, *, device: str,
          calibration: DeviceCalibration | None, steps: int, lora_rank: int = 0,
          lora_targets: tuple[str, ...] = (), rank: TracedRank | None = None,
          workspaces=None, lora_dropout: float = 0.0, weights: str = "fp32") -> Recording:
    """Traced: at four blocks of its layers and extrapolated where the model's layers repeat
    (`stand_in`; layers.extrapolate's own checks), else in full (a traced rank's step: in
    full)."""
    from anatomy.prediction.tracing.record import record

    kwargs = dict(kernels=device, calibration=calibration, steps=steps, lora_rank=lora_rank,
                  lora_targets=lora_targets, workspaces=workspaces, lora_dropout=lora_dropout,
                  weights=weights)
    found = stand_in(spec, lora_rank, lora_targets, step.frozen) if rank is None else None
    if found is not None:
        shallow, repeats, frozen = found
        try:
            return layers.extrapolate(record(shallow, replace(step, frozen=frozen),
                                             blocks=repeats.traced, **kwargs), repeats.count)
        except layers.DepthError:
            pass  # the layers do not repeat after all: traced in full
    return record(spec, step, rank=rank, **kwargs)


class StandIn(NamedTuple):
    """The model at the depth traced, how its layers repeat, and its parameters frozen, by
    their names in it (the layers kept renumbered)."""

    spec: models.ModelSpec
    repeats: blocks.Blocks
    frozen: tuple[str, ...] = ()


def stand_in(spec: models.ModelSpec, lora_rank: int = 0, lora_targets: tuple[str, ...] = (),
             frozen: tuple[str, ...] = ()) -> StandIn | None:
    """The model at the depth traced, and how its layers repeat (blocks.py); None where they
    do not repeat often enough to trace fewer. Both held to the model built on the meta device
    at its depth: how its layers repeat is what its stacks' layers and its config's per-layer
    fields say together (a frozen layer is another kind than a trained one), and the
    stand-in's layers must be the model's layers kept, the model outside them the same (else
    None: a config the stand-in cannot make is traced in full, never refused; a model that
    cannot be built at its own depth, or with `frozen`, is the config's own refusal,
    ModelError, as a run's)."""
    from anatomy.prediction.tracing import depth

    full = layers.depth_of(dict(spec.config))
    if full is None or full <= layers.DEPTH:
        return None
    model, _ = models.build_model(spec, "meta", lora_rank=lora_rank, lora_targets=lora_targets,
                                  pretrained=False, frozen=frozen)
    stacks = depth.stacks(model, full)
    if not stacks:
        return None
    signatures = [depth.signatures(stack) for stack in stacks]
    entries = blocks.per_layer(spec.config, full)
    kinds: dict[str, int] = {}  # each layer's kind: its signatures and its entries, numbered
    kind = [kinds.setdefault(repr((entries[i], [s[i] for s in signatures])), len(kinds))
            for i in range(full)]
    repeats = blocks.find(full, lambda i, j: kind[i] == kind[j])
    config = blocks.at_traced_depth(spec.config, repeats.kept) if repeats else None
    if config is None:
        return None
    shallow = replace(spec, config=config)
    try:
        built, _ = models.build_model(shallow, "meta", lora_rank=lora_rank,
                                      lora_targets=lora_targets, pretrained=False)
    except Exception:  # noqa: BLE001 - a stand-in its config class or model refuses: in full
        return None
    kept = depth.stacks(built, len(repeats.kept))
    if len(kept) != len(stacks) or _outside(built, kept) != _outside(model, stacks):
        return None
    if frozen:
        _freeze_as(built, kept, model, stacks, repeats.kept)
    for mine, theirs in zip(kept, signatures):
        if depth.signatures(mine) != [theirs[i] for i in repeats.kept]:
            return None
    return StandIn(shallow, repeats, models.frozen_names(built) if frozen else ())


def _freeze_as(built, kept, model, stacks, layers_kept: list[int]) -> None:
    """The stand-in's parameters frozen as the model's are: outside the stacks by name, in
    each stack's layers kept as the model's layer each stands for."""
    theirs = dict(model.named_parameters())
    inside = {id(p) for stack in kept for p in stack.parameters()}
    for name, mine in built.named_parameters():
        if id(mine) not in inside:
            mine.requires_grad_(theirs[name].requires_grad)
    for mine, their in zip(kept, stacks):
        for at, index in enumerate(layers_kept):
            for p, q in zip(mine[at].parameters(), their[index].parameters()):
                p.requires_grad_(q.requires_grad)


def _outside(model, stacks) -> list[tuple]:
    """The model's parameters and buffers outside its stacks of layers: names and shapes."""
    inside = {id(t) for stack in stacks for t in (*stack.parameters(), *stack.buffers())}
    return [(name, tuple(t.shape)) for name, t in (*model.named_parameters(),
                                                   *model.named_buffers())
            if id(t) not in inside]
