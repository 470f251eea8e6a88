"""The depth extrapolation held to full traces: for every tiny architecture, the models of
transformers' defaults that carry a feature of their own (encoder-decoders, experts), and configs
as save_pretrained writes them with per-layer fields and patterns of layers, the recording at
their depth and the one of the stand-in (four blocks of layers) extrapolated are the same
events, the same counts and the same replay. Each case traces a whole model twice, seconds each:
a proof for `make test`, not the edit loop (the extrapolation's parts:
tests/e2e/test_depth.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from anatomy.analysis import models
from anatomy.prediction import layers, recordings, replay
from anatomy.prediction.device_constants import DEFAULT
from anatomy.prediction.tracing import record as record_module
from anatomy.prediction.tracing.record import record
from anatomy.prediction.tracing.trainer_step import StepOptions
from tests.depth import DEEP, at_depth, canonical, saved

# (precision, checkpointing, accumulation, optimizer, LoRA rank, kernels: the CUDA emulation's
# or the CPU's, whose activations are what autograd saved; the CPU's are fp32). Each
# architecture has two cases that differ in every feature: fp32 on the CPU's kernels and bf16
# on the CUDA emulation's, checkpointing and not, accumulation and not, LoRA and not. Which
# values go together changes from one architecture to the next, so that each pair of features
# meets in its four combinations somewhere (checkpointing with LoRA and without, on either
# kernels...). Two cheap decoders add fp32 on the CUDA kernels, the third combination of
# precision and kernels. Each optimizer meets two or three architectures: its states and the
# accumulation's gradients are per parameter, the same for every architecture; the
# extrapolation repeats a layer's parameters, whatever updates them (every optimizer on every
# architecture, 48 cases, passed at 34f0e27; three cases an architecture, 24, until 2026-12-02).
FP32_ON_CUDA = ("fp32", False, 1, "adagrad", 0, "cuda")
ARCHITECTURES = {
    "tiny": [("fp32", False, 1, "adamw_torch", 0, "cpu"),
             ("bf16", True, 2, "adamw_torch_fused", 4, "cuda")],
    "tiny-gpt2": [("fp32", True, 3, "adafactor", 4, "cpu"),
                  ("bf16", False, 1, "rmsprop", 0, "cuda"), FP32_ON_CUDA],
    "tiny-llama": [("fp32", False, 2, "sgd", 4, "cpu"),
                   ("bf16", True, 1, "adamw_torch_fused", 0, "cuda")],
    "tiny-qwen2": [("fp32", True, 1, "adagrad", 0, "cpu"),
                   ("bf16", False, 3, "sgd", 4, "cuda"), FP32_ON_CUDA],
    "tiny-vit": [("fp32", False, 1, "rmsprop", 4, "cpu"),
                 ("bf16", True, 2, "adamw_torch", 0, "cuda")],
    "t5": [("fp32", False, 1, "adamw_torch", 4, "cpu"),
           ("bf16", True, 2, "adamw_torch_fused", 0, "cuda")],
    "bart": [("fp32", True, 3, "adafactor", 4, "cpu"),
             ("bf16", False, 1, "rmsprop", 0, "cuda")],
    "mixtral": [("fp32", False, 2, "adagrad", 0, "cpu"),
                ("bf16", True, 1, "sgd", 4, "cuda")],
}
# Configs as transformers' save_pretrained writes them, at their own depth (tests/depth.py's
# `saved`), with the per-layer fields the stand-in cuts to the layers traced: Qwen2's
# layer_types, all alike; Qwen2 with a sliding window from its third layer on (two first
# layers of their own); Gemma 2's sliding and full attention in turn (two layers a block);
# DeepSeek-V3.2's dense first layer then experts (mlp_layer_types) and indexed attention;
# DINOv2's stages (stage_names, out_indices); LED, whose global-attention projections get no
# gradient without global attention.
SAVED = {
    "qwen2-saved": ("qwen2", dict(num_hidden_layers=DEEP)),
    "qwen2-window": ("qwen2", dict(num_hidden_layers=7, use_sliding_window=True,
                                   sliding_window=8, max_window_layers=2)),
    "gemma2-saved": ("gemma2", dict(num_hidden_layers=10)),
    "deepseek_v32-saved": ("deepseek_v32", dict(
        num_hidden_layers=DEEP, num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
        q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, index_n_heads=2, index_head_dim=16, index_topk=8)),
    "dinov2-saved": ("dinov2", dict(num_hidden_layers=DEEP, image_size=32, patch_size=8,
                                    out_indices=[2, 4, 6])),
    "led-saved": ("led", dict(d_model=16, encoder_layers=DEEP, decoder_layers=DEEP,
                              encoder_attention_heads=2, decoder_attention_heads=2,
                              encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=128,
                              max_encoder_position_embeddings=64,
                              max_decoder_position_embeddings=64, attention_window=4)),
}
ARCHITECTURES.update({
    "qwen2-saved": [("bf16", True, 2, "adamw_torch", 4, "cuda")],
    "qwen2-window": [("fp32", False, 1, "sgd", 0, "cpu")],
    "gemma2-saved": [("fp32", False, 2, "adamw_torch", 0, "cpu"),
                     ("bf16", True, 1, "adagrad", 4, "cuda")],
    "deepseek_v32-saved": [("bf16", False, 1, "adamw_torch_fused", 0, "cuda")],
    "dinov2-saved": [("fp32", True, 1, "rmsprop", 0, "cpu")],
    "led-saved": [("fp32", False, 1, "adamw_torch", 0, "cpu")],
})
# Where the template's events differ from the next layer's (DepthError), and the prediction
# traces in full: T5 checkpointed (its first layer's position bias, an input of every later
# layer, takes their gradients in turn; the second layer's recomputation frees in another order)
TRACED_IN_FULL = {("t5", True)}
# Not among the cases: Adafactor on the CUDA emulation's kernels, whose template frees a storage
# before its allocation or twice (DepthError, tiny-qwen2 in either precision, with LoRA or
# without, 2026-12-02): its prediction is traced in full, as recordings.trace falls back.


@pytest.mark.parametrize(("name", "case"), [(name, case) for name, cases in ARCHITECTURES.items()
                                            for case in cases],
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_a_deep_recording_is_the_shallow_one_extrapolated_event_for_event(name, case,
                                                                          monkeypatch, tmp_path):
    """An encoder (BERT), decoders (GPT-2, Llama, Qwen2), a vision model (ViT), encoder-decoders
    (T5, BART), a mixture of experts (Mixtral): the recording at DEEP layers and the one at four
    extrapolated are the same events, the same counts (autograd's saved storages too: the CPU's
    activations) and the same replay; where the layers' events differ (TRACED_IN_FULL), the
    prediction's own path is the full trace."""
    precision, checkpointing, accumulation, optim, rank, kernels = case
    step = StepOptions(precision, checkpointing, accumulation, optim, 2,
                       0 if name in ("tiny-vit", "dinov2-saved") else 16)
    kwargs = dict(kernels=kernels, calibration=DEFAULT, steps=3, lora_rank=rank)
    if name in SAVED:
        model_type, settings = SAVED[name]
        spec = models.resolve(str(saved(tmp_path / name, model_type, **settings)))
    else:
        spec = at_depth(name, DEEP)
    stand_in, repeats, _ = recordings.stand_in(spec, rank)
    shallow = record(stand_in, step, blocks=repeats.traced, **kwargs)
    full = record(spec, step, **kwargs)
    if (name, checkpointing) in TRACED_IN_FULL:
        with pytest.raises(layers.DepthError):
            layers.extrapolate(shallow, repeats.count)

        def made_above(spec, step_, *, lora_targets=(), rank=None, **given):
            """The prediction's own path asks for the two recordings just made (not traced
            again): the same model, step and kernels at four layers, tagged, and at six."""
            tagged = given.pop("blocks", ()) == repeats.traced
            assert given.pop("workspaces", None) is None  # no measured workspaces asked for
            # nor a LoRA dropout or weights other than fp32: the step's own, as given
            assert (given.pop("lora_dropout", 0.0), given.pop("weights", "fp32")) == (0.0, "fp32")
            assert (step_, given, lora_targets, rank) == (step, kwargs, (), None)
            depth = layers.depth_of(dict(spec.config))
            assert (depth, tagged) in ((layers.DEPTH, True), (DEEP, False)), (depth, tagged)
            return shallow if tagged else full

        monkeypatch.setattr(record_module, "record", made_above)
        traced = recordings.trace(spec, step, device=kernels,
                                  calibration=DEFAULT, steps=3, lora_rank=rank)
        assert canonical(traced) == canonical(full)  # the prediction's own path: in full
        return
    extrapolated = layers.extrapolate(shallow, repeats.count)
    assert canonical(extrapolated) == canonical(full)
    steps = replay.stream(extrapolated, 3, accumulation), replay.stream(full, 3, accumulation)
    a, b = (replay.measure(s, cuda=kernels == "cuda") for s in steps)
    assert (a.peak_allocated, a.peak_reserved, a.peaks_by_stretch) == \
        (b.peak_allocated, b.peak_reserved, b.peaks_by_stretch)


