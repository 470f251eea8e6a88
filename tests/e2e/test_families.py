"""One small model of every family the prediction once failed on (issue 19), built from its
architecture's own defaults (bench/architectures.py, the coverage benchmark's configs), trained
for two steps on this CPU by the real worker, and predicted: the CPU prediction is what the probe
measured, to the byte. The whole table of architectures is docs/COVERAGE.md."""

from __future__ import annotations

import pytest

from anatomy.analysis.options import RunOptions, validate
from anatomy.analysis.prediction import PredictionError, predict
from anatomy.analysis.report import report

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
}
LORA = {"phi3"}
COMPARED = ("weights", "gradients", "optimizer_states", "activations")


def small_config(tmp_path, model_type: str) -> str:
    from bench.architectures import architectures, working_config

    return str(working_config(model_type, dict(architectures())[model_type], tmp_path)[0])


@pytest.mark.parametrize("model_type", FAMILIES, ids=list(FAMILIES))
def test_every_family_predicts_what_the_cpu_run_measures(manager, store, tmp_path, model_type):
    options = RunOptions(model=small_config(tmp_path, model_type), batch_size=2, seq_len=32,
                         dataset_size=4, max_steps=2,
                         lora_rank=8 if model_type in LORA else 0)
    assert validate(options, gpu_count=0) == {}
    predicted = predict(options, device="cpu")
    run_id = manager.start(options)
    assert manager.wait(run_id, timeout=600) == "completed", report(store, run_id).error
    measured = report(store, run_id).components
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
