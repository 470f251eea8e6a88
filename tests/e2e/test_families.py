"""One small model of every family the prediction once failed on (issue 19), built from its
architecture's own defaults (bench/architectures.py, the coverage benchmark's configs), trained
for two steps on this CPU by the worker's own training (engine/worker.py's `train`: the model
built, the Trainer, the probe), and predicted: the CPU prediction is what the probe measured, to
the byte. The families train one after another in one child process (torch and transformers
loaded once, not once a family); the worker's process, its sampler and the store around a
training are tests/e2e/test_every_architecture.py's and test_worker.py's. The whole table of
architectures is docs/COVERAGE.md."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import time
from dataclasses import replace

import pytest

from anatomy.analysis.options import RunOptions, validate
from anatomy.engine import protocol
from anatomy.prediction import PredictionError, predict
from tests.conftest import small_ner_config
from tests.helpers import wait_until

FAMILIES = {
    "mixtral": "a mixture of experts (the grouped matmul)",
    "jetmoe": "a router read from the weights (its experts' token counts, .tolist())",
    "llama4": "a causal LM inside a multimodal config (its text part)",
    "deberta-v2": "data-dependent shapes (aten.nonzero over the labels)",
    "opt": "a decoder whose padding mask transformers reads (.item())",
    "bart": "an encoder-decoder, data-dependent (unique_consecutive)",
    "t5": "an encoder-decoder with a learnable relative attention bias",
    "whisper": "a speech encoder-decoder (log-mel features)",
    "marian": "a translation encoder-decoder",
    "swin": "windowed attention with a learnable bias",
    "resnet": "a convolution network without image_size, without checkpointing",
    "phi3": "a fused qkv_proj, LoRA's defaults from the model's own layers",
    "llama": "a decoder (its logits once counted as activations)",
    "moonshine": "a speech encoder-decoder on a raw waveform (input_values)",
    "canary": "a speech encoder-decoder on a Parakeet encoder's log-mel features",
    "musicgen": "a decoder of several codebooks per position (MusicGen's input ids)",
    "git": "a causal LM after an image that has no token of its own (GIT)",
    "imagegpt": "an image classifier reading an image as its pixels' tokens (ImageGPT)",
    "siglip2": "an image classifier on patches and their grid (SigLIP 2's NaFlex)",
    "xmod": "activations picked by a boolean mask of the batch's own (X-MOD's language adapters)",
    "t5gemma2": "an encoder-decoder indexing activations by a mask made from its inputs",
    "speech-encoder-decoder": "a wav2vec2 encoder of the user's choice on a raw waveform",
    "moonshine_streaming": "a raw waveform in a streaming encoder (a setting its config class "
                           "keeps only in a part: the small config lifts it)",
    "voxtral_realtime": "a decoder whose audio runs in step with its text (Voxtral Realtime)",
    "dia": "an encoder-decoder of two vocabularies whose decoder reads every codebook (Dia)",
}
LORA = {"phi3"}
COMPARED = ("weights", "gradients", "optimizer_states", "activations")


def small_config(tmp_path, model_type: str) -> str:
    from bench.architectures import architectures, working_config

    return str(working_config(model_type, dict(architectures())[model_type], tmp_path)[0])


class _Heard:
    """The queue a training's Reporter speaks on, kept in the child: what the probe measured, and
    the failure if it failed."""

    def __init__(self):
        self.components, self.failure = None, None

    def put(self, message) -> None:
        match message:
            case protocol.ComponentsMeasured(components=components):
                self.components = components
            case protocol.Failure(text=text):
                self.failure = text


def _train_each(requests, answers) -> None:
    """The child: each RunOptions it is sent trained on the CPU as the worker trains it (its
    environment, then `worker.train`), answered with (exit code, components, failure)."""
    from anatomy.analysis.transformers_index import index_once
    from anatomy.engine import worker

    index_once()
    os.environ.update(HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")  # as worker.main sets them
    while (options := requests.get()) is not None:
        heard = _Heard()
        code = worker.train(heard, options, time.monotonic(), use_cuda=False, dwell=0.0)
        answers.put((code, heard.components, heard.failure))


@pytest.fixture(scope="module")
def trained():
    """trained(options) -> the components the probe measured in two steps of `options`, in the
    module's one child process (per pytest-xdist worker)."""
    context = multiprocessing.get_context("spawn")
    requests, answers = context.Queue(), context.Queue()
    child = context.Process(target=_train_each, args=(requests, answers), daemon=True)
    child.start()

    def train(options: RunOptions):
        requests.put(options)

        def answer() -> tuple | None:
            try:
                return answers.get(timeout=1)
            except queue.Empty:
                assert child.is_alive(), f"the child ended with code {child.exitcode}"
                return None

        code, components, failure = wait_until(answer, 600, "the child's answer", every=0)
        assert code == 0, failure
        return components

    yield train
    requests.put(None)
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()


