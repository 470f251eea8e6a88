"""Run options: one table of fields (type, range, help) that the CLI, the form and validation share.

Everything is checked before anything starts: `validate` returns one message per wrong field,
naming the field and the range it accepts, and the model's own limits (its longest sequence).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.lengths import LONGEST, PADDINGS
from anatomy.analysis.models import IMAGE_CLASSIFICATION, PRESETS, ModelError, default_preset
from anatomy.store import checks
from anatomy.vocabulary import Precision

PRECISIONS = Precision.values()
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
    free_text: bool = False  # text: `choices` are suggestions (the form lists them), not a limit

    @property
    def is_flag(self) -> bool:
        return self.low is None and self.choices is None and not self.free_text


def strategy_field() -> Field:
    """The strategy option, as the registered strategies describe themselves (read as options is
    loaded: a strategy registered later is offered once this is read again)."""
    return Field("strategy", "Strategy", "how several processes share the training: "
                 + strategies.described(), choices=strategies.names())


FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("model", "Model", "a shipped preset, a path to a config.json or a model folder, or a Hub"
          " id in the local cache; its head follows the config's architectures: a causal LM, a "
          "sequence, token or image classifier, or sequence to sequence", choices=tuple(PRESETS),
          free_text=True),
    Field("batch_size", "Batch size", "per_device_train_batch_size", 1, 4096),
    Field("seq_len", "Sequence length", "tokens per sequence of the dummy data, at most the "
          "model's positions (a sequence-to-sequence model's source and target each; image models "
          "take their config's image size instead, a dataset's run its texts' lengths)",
          1, 1_048_576),
    Field("dataset_size", "Dataset size", "random sequences in the dummy dataset (at least one "
          "batch for every process: grown to it where smaller); a dataset's run sets it to its texts",
          1, 10_000_000),
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
    Field("gpus", "GPUs", "several visible GPUs that train together, comma-separated (0,1): one"
          " process per GPU, launched through accelerate; empty: the one GPU of --gpu",
          free_text=True),
    Field("processes", "Processes", "training processes on a machine without a GPU (CPU ranks"
          " over gloo, launched through accelerate); with GPUs name them with --gpus", 1, 64),
    strategy_field(),
    Field("profile_steps", "Profile steps",
          "after training, profile this many steps with torch.profiler (0: off)", 0, 50),
    Field("lora_rank", "LoRA rank", "train LoRA adapters of this rank instead of every weight "
          "(peft; 0: full fine-tuning)", 0, 4096),
    Field("lora_targets", "LoRA targets", "comma-separated module names the adapters wrap (empty:"
          " the architecture's default, e.g. q_proj,v_proj)", free_text=True),
    Field("dataset", "Dataset", "train on a dataset's texts instead of the dummy data: a folder "
          "saved with save_to_disk (a Dataset or a DatasetDict), a JSON-lines, CSV or Parquet "
          "file, or a Hub id in the local cache (empty: the dummy data)", free_text=True),
    Field("split", "Split", "the dataset's split (empty: train, or its only one)", free_text=True),
    Field("text_column", "Text column", "the dataset's column of texts (empty: text)",
          free_text=True),
    Field("tokenizer", "Tokenizer", "the fast tokenizer for the dataset's texts: a folder saved "
          "with save_pretrained, or a Hub id in the local cache", free_text=True),
    Field("padding", "Padding", "how a batch of texts is padded: longest (to its longest text, as "
          "DataCollatorWithPadding does) or max_length (every batch to max length)",
          choices=PADDINGS),
    Field("max_length", "Max length", "texts are cut at this many tokens, and padding max_length "
          "pads to it (0: the model's longest sequence)", 0, 1_048_576),
)}
# The fields that describe the dataset a run trains on; empty or default without one.
DATA_FIELDS = ("dataset", "split", "text_column", "tokenizer", "padding", "max_length")
# What a run on a dataset takes from its texts instead of these options: their lengths, their count.
DATA_DECIDES = ("seq_len", "dataset_size")
# A module name as peft matches it: letters, digits, underscores and dots.
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True)
class RunOptions:
    model: str = "tiny"  # called `preset` before other models came: see __init__ below
    batch_size: int = 4
    seq_len: int = 512
    dataset_size: int = 512
    epochs: int = 1
    max_steps: int | None = None
    precision: str = Precision.FP32.value  # a Precision's (validate says which): plain text,
    # as stored options read back (their repr is compared and written into scripts)
    gradient_checkpointing: bool = False
    grad_accum: int = 1
    optim: str = "adamw_torch"
    seed: int = 42
    sample_rate: int = 200
    gpu: int = 0
    gpus: str = ""  # "0,1": several GPUs, one process each; "": the one of `gpu`
    processes: int = 1  # training processes without a GPU (CPU ranks over gloo)
    strategy: str = strategies.DEFAULT  # with several processes: a strategy's name
    profile_steps: int = 0
    lora_rank: int = 0
    lora_targets: str = ""
    dataset: str = ""  # "": the dummy data
    split: str = ""
    text_column: str = ""
    tokenizer: str = ""
    padding: str = LONGEST
    max_length: int = 0

    @property
    def preset(self) -> str:
        """The model option's old name (runs stored before other models came say "preset")."""
        return self.model

    @property
    def on_dataset(self) -> bool:
        """It trains on a dataset's texts (`dataset`), not on the dummy data."""
        return isinstance(self.dataset, str) and bool(self.dataset.strip())

    def applies(self, name: str) -> bool:
        """Whether option `name` shapes this run: one on a dataset ignores the sequence length
        and the dataset size (its texts decide both), one on the dummy data the dataset's
        settings (but `dataset` itself, whose empty value says so)."""
        if self.on_dataset:
            return name not in DATA_DECIDES
        return name not in DATA_FIELDS[1:]

    @property
    def lora(self) -> bool:
        return isinstance(self.lora_rank, int) and self.lora_rank > 0

    def lora_target_list(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())

    def gpu_list(self) -> tuple[int, ...]:
        """The visible GPUs (torch's indices) it trains on: those of `gpus`, else `gpu` alone.
        Only for validated options."""
        entries = [e.strip() for e in self.gpus.split(",") if e.strip()]
        return tuple(int(e) for e in entries) if entries else (self.gpu,)

    @property
    def world_size(self) -> int:
        """Training processes: one per GPU of `gpus`, else `processes` (1: a single process)."""
        gpus = [e for e in str(self.gpus).split(",") if e.strip()]
        return len(gpus) if len(gpus) > 1 else self.processes

    @property
    def distributed(self) -> bool:
        return isinstance(self.world_size, int) and self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOptions:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "model" not in values and "preset" in data:  # stored before `model` replaced `preset`
            values["model"] = data["preset"]
        return cls(**values)


    @property
    def _processes(self) -> int:
        """The processes that share the data, at least 1 (for unvalidated options too)."""
        world = self.world_size
        return max(1, world) if isinstance(world, int) else 1

    @property
    def samples(self) -> int:
        """The dummy dataset's length: `dataset_size`, grown to one full batch for every process
        where it holds less. A Trainer over fewer samples than a batch trains a smaller batch than
        asked, and what a run reads would be that batch's memory, not the one it was asked (and
        predicted) for: `sweep --from-prediction` at 1,828 trained batches of 512 on the H200."""
        return max(self.dataset_size, self.batch_size * self._processes)

    def with_texts(self, texts: int) -> RunOptions:
        """The options as a run on a dataset of `texts` texts stores them: its dataset size is
        theirs (within the option's range), so that its steps are counted as the Trainer counts
        them."""
        return replace(self, dataset_size=min(texts, FIELDS["dataset_size"].high))

    def total_steps(self) -> int:
        """Optimizer steps the Trainer will take (its own arithmetic, without a dataloader): with
        several processes each takes its share of the batches (accelerate's even split), and
        every process takes that many steps."""
        if self.max_steps is not None:
            return self.max_steps
        batches = -(-self.samples // (self.batch_size * self._processes))
        return max(1, batches // self.grad_accum) * self.epochs


_dataclass_init = RunOptions.__init__


def _init(self, *args, preset: str | None = None, **kwargs) -> None:
    """RunOptions(preset=NAME) still means RunOptions(model=NAME): callers and stored runs from
    before other models came keep working. `preset` wins over `model`: `dataclasses.replace(
    options, preset=NAME)` passes the old model along with it."""
    if preset is not None:
        kwargs["model"] = preset
    _dataclass_init(self, *args, **kwargs)


RunOptions.__init__ = _init


CPU_SEQ_LEN = 128  # the walkthrough's 512 makes a CPU demo take minutes; 128 takes seconds


def defaults_for(has_gpu: bool) -> RunOptions:
    """Defaults that fit the machine: the walkthrough's run on a GPU (bert-large, batch size 4,
    512 × 512); on a CPU the tiny BERT on sequences of 128, a demo of a minute or a few on a busy
    machine (the form says how long before Start: analysis/duration.py)."""
    if has_gpu:
        return RunOptions(model=default_preset(True))
    return RunOptions(model=default_preset(False), seq_len=CPU_SEQ_LEN)


def shown(value: Any) -> str:
    """A value as a message quotes it: on one line, and short (an integer of thousands of digits
    cannot even be written out in full)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits" if abs(value) < 10**4000 else \
            "an integer of thousands of digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(field: Field, value: Any) -> str | None:
    if field.free_text:
        return None if isinstance(value, str) else f"{field.name}: must be text, got {value!r}"
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


def validate(options: RunOptions, gpu_count: int, *, resolve_model: bool = True,
             here: bool = True, config_class: bool = True) -> dict[str, str]:
    """Messages by field name for every wrong value; empty when the run may start. `gpu_count` is
    the number of GPUs a run can use here: those CUDA_VISIBLE_DEVICES leaves visible.
    `resolve_model=False` judges the options alone, not whether this machine has the model (an
    imported run may name a config file that stayed on another machine); `here=False` leaves
    out what depends on this machine's kind (CPU processes, FSDP's GPUs: an imported run);
    `config_class=False` leaves transformers' own checks of the config to a caller that builds
    the config itself (the prediction: the same line, without a child interpreter's seconds)."""
    errors: dict[str, str] = {}
    for name, field in FIELDS.items():
        value = getattr(options, name)
        if value is None and name == "max_steps":
            continue
        message = _check(field, value)
        if message:
            errors[name] = message
    if "lora_targets" not in errors and options.lora_targets.strip():
        wrong = [t for t in options.lora_targets.split(",")
                 if not _TARGET.match(t.strip()) and t.strip() != models.ALL_LINEAR]
        if wrong:
            errors["lora_targets"] = (f"lora_targets: {wrong[0].strip()!r} is not a module name "
                                      "(comma-separated names such as q_proj,v_proj)")
        elif models.ALL_LINEAR in options.lora_target_list() and \
                len(options.lora_target_list()) > 1:
            errors["lora_targets"] = (f"lora_targets: {models.ALL_LINEAR} names every linear "
                                      "layer already: give it alone, as peft takes it")
        elif not options.lora and "lora_rank" not in errors:
            errors["lora_targets"] = "lora_targets: set a LoRA rank too (--lora-rank R)"
    errors.update(_unused_data_errors(options, errors))
    if resolve_model and "model" not in errors:
        try:
            spec = models.resolve(options.model)
            if config_class:
                models.check_config_class(spec)
        except ModelError as error:
            errors["model"] = str(error)
        else:
            positions = spec.max_positions
            # A dataset's texts are cut at the model's positions: its seq_len is not read.
            if "seq_len" not in errors and spec.task != IMAGE_CLASSIFICATION and positions \
                    and options.seq_len > positions and options.applies("seq_len"):
                errors["seq_len"] = (f"seq_len: {options.seq_len} is out of range for "
                                     f"{spec.display_name}: 1 to {positions}")
            errors.update(_model_errors(options, spec, errors))
            errors.update(_data_errors(options, spec, errors))
    if "gpu" not in errors:
        if gpu_count == 0 and options.gpu != 0:
            errors["gpu"] = f"gpu: {options.gpu} is out of range: this machine has no GPU (use 0)"
        elif gpu_count and options.gpu >= gpu_count:
            errors["gpu"] = f"gpu: {options.gpu} is out of range: 0 to {gpu_count - 1}"
    errors.update(_process_errors(options, gpu_count, errors, here))
    if gpu_count == 0 and options.precision == Precision.FP16 and "precision" not in errors:
        errors["precision"] = "precision: fp16 needs a GPU; this machine has none (use fp32 or bf16)"
    return errors


def _model_errors(options: RunOptions, spec: models.ModelSpec, errors: dict[str, str]
                  ) -> dict[str, str]:
    """What the model itself cannot do: checkpointing where it has none, LoRA targets that are
    none of its layers (both load transformers, and only when asked for)."""
    found: dict[str, str] = {}
    try:
        if options.gradient_checkpointing is True and not models.supports_checkpointing(spec):
            found["gradient_checkpointing"] = (
                f"gradient_checkpointing: {spec.display_name} ({spec.head or spec.model_type}) "
                "cannot recompute its activations (transformers does not support gradient "
                "checkpointing for it)")
        if "lora_targets" not in errors and "lora_rank" not in errors and options.lora:
            targets = options.lora_target_list()
            unknown = models.unknown_lora_targets(spec, targets) if targets else []
            if unknown:
                words = "; ".join(models.unknown_target_words(spec, t) for t in unknown)
                layers = ", ".join(models.linear_module_names(spec)[:12])
                found["lora_targets"] = (f"lora_targets: {words} (the layers LoRA can adapt:"
                                         f" {layers})")
            elif not targets:
                models.default_lora_targets(spec)
    except ModelError as error:
        found["model"] = str(error)
    return found


def _unused_data_errors(options: RunOptions, errors: dict[str, str]) -> dict[str, str]:
    """A dataset's settings without a dataset, and a dataset without its tokenizer (text alone:
    an imported run's too)."""
    found: dict[str, str] = {}
    if any(name in errors for name in DATA_FIELDS):
        return found
    if not options.on_dataset:
        given = [name for name in DATA_FIELDS[1:]
                 if getattr(options, name) != getattr(RunOptions, name)]
        for name in given:
            found[name] = (f"{name}: {shown(getattr(options, name))} is a setting of a dataset's "
                           "texts, and the run trains on the dummy data: give --dataset too")
    elif not options.tokenizer.strip():
        found["tokenizer"] = ("tokenizer: a dataset's texts need one: a folder saved with "
                              "save_pretrained, or a Hub id in the local cache")
    return found


def _data_errors(options: RunOptions, spec: models.ModelSpec, errors: dict[str, str]
                 ) -> dict[str, str]:
    """What the dataset, its tokenizer and the model cannot do together (loading the dataset
    and the tokenizer: analysis/data.py)."""
    if any(name in errors for name in DATA_FIELDS) or "model" in errors or \
            not options.on_dataset:
        return {}
    from anatomy.analysis import data

    return data.problems(options, spec)


def _process_errors(options: RunOptions, gpu_count: int, errors: dict[str, str],
                    here: bool = True) -> dict[str, str]:
    """Several processes: GPUs named once each and visible; CPU ranks only without a GPU; what
    the strategy refuses (anatomy/strategies/); what one process alone does (profiling) kept to
    one."""
    found: dict[str, str] = {}
    if "gpus" in errors or "processes" in errors or "strategy" in errors:
        return found
    entries = [e.strip() for e in options.gpus.split(",") if e.strip()]
    if options.gpus.strip() and len(entries) < len(options.gpus.split(",")):
        return {"gpus": f"gpus: {options.gpus!r} has an empty entry: name each GPU once,"
                        " comma-separated (e.g. 0,1)"}
    for entry in entries:
        if checks.digits(entry) is None:
            found["gpus"] = f"gpus: {entry!r} is not a GPU index (comma-separated, e.g. 0,1)"
        elif entries.count(entry) > 1:
            found["gpus"] = f"gpus: GPU {entry} is named twice"
        elif gpu_count == 0 and here:
            found["gpus"] = ("gpus: this machine has no GPU (without one, --processes N trains"
                             " on N CPU processes)")
        elif gpu_count and int(entry) >= gpu_count:
            found["gpus"] = f"gpus: {entry} is out of range: 0 to {gpu_count - 1}"
        if found:
            return found
    if options.processes > 1 and here:
        if gpu_count and len(entries) > 1 and options.processes != len(entries):
            found["processes"] = (f"processes: {options.processes} does not match the "
                                  f"{len(entries)} GPUs of --gpus: one process per GPU (leave"
                                  " --processes out)")
        elif gpu_count and len(entries) <= 1:
            found["processes"] = ("processes: CPU processes are for a machine without a GPU;"
                                  " here name the GPUs: --gpus 0,1")
    world = len(entries) if len(entries) > 1 else options.processes
    refused = strategies.named(options.strategy).problems(world, gpu_count, here)
    if refused:
        found["strategy"] = refused
    if world > 1 and isinstance(options.profile_steps, int) and options.profile_steps > 0 \
            and "profile_steps" not in errors:
        found["profile_steps"] = "profile_steps: profiling is for a single process (use 0)"
    return found
