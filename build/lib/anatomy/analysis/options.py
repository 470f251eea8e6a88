"""Run options: one table of fields (type, range, help) that the CLI, the form and validation share.

Everything is checked before anything starts: `validate` returns one message per wrong field,
naming the field and the range it accepts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from anatomy.analysis.models import PRESETS, default_preset

PRECISIONS = ("fp32", "fp16", "bf16")
# Trainer `optim` names that need no package beyond the requirements.
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop")


class InvalidOptions(ValueError):
    """Options refused before anything starts: one message per wrong field, by field name."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    help: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] | None = None


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("preset", "Model preset", "model config shipped in the repo",
          choices=tuple(PRESETS)),
    Field("batch_size", "Batch size", "per_device_train_batch_size", 1, 4096),
    Field("seq_len", "Sequence length", "tokens per sequence (at most the preset's 512 positions)",
          1, 512),
    Field("dataset_size", "Dataset size", "random sequences in the dummy dataset", 1, 10_000_000),
    Field("epochs", "Epochs", "num_train_epochs (ignored when max steps is set)", 1, 1000),
    Field("max_steps", "Max steps", "optimizer steps; overrides epochs when set", 1, 10_000_000),
    Field("precision", "Precision", "fp32, or mixed precision fp16 / bf16", choices=PRECISIONS),
    Field("gradient_checkpointing", "Gradient checkpointing",
          "recompute activations in the backward pass"),
    Field("grad_accum", "Gradient accumulation steps", "gradient_accumulation_steps", 1, 1024),
    Field("optim", "Optimizer", "the Trainer's optim name", choices=OPTIMIZERS),
    Field("seed", "Seed", "seed for the dummy data and the weights", 0, 2**32 - 1),
    Field("sample_rate", "Sample rate (Hz)", "memory samples per second per GPU", 1, 2000),
    Field("gpu", "GPU index", "which visible GPU trains (0 without a GPU)", 0, 63),
    Field("profile_steps", "Profile steps",
          "after training, profile this many steps with torch.profiler (0: off)", 0, 50),
)}


@dataclass(frozen=True)
class RunOptions:
    preset: str = "tiny"
    batch_size: int = 4
    seq_len: int = 512
    dataset_size: int = 512
    epochs: int = 1
    max_steps: int | None = None
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    grad_accum: int = 1
    optim: str = "adamw_torch"
    seed: int = 42
    sample_rate: int = 200
    gpu: int = 0
    profile_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def total_steps(self) -> int:
        """Optimizer steps the Trainer will take (its own arithmetic, without a dataloader)."""
        if self.max_steps is not None:
            return self.max_steps
        batches = -(-self.dataset_size // self.batch_size)
        return max(1, batches // self.grad_accum) * self.epochs


CPU_SEQ_LEN = 128  # the walkthrough's 512 makes a CPU demo take minutes; 128 takes seconds


def defaults_for(has_gpu: bool) -> RunOptions:
    """Defaults that fit the machine: the walkthrough's run on a GPU (bert-large, batch size 4,
    512 × 512); on a CPU the tiny BERT on sequences of 128, a demo of a minute or a few on a busy
    machine (the form says how long before Start: analysis/duration.py)."""
    if has_gpu:
        return RunOptions(preset=default_preset(True))
    return RunOptions(preset=default_preset(False), seq_len=CPU_SEQ_LEN)


def shown(value: Any) -> str:
    """A value as a message quotes it: on one line, and short (an integer of thousands of digits
    cannot even be written out in full)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits" if abs(value) < 10**4000 else \
            "an integer of thousands of digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(field: Field, value: Any) -> str | None:
    if field.choices is not None:
        if not isinstance(value, str) or value not in field.choices:
            return f"{field.name}: {shown(value)} is not one of {', '.join(field.choices)}"
        return None
    if field.low is None:  # a flag
        return None if isinstance(value, bool) else f"{field.name}: must be true or false"
    if isinstance(value, bool) or not isinstance(value, int):
        return (f"{field.name}: must be a whole number from {field.low} to {field.high}, got "
                f"{shown(value)}")
    if not field.low <= value <= field.high:
        return f"{field.name}: {shown(value)} is out of range: {field.low} to {field.high}"
    return None


def validate(options: RunOptions, gpu_count: int) -> dict[str, str]:
    """Messages by field name for every wrong value; empty when the run may start. `gpu_count` is
    the number of GPUs a run can use here: those CUDA_VISIBLE_DEVICES leaves visible."""
    errors: dict[str, str] = {}
    for name, field in FIELDS.items():
        value = getattr(options, name)
        if value is None and name == "max_steps":
            continue
        message = _check(field, value)
        if message:
            errors[name] = message
    if "preset" not in errors and "seq_len" not in errors:
        positions = PRESETS[options.preset].config_dict()["max_position_embeddings"]
        if options.seq_len > positions:
            errors["seq_len"] = (f"seq_len: {options.seq_len} is out of range for {options.preset}:"
                                 f" 1 to {positions}")
    if "gpu" not in errors:
        if gpu_count == 0 and options.gpu != 0:
            errors["gpu"] = f"gpu: {options.gpu} is out of range: this machine has no GPU (use 0)"
        elif gpu_count and options.gpu >= gpu_count:
            errors["gpu"] = f"gpu: {options.gpu} is out of range: 0 to {gpu_count - 1}"
    if gpu_count == 0 and options.precision == "fp16" and "precision" not in errors:
        errors["precision"] = "precision: fp16 needs a GPU; this machine has none (use fp32 or bf16)"
    return errors