@pytest.mark.parametrize("model_type", FAMILIES, ids=list(FAMILIES))
def test_every_family_predicts_what_the_cpu_run_measures(trained, tmp_path, model_type):
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         dataset_size=4, max_steps=2,
                         lora_rank=8 if model_type in LORA else 0)
    assert validate(options, gpu_count=0) == {}
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}



@pytest.mark.parametrize("model_type", FAMILIES, ids=list(FAMILIES))
def test_an_epoch_ending_on_a_partial_micro_batch_measures_a_full_one(trained, tmp_path,
                                                                      model_type):
    """Batch 3 over 8 samples, two micro-batches a step: 3 + 3, then 2 at the epoch's end. The
    activations measured were the last micro-batch's (2 samples), the prediction's a full one's."""
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=3, seq_len=32,
                         dataset_size=8, grad_accum=2, max_steps=2,
                         lora_rank=8 if model_type in LORA else 0)
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}
    assert measured.micro_batch == 3


@pytest.mark.parametrize("model_type", ["llama", "t5", "whisper", "resnet", "bart"])
def test_label_smoothing_predicts_what_the_cpu_run_measures(trained, tmp_path, model_type):
    """The Trainer's label_smoothing_factor (its LabelSmoother on the logits, the labels shifted
    for a causal LM): refused before, for the model's own loss made other activations (10.4 MB
    predicted for 7.3 MB). A decoder, encoder-decoders of text and of speech, an image
    classifier: predicted as the CPU run measures it, to the byte."""
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         dataset_size=4, max_steps=2, label_smoothing=0.1)
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}
    plain = predict(replace(options, label_smoothing=0.0), device="cpu")
    assert plain.activations != predicted.activations


@pytest.mark.parametrize("model_type", ["t5", "bart", "whisper"])
def test_a_target_shorter_than_its_source_predicts_what_the_cpu_run_measures(trained, tmp_path,
                                                                              model_type):
    """A summary's or a translation's target is seldom as long as its source: the dummy data's
    target was the sequence length, so a user's Seq2SeqTrainer over 40-token sources and
    24-token targets was predicted with 32 % more activations than it held. `target_len`
    shapes the decoder's side, in the run and in the prediction alike."""
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         target_len=12, dataset_size=4, max_steps=2)
    assert validate(options, gpu_count=0) == {}
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}
    assert predicted.activations < predict(replace(options, target_len=0),
                                           device="cpu").activations


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "bart", "vit"])
def test_eager_attention_predicts_what_the_cpu_run_measures(trained, tmp_path, model_type):
    """A model built with eager attention (`attn_implementation="eager"`, Gemma's advice) keeps
    its attention weights for the backward pass: a user's 2-layer Llama held 12.0 MB of
    activations where sdpa's 10.4 MB were predicted. `attention` builds it so in the run and
    in the prediction alike: a decoder, one with sliding windows, an encoder-decoder, a vision
    transformer, to the byte."""
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         dataset_size=4, max_steps=2, attention="eager")
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}
    assert predict(replace(options, attention="sdpa"), device="cpu").activations != \
        predicted.activations


