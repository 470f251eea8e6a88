"""The dummy data's one layout: the run's dataset (numpy, per sample, stacked by the collator) and
the prediction's batch (torch) hand the model the same tensors, by name, shape and type, for
every kind of input (analysis/dummy_data.py)."""

from __future__ import annotations

import json

import pytest

from anatomy.analysis import dummy_data, models
from anatomy.analysis.options import RunOptions, validate
from anatomy.engine.dataset import DummyDataset
from anatomy.prediction.tracing.trainer_step import make_batch

SEQ_LEN = 24
# model type -> the inputs its forward takes besides the labels
KINDS = {
    "bert": {"input_ids"},
    "moonshine": {"input_values", "decoder_input_ids"},
    "musicgen": {"input_ids"},
    "siglip2": {"pixel_values", "pixel_attention_mask", "spatial_shapes"},
    "imagegpt": {"input_ids"},
    "git": {"input_ids", "pixel_values"},
    "voxtral_realtime": {"input_ids", "input_features"},
    "dia": {"input_ids", "decoder_input_ids"},
}


def spec_of(tmp_path, model_type: str) -> models.ModelSpec:
    from bench.architectures import architectures, small_config

    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(small_config(model_type, dict(architectures())[model_type])))
    return models.resolve(str(path))


@pytest.mark.parametrize("model_type", KINDS)
def test_the_run_and_the_prediction_make_the_same_tensors(tmp_path, model_type):
    spec = spec_of(tmp_path, model_type)
    collated = DummyDataset(spec, 4, SEQ_LEN, seed=0).batch(2)
    traced = make_batch(spec, 2, SEQ_LEN)
    assert set(collated) == set(traced) == KINDS[model_type] | {"labels"}
    for name in collated:
        assert (collated[name].shape, collated[name].dtype) == \
            (traced[name].shape, traced[name].dtype), name


def test_codebooks_raw_audio_and_patches_take_their_own_shapes(tmp_path):
    musicgen = make_batch(spec_of(tmp_path, "musicgen"), 2, SEQ_LEN)
    codebooks = musicgen["input_ids"].shape[1]
    assert codebooks > 1 and musicgen["labels"].shape == (2, SEQ_LEN, codebooks)
    assert (musicgen["labels"] == musicgen["input_ids"].transpose(1, 2)).all()
    audio = make_batch(spec_of(tmp_path, "moonshine"), 2, SEQ_LEN)
    assert audio["input_values"].shape == (2, SEQ_LEN * dummy_data.FRAME_SAMPLES)
    assert (audio["decoder_input_ids"][:, 1:] == audio["labels"][:, :-1]).all()
    dia = spec_of(tmp_path, "dia")
    two = make_batch(dia, 2, SEQ_LEN)
    channels = dia.config["decoder_config"]["num_channels"]
    assert two["labels"].shape == (2, channels, SEQ_LEN)
    assert (two["decoder_input_ids"] == two["labels"].transpose(1, 2)).all()
    assert two["input_ids"].max() < dia.config["encoder_config"]["vocab_size"] < \
        two["labels"].max()  # each part's ids within its own vocabulary
    patches = make_batch(spec_of(tmp_path, "siglip2"), 2, SEQ_LEN)
    side = int(patches["spatial_shapes"][0, 0])
    assert patches["pixel_values"].shape[1] == side * side == patches["pixel_attention_mask"].sum(1)[0]


@pytest.mark.parametrize(("problem", "shape", "dtype"), [
    (None, (2,), "torch.int64"),
    ("multi_label_classification", (2, models.NUM_LABELS), "torch.float32"),
    ("regression", (2, models.NUM_LABELS), "torch.float32"),
])
def test_a_classifier_s_labels_are_what_its_problem_type_s_loss_takes(tmp_path, problem, shape,
                                                                       dtype):
    """A published classifier's config names its loss (problem_type): multi-label classifiers
    (e.g. toxic-comment BERTs) take 0.0/1.0 per label, regression heads floats. With a class
    per sample the multi-label head's loss refused them ("Target size (torch.Size([2])) must be
    the same as input size (torch.Size([2, 2]))"), the run failed and predict refused."""
    path = tmp_path / "classifier.json"
    path.write_text(json.dumps({**models.PRESETS["tiny"].config_dict(), "problem_type": problem}))
    spec = models.resolve(str(path))
    collated = DummyDataset(spec, 4, SEQ_LEN, seed=0).batch(2)
    traced = make_batch(spec, 2, SEQ_LEN)
    assert tuple(collated["labels"].shape) == tuple(traced["labels"].shape) == shape
    assert str(collated["labels"].dtype) == str(traced["labels"].dtype) == dtype
    model, _ = models.build_model(spec, "cpu", pretrained=False)
    assert model(**collated).loss.ndim == 0


