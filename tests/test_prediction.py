"""The predicted memory components: exact where the walkthrough's arithmetic is exact, checked
against real models and optimizers where they can be built on the CPU, and against figures
measured on an H200."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, Trainer, TrainingArguments

from anatomy.analysis.models import PRESETS, build_model, parameter_count
from anatomy.analysis.options import RunOptions
from anatomy.analysis.prediction import (
    WALKTHROUGH_BYTES_PER_PARAMETER,
    optimizer_state_bytes,
    parameter_shapes,
    predict,
    walkthrough_bytes_per_parameter,
)

LARGE = "bert-large-uncased"
MIB = 2**20


@pytest.fixture(scope="module")
def tiny():
    model, _ = build_model("tiny")
    return model.train()  # dropout on: its masks are part of the activations


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.nbytes for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)  # not the per-tensor step / RMS scalars


def _trainer_optimizer(model, optim: str, tmp_path) -> torch.optim.Optimizer:
    """The optimizer exactly as the Trainer builds it for `optim`, with its default arguments."""
    args = TrainingArguments(output_dir=str(tmp_path), optim=optim, use_cpu=True, report_to="none")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls(model.parameters(), **kwargs)


def test_parameter_count_and_shapes_match_the_built_models(tiny):
    config = PRESETS["tiny"].config_dict()
    assert parameter_count(config) == sum(p.numel() for p in tiny.parameters())
    assert parameter_shapes(config) == [tuple(p.shape) for p in tiny.parameters()]
    base_config = PRESETS["bert-base-uncased"].config_dict()
    with torch.device("meta"):  # bert-base's shapes without allocating its weights
        base = AutoModelForSequenceClassification.from_config(
            BertConfig.from_dict({**base_config, "num_labels": 2}))
    assert parameter_count(base_config) == sum(p.numel() for p in base.parameters())
    assert parameter_shapes(base_config) == [tuple(p.shape) for p in base.parameters()]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("preset", ["tiny", LARGE])
def test_weights_and_gradients_are_four_bytes_a_parameter(preset, precision):
    p = predict(RunOptions(preset=preset, precision=precision))
    assert p.parameters == parameter_count(PRESETS[preset].config_dict())
    assert p.weights == p.gradients == 4 * p.parameters  # autocast keeps fp32 weights and grads


@pytest.mark.parametrize("optim, per_parameter", [
    ("adamw_torch", 8), ("adamw_torch_fused", 8), ("adagrad", 4), ("rmsprop", 4), ("sgd", 0)])
def test_optimizer_states_per_parameter(optim, per_parameter):
    p = predict(RunOptions(preset=LARGE, optim=optim))
    assert p.optimizer_states == per_parameter * p.parameters


def test_adafactor_keeps_a_row_and_a_column_per_matrix():
    assert optimizer_state_bytes("adafactor", [(3, 5), (7,)]) == 4 * (3 + 5 + 7)
    p = predict(RunOptions(preset=LARGE, optim="adafactor"))
    assert 0 < p.optimizer_states < 0.01 * p.weights


@pytest.mark.parametrize("optim", ["adamw_torch", "adafactor", "sgd", "adagrad", "rmsprop"])
def test_optimizer_states_equal_the_trainers_optimizer_after_a_step(tiny, optim, tmp_path):
    optimizer = _trainer_optimizer(tiny, optim, tmp_path)
    x = torch.randint(100, 30000, (2, 16))
    tiny(input_ids=x, labels=torch.tensor([0, 1])).loss.backward()
    optimizer.step()
    tiny.zero_grad()
    expected = optimizer_state_bytes(optim, parameter_shapes(PRESETS["tiny"].config_dict()))
    assert _state_bytes(optimizer) == expected


def test_activations_grow_linearly_with_batch_size_and_checkpointing_cuts_them():
    for precision in ("fp32", "bf16"):
        a1, a2, a4 = (predict(RunOptions(preset=LARGE, batch_size=b, precision=precision))
                      .activations for b in (1, 2, 4))
        assert a4 - a2 == 2 * (a2 - a1) > 0  # linear (bf16 adds autocast's fixed weight copies)
        checkpointed = predict(RunOptions(preset=LARGE, batch_size=4, precision=precision,
                                          gradient_checkpointing=True)).activations
        assert checkpointed < a4 / 10


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cpu_activations_equal_what_autograd_saves(tiny, precision):
    """Every tensor the forward pass saves for the backward pass, counted once per storage."""
    b, s = 2, 32
    weights = {p.untyped_storage().data_ptr() for p in tiny.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            tiny(input_ids=torch.randint(100, 30000, (b, s)), labels=torch.tensor([0, 1]))
    predicted = predict(RunOptions(preset="tiny", batch_size=b, seq_len=s, precision=precision),
                        device="cpu").activations
    # What is left out: LayerNorm means and variances, token ids, the classifier head's inputs.
    assert predicted == pytest.approx(sum(saved.values()), rel=0.02)


# Measured on an NVIDIA H200 (torch 2.11, transformers 5.17) under the Trainer, bert-large,
# batch size 4, sequence length 512, third step: torch.cuda.memory_allocated at the end of the
# forward pass minus its start (activations) and the step's max_memory_allocated (peak), MiB.
H200 = [
    (dict(), 3189.8, 7158.6),
    (dict(gradient_checkpointing=True), 210.1, 6460.0),
    (dict(precision="bf16"), 2607.8, 6577.6),
    (dict(precision="bf16", gradient_checkpointing=True), 204.1, 6459.0),
    (dict(optim="sgd"), 3189.8, 4599.1),
    (dict(optim="adafactor"), 3189.8, 4602.3),
    (dict(optim="adagrad"), 3189.8, 6458.0),
    (dict(grad_accum=2), 3189.8, 8432.8),
    (dict(optim="adamw_torch_fused", gradient_checkpointing=True), 210.1, 5215.3),
]


@pytest.mark.parametrize("changes, activations_mib, peak_mib", H200)
def test_prediction_matches_the_h200_measurement(changes, activations_mib, peak_mib):
    p = predict(RunOptions(preset=LARGE, batch_size=4, seq_len=512, **changes))
    assert p.activations / MIB == pytest.approx(activations_mib, rel=0.015)
    assert p.peak / MIB == pytest.approx(peak_mib, rel=0.02)


def test_peak_is_the_fullest_moment_and_less_than_the_sum_of_the_parts():
    p = predict(RunOptions(preset=LARGE, batch_size=4, seq_len=512))
    assert p.peak == max(p.moments.values()) == p.moments[p.peak_at]
    assert p.peak_at == "start of the backward pass"
    assert p.peak < p.sum_of_parts
    assert predict(RunOptions(preset=LARGE, batch_size=4, gradient_checkpointing=True)).peak_at \
        == "optimizer step"


def test_bytes_per_parameter_next_to_the_walkthrough():
    options = RunOptions(preset=LARGE, precision="bf16")
    ours = predict(options).bytes_per_parameter()
    assert ours["weights"] == ours["gradients"] == 4 and ours["optimizer_states"] == 8
    assert walkthrough_bytes_per_parameter(options) == {
        "weights": 6.0, "gradients": 4.0, "optimizer_states": 8.0}
    assert walkthrough_bytes_per_parameter(RunOptions(optim="adafactor"))["optimizer_states"] is None
    assert WALKTHROUGH_BYTES_PER_PARAMETER["mixed precision AdamW, all three (plus activations)"] \
        == 6 + 4 + 8


def test_importing_the_module_loads_no_torch():
    code = "import sys, anatomy.analysis.prediction; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_cli_predict_json():
    result = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--preset", "tiny",
                             "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["parameters"] == parameter_count(PRESETS["tiny"].config_dict())
    assert {"weights", "gradients", "optimizer_states", "activations", "temporary", "peak"} \
        <= set(data["components"])
    assert all(isinstance(v, int) for v in data["components"].values())


def test_cli_predict_table_and_invalid_options():
    result = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--preset", "tiny"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "this run should need about" in result.stdout and "optimizer states" in result.stdout
    result = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--batch-size", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "error: batch_size: 0 is out of range: 1 to 4096" in result.stderr
