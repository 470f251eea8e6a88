"""A model's layers repeat: the recording at its depth is the recording at four layers
extrapolated, event for event (frees in a row as a set: the allocator ends the same whatever
their order), for every tiny architecture with each feature (encoder, decoders, vision,
encoder-decoders, experts); layers that differ are traced in full; a model too deep is refused in one
line; a recording asked again comes from the disk."""

from __future__ import annotations

import dataclasses
import json

import pytest

from anatomy.analysis import models
from anatomy.analysis.options import RunOptions
from anatomy.analysis.prediction import PredictionError, layers, predict, recordings, replay
from anatomy.analysis.prediction.device_constants import DEFAULT
from anatomy.analysis.prediction.tracing.record import record
from anatomy.analysis.prediction.tracing.trainer_step import StepOptions

DEEP = 6
# Models of transformers' own defaults, made small as the coverage benchmark makes them:
# encoder-decoders, T5 (a relative attention bias in its first layer alone) and BART, and a
# mixture of experts, Mixtral (its routing decided by the values, tracing/values.py).
FROM_DEFAULTS = ("t5", "bart", "mixtral")
SEQ2SEQ = ("t5", "bart")
# (precision, checkpointing, accumulation, optimizer, LoRA rank, kernels: the CUDA emulation's
# or the CPU's, whose activations are what autograd saved)
CASES = [
    ("fp32", False, 1, "adamw_torch", 0, "cpu"),
    ("bf16", True, 2, "adamw_torch_fused", 0, "cuda"),
    ("bf16", False, 1, "sgd", 4, "cuda"),
    ("fp32", True, 3, "adafactor", 4, "cpu"),
    ("bf16", False, 2, "rmsprop", 0, "cuda"),
    ("fp32", False, 1, "adagrad", 0, "cuda"),
]
# Where the template's events differ from the next layer's (DepthError), and the prediction
# traces in full: T5 checkpointed (its first layer's position bias, an input of every later
# layer, takes their gradients in turn; the second layer's recomputation frees in another order)
TRACED_IN_FULL = {("t5", True)}


def at_depth(name: str, layers_: int) -> models.ModelSpec:
    """A preset, or a model of FROM_DEFAULTS, at `layers_` layers in each stack."""
    if name in FROM_DEFAULTS:
        from bench.architectures import architectures, small_config

        config = small_config(name, dict(architectures())[name])
        spec = models.ModelSpec(name, "config file", config)
    else:
        spec = models.resolve(name)
    return dataclasses.replace(spec, config=layers.with_depth(dict(spec.config), layers_))


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


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-vit",
                                  *FROM_DEFAULTS])
def test_a_deep_recording_is_the_shallow_one_extrapolated_event_for_event(name, case):
    """An encoder (BERT), decoders (GPT-2, Llama, Qwen2), a vision model (ViT), encoder-decoders
    (T5, BART), a mixture of experts (Mixtral), each with every feature of the exactness tests
    (tests/unit/test_prediction.py): the recording at DEEP layers and the one at four
    extrapolated are the same events, the same counts (autograd's saved storages too: the CPU's
    activations) and the same replay; where the layers' events differ (TRACED_IN_FULL), the
    prediction's own path is the full trace."""
    precision, checkpointing, accumulation, optim, rank, kernels = case
    step = StepOptions(precision, checkpointing, accumulation, optim, 2,
                       0 if name == "tiny-vit" else 16)
    kwargs = dict(kernels=kernels, calibration=DEFAULT, steps=3, lora_rank=rank)
    shallow = record(at_depth(name, layers.DEPTH), step, layers=True, **kwargs)
    full = record(at_depth(name, DEEP), step, **kwargs)
    if (name, checkpointing) in TRACED_IN_FULL:
        with pytest.raises(layers.DepthError):
            layers.extrapolate(shallow, DEEP)
        traced = recordings.trace(at_depth(name, DEEP), dataclasses.astuple(step),
                                  device=kernels, calibration=DEFAULT, steps=3, lora_rank=rank)
        assert canonical(traced) == canonical(full)  # the prediction's own path: in full
        return
    extrapolated = layers.extrapolate(shallow, DEEP)
    assert canonical(extrapolated) == canonical(full)
    steps = replay.stream(extrapolated, 3, accumulation), replay.stream(full, 3, accumulation)
    a, b = (replay.measure(s, cuda=kernels == "cuda") for s in steps)
    assert (a.peak_allocated, a.peak_reserved, a.peaks_by_stretch) == \
        (b.peak_allocated, b.peak_reserved, b.peaks_by_stretch)


def test_at_its_own_depth_the_extrapolation_is_the_recording():
    step = StepOptions("bf16", False, 1, "adamw_torch", 2, 16)
    shallow = record(at_depth("tiny-llama", layers.DEPTH), step, layers=True, steps=3,
                     calibration=DEFAULT)
    assert canonical(layers.extrapolate(shallow, layers.DEPTH)) == canonical(shallow)


def test_layers_that_differ_are_traced_in_full(monkeypatch):
    """Qwen2 with a sliding window from its third layer on: its layers are not all alike."""
    spec = at_depth("tiny-qwen2", 6)
    spec = dataclasses.replace(spec, config={**spec.config, "use_sliding_window": True,
                                             "sliding_window": 8, "max_window_layers": 2})
    assert not recordings._repeats(spec, 6, 0, ())
    assert recordings._repeats(at_depth("tiny-qwen2", 6), 6, 0, ())
    extrapolated = []
    monkeypatch.setattr(layers, "extrapolate", lambda *a: extrapolated.append(a))
    recordings.trace(spec, ("bf16", False, 1, "adamw_torch", 2, 16), device="cuda",
                     calibration=DEFAULT, steps=2)
    assert extrapolated == []


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_an_encoder_decoders_layers_repeat_both_stacks(name):
    """Each stack's layers after its first the same: T5's and BART's are extrapolated."""
    assert recordings._repeats(at_depth(name, DEEP), DEEP, 0, ())


def test_a_model_too_deep_is_refused_in_one_line_at_once(tmp_path):
    config = dict(models.resolve("tiny-llama").config, num_hidden_layers=1_000_000)
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(config))
    with pytest.raises(PredictionError, match="1,000,000 layers") as refused:
        predict(RunOptions(model=str(path), seq_len=16, batch_size=2), device="cuda")
    assert "\n" not in str(refused.value)


def test_a_recording_asked_again_comes_from_the_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(recordings.CACHE_ENV, str(tmp_path))
    spec = models.resolve("tiny-gpt2")
    step = ("fp32", False, 1, "sgd", 2, 8)
    first = recordings.recording(spec, step, device="cpu", calibration=None, steps=2)
    assert len(list(tmp_path.glob("*.recording"))) == 1
    monkeypatch.setattr(recordings, "trace", lambda *a, **k: pytest.fail("traced again"))
    again = recordings.recording(spec, step, device="cpu", calibration=None, steps=2)
    assert canonical(again) == canonical(first)
    other = dataclasses.replace(spec, config={**spec.config, "n_embd": 32})  # same name
    monkeypatch.undo()
    monkeypatch.setenv(recordings.CACHE_ENV, str(tmp_path))
    recordings.recording(other, step, device="cpu", calibration=None, steps=2)
    assert len(list(tmp_path.glob("*.recording"))) == 2  # the config, not its name, keys it
