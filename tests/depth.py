"""What the depth extrapolation's tests share (tests/e2e/test_depth.py, the checks of its parts;
tests/e2e/test_depth_extrapolation.py, the proof on full traces): a model at a chosen depth, and
a recording as the replay reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from anatomy.analysis import models
from anatomy.prediction import replay

DEEP = 6
# Models of transformers' own defaults, made small as the coverage benchmark makes them:
# encoder-decoders, T5 (a relative attention bias in its first layer alone) and BART, and a
# mixture of experts, Mixtral (its routing decided by the values, tracing/values.py).
FROM_DEFAULTS = ("t5", "bart", "mixtral")


# Small sizes for a config saved by transformers' own save_pretrained (`saved`).
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=1000, max_position_embeddings=512)


def saved(folder: Path, model_type: str, **settings) -> Path:
    """A model folder as a user has one: the config class of `model_type` made with SMALL's
    sizes (those it takes) and `settings`, written by `save_pretrained` (its per-layer lists
    written out, one entry per layer)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    known = CONFIG_MAPPING[model_type]().to_dict()
    sizes = {k: v for k, v in SMALL.items() if k in known}
    AutoConfig.for_model(model_type, **{**sizes, **settings}).save_pretrained(folder)
    return folder


def at_depth(name: str, layers_: int) -> models.ModelSpec:
    """A preset, or a model of FROM_DEFAULTS, at `layers_` layers in each stack."""
    if name in FROM_DEFAULTS:
        from bench.architectures import architectures, small_config

        config = small_config(name, dict(architectures())[name])
        spec = models.ModelSpec(name, "config file", config)
    else:
        spec = models.resolve(name)
    return dataclasses.replace(spec, config={**spec.config, **{
        key: layers_ for key in models.LAYER_KEYS
        if isinstance(spec.config.get(key), int) and not isinstance(spec.config.get(key), bool)}})


def canonical(recording: replay.Recording) -> dict:
    """The recording as the replay reads it: storages named by order of allocation (a later
    step's gradients by their first step's), frees of storages made between the parts all
    alike, each run of frees in a row as a set."""
    names: dict[int, object] = {}
    events = [e for start, end in sorted(recording.segments.values())
              for e in recording.events[start:end]]
    for kind, tid, _ in events:
        if kind == replay.ALLOC:
            names.setdefault(tid, len(names))
    for i, later in recording.grads_later.items():
        names.setdefault(later, ("later", names.get(recording.grads_first.get(i))))
    out, frees = [], []
    for kind, tid, value in events + [(replay.MARK, 0, None)]:
        if kind == replay.FREE:
            frees.append(repr(names.get(tid, "made between the parts")))
            continue
        out += sorted(frees)
        frees = []
        out.append((kind, names.get(tid), value) if kind == replay.ALLOC else (kind, value))
    return {"events": out[:-1],
            "segments": {n: e - s for n, (s, e) in recording.segments.items()},
            "persistent": sorted(names[t] for t in recording.persistent),
            "batches": [names[t] for t in recording.batch_tids],
            "gradients": sorted((names[t], repr(names.get(recording.grads_later.get(i))))
                                for i, t in recording.grads_first.items()),
            "counts": (recording.parameters, recording.trainable_parameters,
                       recording.weights_bytes, recording.gradient_bytes,
                       recording.optimizer_state_bytes, recording.saved_bytes)}
