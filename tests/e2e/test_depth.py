"""A model's layers repeat: at its own depth the extrapolation is the recording; layers that
repeat too seldom are traced in full, first layers of their own as they are; both stacks of an
encoder-decoder repeat; a config saved by transformers at its real depth (per-layer lists,
patterns of layers, a backbone's stages) predicts from a stand-in cut to the layers traced; only
the gradients the trace saw are extrapolated; a model too deep is refused in one line; a
recording asked again comes from the disk. Each traces a model of a few layers (seconds on a
CPU): the e2e tier's, not the edit loop's. (The extrapolation held to full traces
of six layers, event for event, for every architecture and feature: a proof of whole traces,
tests/e2e/test_depth_extrapolation.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from anatomy.analysis import models
from anatomy.analysis.cache import CACHE_ENV
from anatomy.analysis.options import RunOptions
from anatomy.cli import main
from anatomy.prediction import PredictionError, blocks, layers, predict, recordings, replay
from anatomy.prediction.device_constants import DEFAULT
from anatomy.prediction.tracing.record import record
from anatomy.prediction.tracing.trainer_step import StepOptions
from tests.depth import DEEP, at_depth, canonical, saved

SEQ2SEQ = ("t5", "bart")


def test_at_its_own_depth_the_extrapolation_is_the_recording():
    step = StepOptions("bf16", False, 1, "adamw_torch", 2, 16)
    shallow = record(at_depth("tiny-llama", layers.DEPTH), step, blocks=(0, 1, 2, 3), steps=3,
                     calibration=DEFAULT)
    assert canonical(layers.extrapolate(shallow, layers.DEPTH)) == canonical(shallow)


def _sliding_from(layer: int, layers_: int = 6) -> models.ModelSpec:
    """tiny-qwen2 with a sliding window from layer `layer` on."""
    spec = at_depth("tiny-qwen2", layers_)
    return dataclasses.replace(spec, config={**spec.config, "use_sliding_window": True,
                                             "sliding_window": 8, "max_window_layers": layer})


def test_layers_that_repeat_too_seldom_are_traced_in_full(monkeypatch):
    """Qwen2 with a sliding window from its fourth layer on, six layers: three full-attention
    layers, then three alike, too few to trace fewer."""
    spec = _sliding_from(3)
    assert recordings.stand_in(spec) is None
    extrapolated = []
    monkeypatch.setattr(layers, "extrapolate", lambda *a: extrapolated.append(a))
    recordings.trace(spec, StepOptions("bf16", False, 1, "adamw_torch", 2, 16), device="cuda",
                     calibration=DEFAULT, steps=2)
    assert extrapolated == []


def test_first_layers_of_their_own_are_traced_as_they_are():
    """Qwen2 with a sliding window from its third layer on: its first two layers (full
    attention) are the first block, then the sliding layers repeat."""
    shallow, repeats, _ = recordings.stand_in(_sliding_from(2, 8))
    assert (repeats.first, repeats.period, repeats.kept) == (2, 1, [0, 1, 2, 3, 7])
    assert repeats.traced == (0, 0, 1, 2, 3) and repeats.count == 7
    assert shallow.config["num_hidden_layers"] == 5


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_an_encoder_decoders_layers_repeat_both_stacks(name):
    """Each stack's layers after its first the same: T5's and BART's are extrapolated."""
    _, repeats, _ = recordings.stand_in(at_depth(name, DEEP))
    assert repeats.kept == [0, 1, 2, DEEP - 1]


# --- configs as transformers' save_pretrained writes them, at their real depth ---

@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_a_config_saved_at_24_layers_predicts_from_four(model_type, tmp_path, capsys):
    """save_pretrained writes Qwen's layer_types, one entry per layer: the stand-in traced at
    four layers has four (the config class refused 4 layers with 24 layer types, and `predict`
    exited 2 where `run` trained)."""
    folder = saved(tmp_path / model_type, model_type, num_hidden_layers=24)
    assert len(json.loads((folder / "config.json").read_text())["layer_types"]) == 24
    shallow, repeats, _ = recordings.stand_in(models.resolve(str(folder)))
    assert repeats.kept == [0, 1, 2, 23] and repeats.count == 24
    assert shallow.config["layer_types"] == ["full_attention"] * 4
    assert main(["predict", "--model", str(folder), "--device", "cpu", "--seq-len", "16",
                 "--batch-size", "2"]) == 0
    assert "peak" in capsys.readouterr().out


