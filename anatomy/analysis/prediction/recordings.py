"""A run's recording, as fast as it can be had: from the disk cache, else traced — at a small
depth and extrapolated (layers.py) where the model's layers repeat, else in full — and cached.

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

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.cache import cache_dir, write_atomically
from anatomy.analysis.prediction import layers
from anatomy.analysis.prediction.device_constants import DeviceCalibration
from anatomy.analysis.prediction.replay import Recording
from anatomy.strategies import TracedRank

CACHE_FILES = 256
_SOURCES = (Path(__file__).parent, Path(models.__file__), Path(strategies.__file__).parent)


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


def _key(spec: models.ModelSpec, step, device: str, calibration: DeviceCalibration | None,
         steps: int, lora_rank: int, lora_targets: tuple[str, ...], rank: TracedRank | None
         ) -> str:
    made_of = {"config": spec.config, "task": spec.task, "step": repr(step), "device": device,
               "calibration": calibration.to_dict() if calibration else None, "steps": steps,
               "lora": [lora_rank, list(lora_targets)], "rank": list(rank) if rank else None,
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


def recording(spec: models.ModelSpec, step: tuple, *, device: str,
              calibration: DeviceCalibration | None, steps: int, lora_rank: int = 0,
              lora_targets: tuple[str, ...] = (), rank: TracedRank | None = None,
              workspaces=None) -> Recording:
    """The run's recording (tracing/record.py's), from the cache when it has it; `step`:
    tracing/trainer_step.StepOptions' fields (that module imports torch); `rank`: one rank's
    step under a strategy that traces it (the strategy's recording key), else one process's.
    With `workspaces` (prediction/workspaces.py's seams: this machine's measurements) traced
    anew, never cached."""
    folder = cache_dir() if workspaces is None else None
    path = None
    if folder is not None:
        key = _key(spec, step, device, calibration, steps, lora_rank, lora_targets, rank)
        path = folder / f"{key}.recording"
        found = _read(path)
        if found is not None:
            return found
    made = trace(spec, step, device=device, calibration=calibration, steps=steps,
                 lora_rank=lora_rank, lora_targets=lora_targets, rank=rank,
                 workspaces=workspaces)
    if path is not None:
        _write(folder, path, made)
    return made


def trace(spec: models.ModelSpec, step: tuple, *, device: str,
          calibration: DeviceCalibration | None, steps: int, lora_rank: int = 0,
          lora_targets: tuple[str, ...] = (), rank: TracedRank | None = None,
          workspaces=None) -> Recording:
    """Traced: at layers.DEPTH layers and extrapolated where the model's layers repeat (every
    layer of each stack the same, checked on the model built at its full depth, and
    layers.extrapolate's own checks), else in full (a traced rank's step: in full)."""
    from anatomy.analysis.prediction.tracing.record import record
    from anatomy.analysis.prediction.tracing.trainer_step import StepOptions

    step = StepOptions(*step)
    kwargs = dict(kernels=device, calibration=calibration, steps=steps, lora_rank=lora_rank,
                  lora_targets=lora_targets, workspaces=workspaces)
    full = layers.depth_of(dict(spec.config))
    if full is not None and full > layers.DEPTH and rank is None and \
            _repeats(spec, full, lora_rank, lora_targets):
        shallow = replace(spec, config=layers.with_depth(dict(spec.config), layers.DEPTH))
        try:
            return layers.extrapolate(record(shallow, step, layers=True, **kwargs), full)
        except layers.DepthError:
            pass  # the layers do not repeat after all: traced in full
    return record(spec, step, rank=rank, **kwargs)


def _repeats(spec: models.ModelSpec, full: int, lora_rank: int,
             lora_targets: tuple[str, ...]) -> bool:
    """Whether the model, built on the meta device at its depth, has stacks of that many
    layers, each layer the same (and as many stacks as at the traced depth)."""
    from anatomy.analysis.prediction.tracing import depth

    def stacks_at(n: int):
        shaped = replace(spec, config=layers.with_depth(dict(spec.config), n))
        model, _ = models.build_model(shaped, "meta", lora_rank=lora_rank,
                                      lora_targets=lora_targets, pretrained=False)
        return depth.stacks(model, n)

    found = stacks_at(full)
    return bool(found) and all(depth.uniform(s) for s in found) and \
        len(stacks_at(layers.DEPTH)) == len(found)
