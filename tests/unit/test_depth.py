"""A model's layers repeat: at its own depth the extrapolation is the recording; layers that
differ are traced in full; both stacks of an encoder-decoder repeat; a model too deep is refused
in one line; a recording asked again comes from the disk. (The extrapolation held to full traces
of six layers, event for event, for every architecture and feature: a proof of whole traces,
tests/e2e/test_depth_extrapolation.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from anatomy.analysis import models
from anatomy.analysis.cache import CACHE_ENV
from anatomy.analysis.options import RunOptions
from anatomy.analysis.prediction import PredictionError, layers, predict, recordings
from anatomy.analysis.prediction.device_constants import DEFAULT
from anatomy.analysis.prediction.tracing.record import record
from anatomy.analysis.prediction.tracing.trainer_step import StepOptions
from tests.depth import DEEP, at_depth, canonical

SEQ2SEQ = ("t5", "bart")


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
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    spec = models.resolve("tiny-gpt2")
    step = ("fp32", False, 1, "sgd", 2, 8)
    first = recordings.recording(spec, step, device="cpu", calibration=None, steps=2)
    assert len(list(tmp_path.glob("*.recording"))) == 1
    monkeypatch.setattr(recordings, "trace", lambda *a, **k: pytest.fail("traced again"))
    again = recordings.recording(spec, step, device="cpu", calibration=None, steps=2)
    assert canonical(again) == canonical(first)
    other = dataclasses.replace(spec, config={**spec.config, "n_embd": 32})  # same name
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    recordings.recording(other, step, device="cpu", calibration=None, steps=2)
    assert len(list(tmp_path.glob("*.recording"))) == 2  # the config, not its name, keys it