# Parameters a script froze, and whether the prediction extrapolates: the embeddings alone (the
# layers alike: four traced), the first two layers too (two first layers of their own, then the
# trained ones), GPT-2's embeddings tied to its output layer and a part of one layer (a layer of
# its own kind before the last: too rare a repeat, traced in full), BART's encoder (its shared
# embeddings with it: the decoder's and the output layer's, tied to them).
FROZEN = [
    ("tiny-llama", ("model.embed_tokens",), True),
    ("tiny-llama", ("model.embed_tokens", "model.layers.0", "model.layers.1"), True),
    ("tiny-gpt2", ("transformer.wte", "transformer.h.3.mlp.c_fc.bias"), False),
    ("bart", ("model.encoder",), True),
]


@pytest.mark.parametrize(("name", "frozen", "extrapolated"), FROZEN,
                         ids=lambda v: v if isinstance(v, str) else "+".join(v)
                         if isinstance(v, tuple) else str(v))
def test_a_model_frozen_in_part_is_extrapolated_as_traced_in_full(name, frozen, extrapolated):
    """A model with parameters frozen: the prediction's recording (the stand-in frozen as the
    model's layers it keeps are, extrapolated; else in full) is the full trace's, event for
    event, and trains fewer parameters than the model unfrozen."""
    spec = at_depth(name, DEEP)
    step = StepOptions("fp32", False, 1, "adamw_torch", 2, 16, frozen=frozen)
    full = record(spec, step, kernels="cpu", calibration=DEFAULT, steps=2)
    assert (recordings.stand_in(spec, frozen=frozen) is not None) == extrapolated
    traced = recordings.trace(spec, step, device="cpu", calibration=DEFAULT, steps=2)
    assert canonical(traced) == canonical(full)
    trained = record(spec, replace(step, frozen=()), kernels="cpu", calibration=DEFAULT, steps=2)
    assert full.trainable_parameters < trained.trainable_parameters == trained.parameters