def test_an_encoder_decoder_classifier_reads_sequences_that_end_with_its_end_token(tmp_path):
    """BART's sequence classifier (facebook/bart-large-mnli's head) pools each sequence at its
    end token: without one in the dummy data predict refused it ("Each example must contain at
    least one <eos> token") and the run failed."""
    path = tmp_path / "bart-mnli.json"
    path.write_text(json.dumps({
        "model_type": "bart", "architectures": ["BartForSequenceClassification"], "d_model": 32,
        "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "vocab_size": 1024, "eos_token_id": 2, "is_encoder_decoder": True,
        "id2label": {"0": "contradiction", "1": "neutral", "2": "entailment"}}))
    spec = models.resolve(str(path))
    collated = DummyDataset(spec, 4, SEQ_LEN, seed=0).batch(2)
    traced = make_batch(spec, 2, SEQ_LEN)
    for batch in (collated, traced):
        assert (batch["input_ids"][:, -1] == 2).all() and (batch["input_ids"][:, :-1] != 2).all()
    model, _ = models.build_model(spec, "cpu", pretrained=False)
    assert model(**collated).loss.ndim == 0


def test_a_head_that_takes_no_labels_is_refused_in_one_line_before_a_run_starts(tmp_path):
    spec = spec_of(tmp_path, "pp_lcnet")
    with pytest.raises(models.ModelError, match="takes no labels") as refused:
        dummy_data.sample(spec, SEQ_LEN)
    assert "\n" not in str(refused.value)
    errors = validate(RunOptions(model=spec.name), gpu_count=0)  # the config's check, apart
    assert list(errors) == ["model"] and errors["model"] == str(refused.value)


def test_speech_features_without_their_size_are_refused_in_one_line_before_a_run_starts(tmp_path):
    path = tmp_path / "whisper.json"
    path.write_text(json.dumps({"model_type": "whisper", "d_model": 64, "encoder_layers": 1,
                                "decoder_layers": 1, "architectures":
                                ["WhisperForConditionalGeneration"]}))
    errors = validate(RunOptions(model=str(path)), gpu_count=0)
    assert list(errors) == ["model"] and "names no number of mel bins" in errors["model"]
    assert "\n" not in errors["model"]


def test_an_image_classifier_by_a_text_prompt_is_refused_for_what_it_is(tmp_path):
    with pytest.raises(models.ModelError, match="classifies an image by a text prompt"):
        dummy_data.sample(spec_of(tmp_path, "shieldgemma2"), SEQ_LEN)


def test_a_token_classifier_s_labels_are_a_class_for_every_token(token_classifier):
    """DataCollatorForTokenClassification's labels: one per position. The dummy sequences are
    all `seq_len` long, so no position is padding (no -100)."""
    spec = models.resolve(token_classifier)
    collated = DummyDataset(spec, 4, SEQ_LEN, seed=0).batch(2)
    traced = make_batch(spec, 2, SEQ_LEN)
    for batch in (collated, traced):
        assert set(batch) == {"input_ids", "labels"}
        assert tuple(batch["labels"].shape) == tuple(batch["input_ids"].shape) == (2, SEQ_LEN)
        assert str(batch["labels"].dtype) == "torch.int64"
        assert 0 <= int(batch["labels"].min()) and int(batch["labels"].max()) < 9
    assert dummy_data.sample(spec, SEQ_LEN).words == \
        f"sequence length {SEQ_LEN}, one of 9 labels per token"
    model, _ = models.build_model(spec, "cpu", pretrained=False)
    assert model(**collated).loss.ndim == 0


@pytest.mark.parametrize("processes", [1, 2])
def test_every_step_trains_the_batch_asked_for_though_the_dataset_is_smaller(processes):
    """A dataset of 512 under a batch of 1,828: the Trainer's DataLoader handed batches of 512 (on
    the H200 `sweep --from-prediction` read 512's memory at 1,828 and 1,829 and called both fits).
    The run's dataset holds one full batch for every process."""
    from torch.utils.data import DataLoader

    from anatomy.engine.training import dummy_dataset

    options = RunOptions(model="tiny", batch_size=24, dataset_size=5, seq_len=8,
                         processes=processes)
    dataset = dummy_dataset(options, models.resolve("tiny"))
    assert len(dataset) == 24 * processes == options.samples
    assert options.total_steps() == 1
    first = next(iter(DataLoader(dataset, batch_size=options.batch_size)))
    assert first["input_ids"].shape == (24, 8)
    # Larger datasets are kept as asked.
    assert RunOptions(batch_size=4, dataset_size=512).samples == 512