def test_a_config_its_class_refuses_is_refused_alike_by_predict_and_run(tmp_path, capsys):
    """24 layers and 23 layer types: the config's own refusal, in the same line from `predict`
    and `run` (the stand-in's 4 layers are never what is refused)."""
    folder = saved(tmp_path / "qwen2", "qwen2", num_hidden_layers=24)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config,
                                                    "layer_types": config["layer_types"][1:]}))
    assert main(["predict", "--model", str(folder), "--device", "cpu"]) == 2
    predicted = capsys.readouterr().err
    assert main(["run", "--model", str(folder), "--store", str(tmp_path / "runs.db")]) == 2
    assert capsys.readouterr().err == predicted
    assert predicted.count("\n") == 1 and "(24) must be equal to the number of `layer_types` (23)" \
        in predicted


@pytest.mark.parametrize("pattern", [
    ["sliding_attention"] * 3 + ["full_attention"],  # a full-attention layer every fourth
    ["sliding_attention"] * 5 + ["full_attention"],  # Gemma 3's five to one
    ["sliding_attention", "full_attention"]],  # Gemma 2's, GPT-OSS's in turn
    ids=["every-4th", "gemma3", "alternating"])
def test_a_periodic_layer_pattern_keeps_its_period(pattern):
    """Gemma 3 27B's 62 layers: the stand-in keeps the first layer, two periods, the last
    period and what follows it; every per-layer field cut to the same layers (a list per layer,
    a mapping by layer index, a list of layer indices, a layer naming the layer it reads)."""
    period, depth = len(pattern), 62
    types = (pattern * depth)[:depth]
    config = {"num_hidden_layers": depth, "layer_types": types,
              "mlp_layer_types": ["dense"] + ["sparse"] * (depth - 1),
              "per_layer_config": {str(i): {"head_dim": 32} for i, t in enumerate(types)
                                   if t == "full_attention"},
              "moe_layers": list(range(1, depth)), "kv_source_layers": list(range(depth)),
              "id2label": {str(i): f"LABEL_{i}" for i in range(depth)}}
    repeats = blocks.find(depth, lambda i, j: types[i] == types[j] and (i == 0) == (j == 0))
    assert repeats.period == period and repeats.first == 1
    shallow = blocks.at_traced_depth(config, repeats.kept)
    traced = shallow["layer_types"]
    assert traced == [types[i] for i in repeats.kept] and len(traced) < depth
    assert traced[1:1 + period] == traced[1 + period:1 + 2 * period] == types[1:1 + period]
    assert shallow["num_hidden_layers"] == len(traced) == len(shallow["mlp_layer_types"])
    assert sorted(map(int, shallow["per_layer_config"])) == \
        [i for i, t in enumerate(traced) if t == "full_attention"]
    assert shallow["moe_layers"] == list(range(1, len(traced)))
    assert shallow["kv_source_layers"] == list(range(len(traced)))
    assert shallow["id2label"] == config["id2label"]  # labels are no layers


def test_a_saved_alternating_pattern_is_traced_a_period_at_a_time(tmp_path):
    """Gemma 2 saved at 12 layers, sliding and full attention in turn: two layers a block."""
    folder = saved(tmp_path / "gemma2", "gemma2", num_hidden_layers=12)
    shallow, repeats, _ = recordings.stand_in(models.resolve(str(folder)))
    assert (repeats.first, repeats.period, repeats.tail, repeats.count) == (1, 2, 1, 6)
    assert shallow.config["layer_types"] == ["sliding_attention", "full_attention"] * 4


def test_a_backbones_stage_names_follow_the_layers_kept(tmp_path, capsys):
    """DINOv2 saved at 12 layers names its stages ("stem", "stage1" … "stage12") and the ones
    it puts out: the stand-in keeps the stages of the layers kept, and predicts."""
    folder = saved(tmp_path / "dinov2", "dinov2", num_hidden_layers=12, image_size=32,
                   patch_size=8, out_indices=[3, 6, 9, 12])
    assert len(json.loads((folder / "config.json").read_text())["stage_names"]) == 13
    shallow, repeats, _ = recordings.stand_in(models.resolve(str(folder)))
    assert repeats.kept == [0, 1, 2, 11]
    assert "stage_names" not in shallow.config and shallow.config["out_indices"] == [3, 4]
    assert main(["predict", "--model", str(folder), "--device", "cpu", "--batch-size", "2"]) == 0


