"""The traced prediction held against real tensors: the same step on real CPU tensors, followed
by the same live-tensor tracker, gives the true live-tensor peak; the prediction on fake tensors
for the CPU must match it, for every tiny architecture, with and without checkpointing, LoRA,
bf16, accumulation, each optimizer. And the largest batch size's search held to the trace at each
size. Each case traces a whole model (and builds and trains it for real), seconds each: a proof
for `make test`, not the edit loop (the prediction's parts: tests/unit/test_prediction.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from anatomy.analysis import models
from anatomy.analysis.options import RunOptions
from anatomy.prediction import max_batch_size, memory, replay
from anatomy.prediction.device_constants import DEFAULT
from anatomy.prediction.step import TracedRun
from anatomy.prediction.tracing.record import record
from anatomy.prediction.tracing.tracker import LiveTensors, Timeline
from anatomy.prediction.tracing.trainer_step import StepOptions, TrainerStep
from tests.conftest import small_ner_config

MIB = 2**20
STEPS = 2  # the first step and a steady one
# (precision, checkpointing, accumulation, optimizer, LoRA rank). Each half holds every
# feature's values: fp32 and bf16, checkpointing and not, accumulation and not, LoRA and not.
FIRST = [
    ("fp32", False, 1, "adamw_torch", 0),
    ("bf16", True, 2, "adamw_torch_fused", 0),
    ("bf16", False, 1, "sgd", 4),
]
SECOND = [
    ("fp32", True, 3, "adafactor", 4),
    ("bf16", False, 2, "rmsprop", 0),
    ("fp32", False, 1, "adagrad", 0),
]
# Each architecture with one half: every feature on every architecture, each optimizer on two or
# three. An optimizer's states and the accumulation's gradients are per parameter, the same for
# every architecture; what an architecture changes is its layers' activations, which every case
# measures (every optimizer on every architecture, 30 cases, passed at 34f0e27).
ARCHITECTURES = {"tiny": FIRST, "tiny-gpt2": SECOND, "tiny-llama": FIRST, "tiny-qwen2": SECOND,
                 "tiny-vit": SECOND}
# Token classifiers, by their configs: the published NER model's shrunk (an encoder), and a decoder
# with a token head (a label per token of its own; its type's default is a causal LM). Their
# layers are tiny-bert's and tiny-llama's: what is new is the head, its per-token labels and loss.
TOKEN_CLASSIFIERS = {
    "bert-ner": (small_ner_config(), [FIRST[0], FIRST[2]]),
    "llama-tagger": ({**models.PRESETS["tiny-llama"].config_dict(),
                      "architectures": ["LlamaForTokenClassification"], "num_labels": 5},
                     [SECOND[1]]),
}
# Peak and weights may differ by a few bytes: indexing with a Python list makes its index tensor
# outside the dispatcher on real tensors (unseen), through it on fake ones (seen).
TOLERANCE = 1024


def real_step(spec, options: StepOptions, lora_rank: int = 0, lora_dropout: float = 0.0,
              weights: str = "fp32", lora_targets: tuple[str, ...] = ()) -> replay.Measurement:
    """The true live-tensor figures of a real CPU run: the model built for real, the same steps
    on real tensors, every storage followed by the tracker the prediction uses."""
    timeline = Timeline()
    tracker = LiveTensors(timeline)
    torch.manual_seed(0)
    with tracker:
        model, _ = models.build_model(spec, "cpu", lora_rank=lora_rank,
                                      lora_targets=lora_targets,
                                      lora_dropout=lora_dropout, pretrained=False,
                                      weights=weights, frozen=options.frozen)
    timeline.mark("weights")
    timeline.mark(replay.TRAINING_BEGINS)
    step = [0]

    def mark(label: str) -> None:  # the replay's marks: (MARK, step, label)
        timeline.events.append((replay.MARK, step[0], label))

    def begin(number: int) -> None:
        step[0] = number
        mark("batches")

    with tracker:
        TrainerStep(model, spec, options, device="cpu", on_mark=mark).run(STEPS, begin)
    return replay.measure(timeline.events, cuda=False)


def predicted_step(spec, options: StepOptions, lora_rank: int = 0, lora_dropout: float = 0.0,
                   weights: str = "fp32", lora_targets: tuple[str, ...] = ()):
    recording = record(spec, options, kernels="cpu", steps=STEPS, lora_rank=lora_rank,
                       lora_targets=lora_targets, lora_dropout=lora_dropout, weights=weights)
    return recording, replay.measure(replay.stream(recording, STEPS, options.grad_accum),
                                     cuda=False)


@pytest.mark.parametrize(("name", "case"), [(name, case) for name, half in ARCHITECTURES.items()
                                            for case in half],
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_the_cpu_prediction_is_the_real_live_tensor_peak(name, case):
    assert_exact(models.resolve(name), case)


@pytest.mark.parametrize(("name", "case"), [(name, case) for name, (_, cases)
                                            in TOKEN_CLASSIFIERS.items() for case in cases],
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_a_token_classifier_s_cpu_prediction_is_the_real_live_tensor_peak(tmp_path, name, case):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(TOKEN_CLASSIFIERS[name][0]))
    spec = models.resolve(str(path))
    assert spec.task == models.TOKEN_CLASSIFICATION
    assert_exact(spec, case)


def test_a_users_masked_lm_s_cpu_prediction_is_the_real_live_tensor_peak(tmp_path):
    """A masked-LM head as a user's Trainer trains it (the carried config naming it the head
    trained): its vocabulary-wide output on every position, with and without LoRA."""
    path = tmp_path / "mlm.json"
    path.write_text(json.dumps({**models.PRESETS["tiny"].config_dict(),
                                "architectures": ["BertForMaskedLM"],
                                models.TRAINED_HEAD: "BertForMaskedLM"}))
    spec = models.resolve(str(path))
    assert (spec.task, spec.head) == (models.MASKED_LM, "BertForMaskedLM")
    assert_exact(spec, FIRST[0])
    assert_exact(spec, FIRST[2])


def assert_exact(spec, case) -> None:
    precision, checkpointing, accumulation, optim, rank = case
    options = StepOptions(precision, checkpointing, accumulation, optim, 2,
                          0 if spec.task == models.IMAGE_CLASSIFICATION else 16)
    real = real_step(spec, options, rank)
    recording, predicted = predicted_step(spec, options, rank)
    training = predicted.peak_allocated - predicted.weights_allocated
    assert training == pytest.approx(real.peak_allocated - real.weights_allocated,
                                     abs=TOLERANCE)
    assert predicted.activations(STEPS) == pytest.approx(real.activations(STEPS), abs=TOLERANCE)
    assert predicted.peak_stretch == real.peak_stretch



@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_a_lora_dropout_is_predicted_as_it_is_held(name):
    """peft's lora_dropout (0.05 in most users' LoraConfig) keeps each adapted layer's input
    dropped out, and its mask, for the backward: predicted without it, a user's LoRA training
    was short of them."""
    spec = models.resolve(name)
    options = StepOptions("bf16", False, 1, "adamw_torch", 2, 16)
    real = real_step(spec, options, 4, lora_dropout=0.05)
    _, predicted = predicted_step(spec, options, 4, lora_dropout=0.05)
    _, without = predicted_step(spec, options, 4)
    assert predicted.activations(STEPS) == pytest.approx(real.activations(STEPS), abs=TOLERANCE)
    assert predicted.peak_allocated - predicted.weights_allocated == pytest.approx(
        real.peak_allocated - real.weights_allocated, abs=TOLERANCE)
    assert predicted.activations(STEPS) > without.activations(STEPS) + TOLERANCE


# Users' folders, as transformers writes them: Gemma 2's embedding scales its lookup (its own
# forward), T5's encoder and decoder each look up through an embed_tokens sharing one weight.
SAVED = {"gemma2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        vocab_size=1000),
         "t5": dict(d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4, vocab_size=1000)}


@pytest.mark.parametrize(("name", "targets"), [
    ("tiny-llama", ("embed_tokens",)), ("tiny-llama", ("embed_tokens", "q_proj", "v_proj")),
    ("tiny-gpt2", ("wte", "wpe")), ("tiny", ("word_embeddings",)),
    ("gemma2", ("embed_tokens",)), ("t5", ("embed_tokens", "relative_attention_bias"))])
def test_lora_on_embeddings_is_predicted_as_it_is_held(tmp_path, name, targets):
    """peft's LoRA embedding (its adapters a rank × vocabulary A and a width × rank B):
    `--lora-targets embed_tokens` was refused ("an Embedding: no linear or convolution layer").
    Its gradients and states are the adapters' alone, and the prediction is the real live-tensor
    peak."""
    if name in SAVED:
        from transformers import AutoConfig

        AutoConfig.for_model(name, **SAVED[name]).save_pretrained(tmp_path / name)
        name = str(tmp_path / name)
    spec = models.resolve(name)
    options = StepOptions("fp32", False, 1, "adamw_torch", 2, 16)
    real = real_step(spec, options, 4, lora_targets=targets)
    _, predicted = predicted_step(spec, options, 4, lora_targets=targets)
    assert predicted.peak_allocated - predicted.weights_allocated == pytest.approx(
        real.peak_allocated - real.weights_allocated, abs=TOLERANCE)
    assert predicted.activations(STEPS) == pytest.approx(real.activations(STEPS), abs=TOLERANCE)
    model, _ = models.build_model(spec, "meta", lora_rank=4, lora_targets=targets,
                                  pretrained=False)
    trained = {n.split(".")[-2] for n, p in model.named_parameters() if p.requires_grad}
    assert {"lora_embedding_A", "lora_embedding_B"} <= trained


@pytest.mark.parametrize(("name", "frozen"), [
    ("tiny-llama", ("model.embed_tokens", "model.layers.0")), ("tiny", ("bert.embeddings",)),
    ("tiny-vit", ("vit",)), ("tiny-gpt2", ("transformer.wte", "transformer.h.0.attn"))])
def test_parameters_frozen_are_predicted_as_they_are_held(name, frozen):
    """Parameters a training leaves as they are (requires_grad=False: embeddings, the lower
    layers, a vision model's backbone under its trained classifier): no gradient, no state, and
    no activation kept below the first trained layer; the prediction is the real live-tensor
    peak, less than the model's trained whole."""
    spec = models.resolve(name)
    options = StepOptions("fp32", False, 1, "adamw_torch", 2,
                          0 if spec.task == models.IMAGE_CLASSIFICATION else 16, frozen=frozen)
    real = real_step(spec, options)
    _, predicted = predicted_step(spec, options)
    _, whole = predicted_step(spec, dataclasses.replace(options, frozen=()))
    assert predicted.peak_allocated - predicted.weights_allocated == pytest.approx(
        real.peak_allocated - real.weights_allocated, abs=TOLERANCE)
    assert predicted.activations(STEPS) == pytest.approx(real.activations(STEPS), abs=TOLERANCE)
    assert predicted.peak_allocated < whole.peak_allocated


@pytest.mark.parametrize(("name", "precision", "rank"), [
    ("tiny-llama", "bf16", 0), ("tiny-gpt2", "fp32", 0), ("tiny-qwen2", "bf16", 4),
    ("tiny-vit", "bf16", 0)])
def test_weights_held_in_bf16_are_predicted_as_they_are_held(name, precision, rank):
    """A model loaded in bf16 (from_pretrained's dtype=torch.bfloat16, most LLM fine-tunes)
    holds half the weights, gradients and states of the fp32 weights the Trainer's mixed
    precision autocasts over: built so, under the Trainer's bf16 or none, with LoRA (its
    adapters fp32, as peft makes them), the prediction is the real live-tensor peak."""
    spec = models.resolve(name)
    options = StepOptions(precision, False, 1, "adamw_torch", 2,
                          0 if spec.task == models.IMAGE_CLASSIFICATION else 16)
    real = real_step(spec, options, rank, weights="bf16")
    _, predicted = predicted_step(spec, options, rank, weights="bf16")
    _, fp32 = predicted_step(spec, options, rank)
    assert predicted.weights_allocated == pytest.approx(real.weights_allocated, abs=TOLERANCE)
    assert predicted.peak_allocated - predicted.weights_allocated == pytest.approx(
        real.peak_allocated - real.weights_allocated, abs=TOLERANCE)
    assert predicted.activations(STEPS) == pytest.approx(real.activations(STEPS), abs=TOLERANCE)
    assert predicted.weights_allocated < 0.6 * fp32.weights_allocated


def test_the_largest_batch_size_fits_and_the_next_does_not():
    small = dataclasses.replace(DEFAULT, context_bytes=16 * MIB, outside_bytes=16 * MIB,
                                usable_bytes=DEFAULT.total_bytes - 8 * MIB, edge_margin=0.15)
    options = RunOptions(model="tiny-gpt2", seq_len=32)
    total = DEFAULT.total_bytes // 1024
    fit = max_batch_size(options, device="cuda", total=total, calibration=small)
    # what CUDA lets a process have (the driver's share off), less the context and the rest
    driver = round(8 * MIB / 1024)
    assert fit.capacity == total - driver - 32 * MIB
    assert 2 < fit.batch_size < fit.may_fit < 4096 and not fit.exact  # linear between

    def out_of_memory(batch: int, capacity: int) -> bool:  # recorded at that very batch size
        shape = TracedRun.of(dataclasses.replace(options, batch_size=batch))
        events = replay.stream(memory._recording(shape, "cuda", small, 3), 3, 1)
        return replay.measure(events, cuda=True, capacity=capacity).out_of_memory

    # sure to fit: the caching allocator, replayed with 15 % less than the capacity, holds it
    # and not the next size
    sure = fit.capacity - round(0.15 * fit.capacity)
    assert not out_of_memory(fit.batch_size, sure) and out_of_memory(fit.batch_size + 1, sure)
    shape = TracedRun.of(dataclasses.replace(options, batch_size=fit.batch_size))
    assert replay.measure(replay.stream(memory._recording(shape, "cuda", small, 3), 3, 1),
                          cuda=True).peak_allocated == fit.peak_at_fit
    # may fit: the whole capacity
    assert not out_of_memory(fit.may_fit, fit.capacity)
    assert out_of_memory(fit.may_fit + 1, fit.capacity)
    assert f"{fit.may_fit} is within " in fit.line("the GPU") and "may not" in fit.line("x")