# Published configs' own settings, shrunk (two layers, small widths), that the architectures'
# defaults leave off: each failed or was predicted with another head before.
_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 1024, "max_position_embeddings": 512}
PUBLISHED = {
    "bart-large-mnli": {  # an encoder-decoder classifier reads its sequences' end token
        "model_type": "bart", "architectures": ["BartForSequenceClassification"], "d_model": 64,
        "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
        "vocab_size": 1024, "eos_token_id": 2, "is_encoder_decoder": True,
        "id2label": {"0": "contradiction", "1": "neutral", "2": "entailment"}},
    "roberta-go-emotions": {  # 28 labels, several per sample
        **_SMALL, "model_type": "roberta", "architectures": ["RobertaForSequenceClassification"],
        "pad_token_id": 1, "problem_type": "multi_label_classification",
        "id2label": {str(i): f"emotion {i}" for i in range(28)}},
    "llama-3.1-classifier": {  # several end tokens, no padding token
        **_SMALL, "model_type": "llama", "architectures": ["LlamaForSequenceClassification"],
        "num_key_value_heads": 2, "eos_token_id": [2, 5, 7], "pad_token_id": None,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "torch_dtype": "bfloat16", "num_labels": 3},
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_configs_settings_predict_what_the_cpu_run_measures(trained, tmp_path, name):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PUBLISHED[name]))
    (path.parent / "tokenizer.json").write_text("{}")  # a model folder as published
    # label smoothing too: the Trainer drops it for a multi-label classifier, as the prediction
    options = RunOptions(model=str(path.parent), batch_size=2, seq_len=32, dataset_size=4,
                         max_steps=2, label_smoothing=0.1 if name == "roberta-go-emotions" else 0)
    # the config class's own check is the prediction's too (no child interpreter's seconds)
    assert validate(options, gpu_count=0, config_class=False) == {}
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}


# Token classifiers as the Trainer trains them (peft's token-classification model with LoRA: the
# Trainer finds its labels through the wrapper): the published NER model, shrunk, and a decoder's
# token head.
TOKEN_CLASSIFIERS = {
    "bert-base-ner": (small_ner_config(), 8),
    "llama-tagger": ({**_SMALL, "model_type": "llama", "num_key_value_heads": 2,
                      "architectures": ["LlamaForTokenClassification"], "num_labels": 5}, 0),
}


@pytest.mark.parametrize("name", TOKEN_CLASSIFIERS)
def test_a_token_classifier_predicts_what_the_cpu_run_measures(trained, tmp_path, name):
    config, rank = TOKEN_CLASSIFIERS[name]
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    options = RunOptions(model=str(path.parent), batch_size=2, seq_len=32, dataset_size=4,
                         max_steps=2, lora_rank=rank)
    assert validate(options, gpu_count=0, config_class=False) == {}
    predicted = predict(options, device="cpu")
    measured = trained(options)
    assert {k: getattr(predicted, k) for k in COMPARED} == \
        {k: getattr(measured, k) for k in COMPARED}


@pytest.mark.parametrize("model_type", ["t5", "swin"])
def test_a_learnable_attention_bias_takes_a_kernel_that_can_differentiate_it(tmp_path,
                                                                             model_type):
    """cuDNN and flash cannot take an attention bias that needs its gradient (torch's
    sdp_utils): on the H200 such calls go to the memory-efficient kernel."""
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         precision="bf16")
    predicted = predict(options, device="cuda", gpu_name="NVIDIA H200")
    assert "efficient" in predicted.attention_kernels


def test_checkpointing_a_model_without_it_is_refused_in_one_line(tmp_path):
    options = RunOptions(model=small_config(tmp_path, "resnet"), gradient_checkpointing=True)
    errors = validate(options, gpu_count=0)
    assert list(errors) == ["gradient_checkpointing"] and "\n" not in errors[
        "gradient_checkpointing"]


def test_a_head_without_a_loss_is_refused_for_what_it_is(tmp_path):
    """PP-LCNet's classifier takes no labels: nothing for the Trainer to train on."""
    with pytest.raises(PredictionError, match="takes no labels: it computes no loss"):
        predict(RunOptions(model=small_config(tmp_path, "pp_lcnet")), device="cpu")