def test_only_the_gradients_the_trace_saw_are_extrapolated(tmp_path):
    """LED without global attention: its layers' global-attention projections get no gradient
    (and no optimizer state). The prediction's gradients are those its own steps allocate, less
    than its trainable weights (they were counted for every layer added: (layers - 4) × the
    projections too many, while the states were right); the full trace's too: tests/e2e/
    test_depth_extrapolation.py."""
    folder = saved(tmp_path / "led", "led", d_model=16, encoder_layers=6, decoder_layers=6,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                   decoder_ffn_dim=32, vocab_size=128, max_encoder_position_embeddings=64,
                   max_decoder_position_embeddings=64, attention_window=4)
    spec = models.resolve(str(folder))
    step = StepOptions("fp32", False, 1, "adamw_torch", 2, 16)
    recording = recordings.trace(spec, step, device="cpu", calibration=None, steps=2)
    assert recording.depth == 6 and recording.per_layer  # extrapolated from four
    sizes = {tid: size for kind, tid, size in recording.events if kind == replay.ALLOC}
    made = sum(sizes[tid] for tid in recording.grads_first.values())
    assert recording.gradient_bytes == made < recording.weights_bytes
    assert recording.optimizer_state_bytes == 2 * made  # AdamW's, where a gradient came


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
    step = StepOptions("fp32", False, 1, "sgd", 2, 8)
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


def test_a_model_folder_of_the_local_hub_cache_predicts_as_its_config(tmp_path, monkeypatch):
    """The Hub cache as huggingface_hub lays it out (the config a blob, linked from the
    revision's snapshot; refs/main naming the revision): the model's id, its snapshot's folder
    and its folder in the cache predict what the config.json copied elsewhere predicts."""
    import shutil

    import huggingface_hub.constants as constants

    saved_at = saved(tmp_path / "saved", "qwen2", num_hidden_layers=8)
    repository = tmp_path / "hub" / "models--someone--deep-qwen"
    (repository / "blobs").mkdir(parents=True)
    shutil.copy(saved_at / "config.json", repository / "blobs" / "0a1b2c")
    snapshot = repository / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("..", "..", "blobs", "0a1b2c"))
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def predicted(model: str):
        return predict(RunOptions(model=model, seq_len=16, batch_size=2), device="cpu")

    alone = predicted(str(saved_at / "config.json"))
    for model in ("someone/deep-qwen", str(snapshot), str(repository)):
        assert models.display_name(model) == "someone/deep-qwen"
        assert predicted(model) == alone


def test_a_layer_whose_pass_did_not_end_is_left_at_the_next_mark():
    """Activation checkpointing stops a layer's recomputation early (torch's
    _StopRecomputationError), before its forward hook: under torch 2.11 the layer stayed
    "running" through the optimizer step, whose temporaries were then tagged as that layer's and
    not extrapolated (tinyllama-1.1b, bf16 weights, checkpointing: 693 MB of the optimizer's
    2,277 MB predicted, its peak 14 % low on an H100). A tracer's mark falls between layers'
    passes: no layer runs past it."""
    import torch

    from anatomy.prediction.tracing.depth import LayerTags
    from anatomy.prediction.tracing.tracker import Timeline

    class Stops(torch.nn.Linear):
        def forward(self, x):
            raise RuntimeError("stopped early, as a recomputation is")

    layers = torch.nn.ModuleList([Stops(2, 2), Stops(2, 2)])
    tags = LayerTags()
    tags.install([layers], (0, 1))
    timeline = Timeline()
    timeline.layers = tags
    with pytest.raises(RuntimeError):
        layers[1](torch.ones(2))
    assert tags.now() == (0, 1)  # its forward hook never came
    timeline.mark("backward ends")
    assert tags.now() is None
    assert tags.derived(torch.ops.aten.sqrt.default, (torch.ones(2),), {}, torch.ones(2),
                        lambda t: None) is not None  # outside any layer: tagged by its inputs
