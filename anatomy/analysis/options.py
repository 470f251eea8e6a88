"""Run options, declared once: each option's type, limits, label and help live in `RunOptions`, a
frozen pydantic dataclass, and every front reads that declaration — the CLI's flags
(cli/arguments.py), the form's widgets (dashboard/widgets.py), the JSON a run stores and an import
reads, a sweep's values, and the messages of a refusal, which name the field and its limits.

Options are judged in two steps before anything starts: `read` (the declaration's rules, and the
rules between options, which need no machine) and `check` (what depends on the machine and on
the model: GPU counts, the model's longest sequence, its layers for LoRA, a dataset and its
tokenizer). `validated` does both, once for each action, and gives `Checked` options: what the
manager starts and a prediction predicts without judging them again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
)
from pydantic import dataclasses as pydantic_dataclasses

from anatomy import strategies
from anatomy.analysis import models
from anatomy.analysis.lengths import LONGEST, PADDINGS
from anatomy.analysis.models import IMAGE_CLASSIFICATION, PRESETS, ModelError, default_preset
from anatomy.store import checks
from anatomy.vocabulary import Attention, Name, Optimizer, Precision, Weights


class InvalidOptions(ValueError):
    """Options refused before anything starts: one message per wrong field, by field name."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


# The declaration's value types: strict, as a stored run and an import must be read (a "4" or a
# 4.0 is no batch size, a 1 no flag).
Whole = Annotated[int, Strict()]
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]
Share = Annotated[float, Strict(), Field(allow_inf_nan=False)]  # a whole number is one too
# A visible GPU's index, as `gpu` and each of `gpus` name one.
GpuIndex = Annotated[int, Strict(), Field(ge=0, le=63)]


def option(default: Any, label: str, help: str, low: int | None = None, high: int | None = None,
           **front: Any) -> Any:
    """An option's declaration: its default, its limits, and the words every front shows (the
    form's label, the help); `front` the CLI's particulars (metavar) or the form's suggestions."""
    return Field(default, description=help, ge=low, le=high,
                 json_schema_extra={"label": label, **front})


# The strategy option's help, before the registered strategies' names and words.
STRATEGY_HELP = "how several processes share the training"
# A module name as peft matches it: letters, digits, underscores and dots.
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@pydantic_dataclasses.dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class RunOptions:
    """What a run of anatomy's own is given. Stored as `to_dict` writes it (JSON of plain values:
    the GPUs and LoRA targets comma-separated, as runs have always been stored)."""

    model: Text = Field(
        "tiny", validation_alias=AliasChoices("model", "preset"),  # "preset" before other models
        description="a shipped preset, a path to a config.json or a model folder, or a Hub id in "
        "the local cache; its head follows the config's architectures: a causal LM (a "
        "vision-language model's, on its text), a sequence, token or image classifier, or "
        "sequence to sequence",
        json_schema_extra={"label": "Model", "suggestions": list(PRESETS),
                           "metavar": "NAME|PATH|HUB_ID"})
    batch_size: Whole = option(4, "Batch size", "per_device_train_batch_size", 1, 4096)
    seq_len: Whole = option(512, "Sequence length", "tokens per sequence of the dummy data, at "
                            "most the model's positions (a sequence-to-sequence model's source "
                            "and target each; image models take their config's image size "
                            "instead, a dataset's run its texts' lengths)", 1, 1_048_576)
    target_len: Whole = option(0, "Target length", "a sequence-to-sequence model's target "
                               "tokens (a summary's, a translation's; 0: as many as the "
                               "sequence length)", 0, 1_048_576)
    dataset_size: Whole = option(512, "Dataset size", "random sequences in the dummy dataset (at "
                                 "least one batch for every process: grown to it where smaller); "
                                 "a dataset's run sets it to its texts", 1, 10_000_000)
    epochs: Whole = option(1, "Epochs", "num_train_epochs (ignored when max steps is set)", 1, 1000)
    max_steps: Whole | None = option(None, "Max steps", "optimizer steps; overrides epochs when set",
                                     1, 10_000_000, unset="the epochs decide")
    precision: Precision = option(Precision.FP32, "Precision",
                                  "fp32, or mixed precision fp16 / bf16")
    weights: Weights = option(Weights.FP32, "Weights", "the weights' type as the model is "
                              "loaded: fp32 (mixed precision autocasts over them), or bf16 "
                              "throughout (from_pretrained's dtype=torch.bfloat16: half the "
                              "weights, gradients and optimizer states)")
    attention: Attention = option(Attention.SDPA, "Attention", "the attention the model is "
                                  "built with: sdpa (transformers' own choice; eager for a "
                                  "model with no other) or eager (its attention weights kept "
                                  "for the backward pass: the sequence length squared)")
    gradient_checkpointing: Flag = option(False, "Gradient checkpointing",
                                          "recompute activations in the backward pass")
    grad_accum: Whole = option(1, "Gradient accumulation steps", "gradient_accumulation_steps",
                               1, 1024)
    optim: Optimizer = option(Optimizer.ADAMW_TORCH, "Optimizer", "the Trainer's optim name")
    label_smoothing: Share = option(0.0, "Label smoothing", "the Trainer's label_smoothing_factor "
                                    "(its own loss on the logits, their log-probabilities kept "
                                    "for the backward pass; 0: the model's loss)", 0, 1)
    seed: Whole = option(42, "Seed", "seed for the dummy data and the weights", 0, 2**32 - 1)
    sample_rate: Whole = option(200, "Sample rate (Hz)", "memory samples per second per GPU",
                                1, 2000)
    gpu: GpuIndex = option(0, "GPU index", "which visible GPU trains (0 without a GPU)")
    gpus: tuple[GpuIndex, ...] = option(
        (), "GPUs", "several visible GPUs that train together, comma-separated (0,1): one process "
        "per GPU, launched through accelerate; empty: the one GPU of --gpu", metavar="I,J")
    processes: Whole = option(1, "Processes", "training processes on a machine without a GPU "
                              "(CPU ranks over gloo, launched through accelerate); with GPUs name "
                              "them with --gpus", 1, 64)
    strategy: Text = option(strategies.DEFAULT, "Strategy", STRATEGY_HELP)
    profile_steps: Whole = option(0, "Profile steps", "after training, profile this many steps "
                                  "with torch.profiler (0: off)", 0, 50)
    lora_rank: Whole = option(0, "LoRA rank", "train LoRA adapters of this rank instead of every "
                              "weight (peft; 0: full fine-tuning)", 0, 4096)
    lora_targets: tuple[str, ...] = option(
        (), "LoRA targets", f"the module names the adapters wrap, or {models.ALL_LINEAR} (every "
        "linear layer but the task's output; default: the architecture's; with a LoRA rank)",
        metavar="MODULE", example=("q_proj", "v_proj"), unset="the architecture's")
    lora_dropout: Share = option(0.0, "LoRA dropout", "the dropout on the adapters' inputs "
                                 "(peft's lora_dropout: each adapted layer keeps its input "
                                 "dropped out, and the mask; with a LoRA rank)", 0, 1)
    frozen: tuple[str, ...] = option(
        (), "Frozen modules", "modules or parameters the training leaves as they are "
        "(requires_grad=False: no gradients, no optimizer states; their activations kept only "
        "where a trained layer needs them), by their dotted names as named_modules writes them, "
        "each covering everything under it: embeddings, a vision tower, the lower layers "
        "(empty: every weight trains; not with LoRA, which freezes all but its adapters)",
        metavar="MODULE", example=("model.embed_tokens", "model.layers.0"), unset="none")
    dataset: Text = option("", "Dataset", "train on a dataset's texts instead of the dummy data: "
                           "a folder saved with save_to_disk (a Dataset or a DatasetDict), a "
                           "JSON (lines), CSV, TSV, Parquet, Arrow or text file (one text a "
                           "line), each also .gz, .bz2 or .xz, a folder of them (a dataset's "
                           "repository: splits by their names, train.jsonl, data/test-….parquet), "
                           "or a Hub id in the local cache (empty: the dummy data)",
                           metavar="PATH|HUB_ID")
    split: Text = option("", "Split", "the dataset's split (empty: train, or its only one)",
                         metavar="S")
    text_column: Text = option("", "Text column", "the dataset's column of texts, or of "
                               "conversations (a list of messages, each a role and its content: "
                               "the tokenizer's chat template makes text of them), or two joined "
                               "by + (prompt+completion: each prompt followed by its "
                               "completion; a classifier reads sentence1+sentence2 as a pair); "
                               "empty: text, else messages, else prompt+completion, else the "
                               "dataset's one column of text",
                               metavar="C")
    tokenizer: Text = option("", "Tokenizer", "the fast tokenizer for the dataset's texts: a "
                             "folder saved with save_pretrained, or a Hub id in the local cache "
                             "(empty: the model's own, where its folder holds one)",
                             metavar="NAME|PATH")
    padding: Literal[PADDINGS] = option(  # type: ignore[valid-type]
        LONGEST, "Padding", "how a batch of texts is padded: longest (to its longest text, as "
        "DataCollatorWithPadding does) or max_length (every batch to max length)")
    max_length: Whole = option(0, "Max length", "texts are cut at this many tokens, and padding "
                               "max_length pads to it (0: the model's longest sequence)",
                               0, 1_048_576)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_list(cls, value: Any) -> Any:
        """The GPUs as the CLI and a stored run write them ("0,1"), or as the form picks them
        ([0, 1]): each named once, by ASCII digits (the pages' run ids are read alike)."""
        if isinstance(value, str):
            entries = [e.strip() for e in value.split(",")]
            if value.strip() and not all(entries):
                raise ValueError(f"{value!r} has an empty entry: name each GPU once, "
                                 "comma-separated (e.g. 0,1)")
            wrong = next((e for e in entries if e and checks.digits(e) is None), None)
            if wrong is not None:
                raise ValueError(f"{wrong!r} is not a GPU index (comma-separated, e.g. 0,1)")
            value = tuple(checks.digits(e) for e in entries if e)
        if isinstance(value, (list, tuple)):
            twice = next((g for i, g in enumerate(value) if g in value[:i]), None)
            if twice is not None:
                raise ValueError(f"GPU {twice} is named twice")
        return value

    @field_validator("strategy")
    @classmethod
    def _registered(cls, value: str) -> str:
        """A registered strategy's name, as the registry is when the options are read (a
        strategy's module may register itself after this one loaded)."""
        try:
            return strategies.named(value).name
        except strategies.UnknownStrategy as error:
            raise ValueError(str(error)) from None

    @field_validator("lora_targets", "frozen", mode="before")
    @classmethod
    def _module_list(cls, value: Any, info: ValidationInfo) -> Any:
        """The module names as a stored run writes them ("q_proj,v_proj") or the CLI takes them
        (`--lora-targets q_proj v_proj`, or q_proj,v_proj)."""
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
            return value  # the declared type refuses it, in its words
        names = tuple(t.strip() for item in value for t in item.split(",") if t.strip())
        peft_word = models.ALL_LINEAR if info.field_name == "lora_targets" else None
        wrong = next((t for t in names if not _TARGET.match(t) and t != peft_word), None)
        if wrong is not None:
            example = "q_proj,v_proj" if peft_word else "model.embed_tokens,model.layers.0"
            raise ValueError(f"{wrong!r} is not a module name (comma-separated names such as "
                             f"{example})")
        if peft_word in names and len(names) > 1:
            raise ValueError(f"{models.ALL_LINEAR} names every linear layer already: give it "
                             "alone, as peft takes it")
        return names

    @field_serializer("gpus", "lora_targets", "frozen")
    def _comma_separated(self, value: tuple) -> str:
        return ",".join(str(v) for v in value)

    @property
    def preset(self) -> str:
        """The model option's old name (runs stored before other models came say "preset")."""
        return self.model

    @property
    def on_dataset(self) -> bool:
        """It trains on a dataset's texts (`dataset`), not on the dummy data."""
        return bool(self.dataset.strip())

    def applies(self, name: str) -> bool:
        """Whether option `name` shapes this run: one on a dataset ignores the sequence length
        and the dataset size (its texts decide both), one on the dummy data the dataset's
        settings (but `dataset` itself, whose empty value says so), one without LoRA the LoRA
        dropout (its rank says there is none)."""
        if name == "lora_dropout" and not self.lora:
            return False
        if self.on_dataset:
            return name not in DATA_DECIDES
        return name not in DATA_FIELDS[1:]

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    def gpu_list(self) -> tuple[int, ...]:
        """The visible GPUs (torch's indices) it trains on: those of `gpus`, else `gpu` alone."""
        return self.gpus or (self.gpu,)

    @property
    def world_size(self) -> int:
        """Training processes: one per GPU of `gpus`, else `processes` (1: a single process)."""
        return len(self.gpus) if len(self.gpus) > 1 else self.processes

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """The options as a run stores them: plain JSON values, in the declaration's order."""
        return _SERIALIZER.to_python(self, mode="json")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunOptions:
        """The options of a stored run: those this anatomy does not know left out, those added
        since at their defaults (it ran with them), the model under its old name "preset" too.
        A value a newer or older anatomy allowed and this one does not takes its default (the
        run's stored options still show it as stored)."""
        values = {k: v for k, v in data.items() if k in NAMES}
        if "model" not in values and "preset" in data:
            values["model"] = data["preset"]
        try:
            return cls(**values)
        except ValidationError as error:
            wrong = {str(e["loc"][0]) for e in error.errors()}
            return cls(**{k: v for k, v in values.items() if k not in wrong})

    @classmethod
    def read(cls, values: Mapping[str, Any]) -> RunOptions:
        """Options a front gives (the CLI's flags, the form's widgets, an import's JSON, a sweep's
        values), judged by the declaration and by the rules between options; InvalidOptions with
        a message for each wrong field. The machine's judgement is `check`'s."""
        options, errors = _read(values)
        if errors:
            raise InvalidOptions(errors)
        return options

    @property
    def samples(self) -> int:
        """The dummy dataset's length: `dataset_size`, grown to one full batch for every process
        where it holds less. A Trainer over fewer samples than a batch trains a smaller batch than
        asked, and what a run reads would be that batch's memory, not the one it was asked (and
        predicted) for: `sweep --from-prediction` at 1,828 trained batches of 512 on the H200."""
        return max(self.dataset_size, self.batch_size * self.world_size)

    def located(self) -> RunOptions:
        """The options with each file they name as its absolute path (the model's folder or
        config, the dataset, the tokenizer): a run stores where its files were, not where its
        front stood, so that a run started from another folder, or the form's absolute path, is
        the same run. Presets, Hub ids and paths that are not there stay as given."""
        return replace(self, model=located(self.model, model=True),
                       dataset=located(self.dataset), tokenizer=located(self.tokenizer))

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
        batches = -(-self.samples // (self.batch_size * self.world_size))
        return max(1, batches // self.grad_accum) * self.epochs


NAMES = tuple(f.name for f in fields(RunOptions))
_SERIALIZER = RunOptions.__pydantic_serializer__


# What a user's training reports is held to what each value is, not to anatomy's own runs'
# limits (a user's Trainer takes batches the form refuses): a whole number from 0, a number.
Count = Annotated[int, Strict(), Field(ge=0, le=checks.MAX_INTEGER)]
# TrainingArguments' epochs are 3.0, ours 1: each read as it was written.
Amount = (Annotated[int, Strict(), Field(ge=0)]
          | Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)])


@pydantic_dataclasses.dataclass(frozen=True, config=ConfigDict(extra="ignore"))
class ReportedOptions:
    """The options of a run a user's own training recorded (the callback, the phase API, a
    watched command), by RunOptions' names: only what it reported — none at all,
    TrainingArguments' epochs 3.0, an optim anatomy does not run —, every field optional: None
    is "not said", never a default it did not use. A run's source says which of the two it
    stored (analysis/report.py's `known_options`); its JSON is stored as it was reported."""

    model: Text | None = None
    batch_size: Count | None = None
    seq_len: Count | None = None  # its training set's first example's, where it was read
    target_len: Count | None = None  # a sequence-to-sequence model's, where it differs
    epochs: Amount | None = None
    max_steps: Count | None = None
    precision: Precision | None = None
    weights: Weights | None = None
    attention: Attention | None = None
    gradient_checkpointing: Flag | None = None
    grad_accum: Count | None = None
    optim: Text | None = None  # the Trainer's name, whichever it took
    label_smoothing: Amount | None = None
    seed: Count | None = None
    lora_rank: Count | None = None
    lora_targets: Text | None = None  # comma-separated, as runs store them
    lora_dropout: Amount | None = None
    frozen: Text | None = None  # comma-separated, as runs store them: what the script froze

    @field_validator("model", "optim", "lora_targets", "frozen")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        """Text a store can hold (UTF-8, which a lone surrogate is not)."""
        if value is not None:
            try:
                checks.encodable(value, "")
            except checks.InvalidValue as error:
                raise ValueError(error.what) from None
        return value

    @classmethod
    def read(cls, values: Mapping[str, Any], where: str) -> ReportedOptions:
        """Reported options as an import reads them: InvalidValue naming the first wrong one
        (`where.name`), in the words of every stored value's check (anatomy/store/checks.py)."""
        try:
            return cls(**values)
        except ValidationError as error:
            first = error.errors()[0]
            name = str(first["loc"][0])
            raise checks.InvalidValue(f"{where}.{name}", _reported_words(name, first)) from None

    def beyond(self) -> dict[str, str]:
        """What it reported that anatomy's own runs do not take, by field, in the words of a
        refusal ("optim: 'paged_adamw_8bit' is not one of …"): an optimizer of bitsandbytes, a
        batch size beyond the form's limit. A prediction of the run would put the default in its
        place. Only what shapes the memory of a step: the model (its config is read instead),
        the epochs and steps, the seed are not judged."""
        reported = {name: value for name, value in _SERIALIZER_REPORTED.to_python(
            self, mode="json").items() if value is not None and name not in UNJUDGED}
        _, errors = _read(reported)
        return {name: errors[name] for name in reported if name in errors}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ReportedOptions:
        """The options of a stored run: a value that fails its type is not read (None), as a
        stored fact that fails its check is seen by no reader."""
        try:
            return cls(**values)
        except ValidationError as error:
            wrong = {str(e["loc"][0]) for e in error.errors()}
            return cls(**{k: v for k, v in values.items() if k not in wrong})


_SERIALIZER_REPORTED = ReportedOptions.__pydantic_serializer__
# What a user's training reports that a prediction does not read, or reads from elsewhere.
UNJUDGED = ("model", "epochs", "max_steps", "seed")


def _reported_words(name: str, error: Any) -> str:
    """A reported value's refusal, by the kind its field declares."""
    declared = ReportedOptions.__dataclass_fields__[name].type
    value = checks.shown(error["input"])
    if declared.startswith("Count"):
        return f"must be a whole number from 0 to {checks.MAX_INTEGER}, got {value}"
    if declared.startswith("Amount"):
        return f"must be a finite number from 0, got {value}"
    if declared.startswith("Flag"):
        return f"must be true or false, got {value}"
    if declared.startswith("Precision"):
        return f"{value} is not one of {', '.join(Precision.values())}"
    if error["type"] == "value_error":  # the validator's own words
        return str(error["ctx"]["error"])
    return f"must be text, got {value}"


def lora_words(options: RunOptions | ReportedOptions) -> str:
    """A run's LoRA in a few words, "LoRA rank 8, dropout 0.05" ("" without LoRA): one way for
    every page and line that names it."""
    if not options.lora_rank:
        return ""
    dropout = f", dropout {options.lora_dropout:g}" if options.lora_dropout else ""
    return f"LoRA rank {options.lora_rank}{dropout}"


def smoothing_words(options: RunOptions | ReportedOptions) -> str:
    """", label smoothing 0.1" where the Trainer smoothed its labels (its own loss on the
    logits); "" where it did not: after the precision and the weights, in every line that names
    them."""
    factor = options.label_smoothing
    return f", label smoothing {factor:g}" if factor else ""


def option_words(options: RunOptions | ReportedOptions) -> str:
    """"bf16, bf16 weights, label smoothing 0.1, eager attention, model.embed_tokens frozen":
    the precision and what follows it in every line that names a run's options (a run that
    said no precision: "")."""
    if not options.precision:
        return ""
    return (f"{options.precision}{weights_words(options)}{smoothing_words(options)}"
            f"{attention_words(options)}{frozen_words(options)}")


FROZEN_NAMED = 3  # frozen modules a line names; beyond, how many more


def frozen_words(options: RunOptions | ReportedOptions) -> str:
    """", model.embed_tokens frozen" where the training left modules as they are ("" where
    every weight trains): after the precision, in every line that names a run's options."""
    names = options.frozen.split(",") if isinstance(options.frozen, str) else options.frozen
    if not names:
        return ""
    more = f" and {len(names) - FROZEN_NAMED} more" if len(names) > FROZEN_NAMED else ""
    return f", {', '.join(names[:FROZEN_NAMED])}{more} frozen"


def attention_words(options: RunOptions | ReportedOptions) -> str:
    """", eager attention" where the model was built with it (its attention weights kept);
    "" for transformers' own choice: after the precision, in every line that names them."""
    return ", eager attention" if options.attention == Attention.EAGER else ""


def weights_words(options: RunOptions | ReportedOptions) -> str:
    """", bf16 weights" where the weights are not fp32 (which mixed precision autocasts over,
    and no line names): after the precision, in every line that names a run's."""
    weights = options.weights
    return f", {weights} weights" if weights not in (None, Weights.FP32) else ""


class Kind(Name):
    """What kind of value an option takes: how a front asks for it."""

    NUMBER = "number"  # a number within its limits: whole, or a share (`OptionField.whole`)
    FLAG = "flag"
    CHOICE = "choice"  # one of `choices`
    TEXT = "text"  # free text (`choices`, where given, are suggestions: the model's presets)
    LIST = "list"  # several values: GPUs, module names


class OptionField(NamedTuple):
    """One option as the fronts show it, read from RunOptions' declaration (never written here
    by hand): its label and help, its limits, its choices."""

    name: str
    label: str
    help: str
    kind: Kind
    default: Any
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None is a value: `unset` says what it means
    unset: str | None = None  # what None (or a list's emptiness) means
    metavar: str | None = None
    old_names: tuple[str, ...] = ()  # names stored runs and the CLI still take (preset)
    example: tuple[str, ...] = ()  # several values, as each front writes them (LoRA targets)
    whole: bool = True  # a number's kind: a whole number, or any between its limits (a share)

    @property
    def free_text(self) -> bool:
        return self.kind in (Kind.TEXT, Kind.LIST)

    @property
    def is_flag(self) -> bool:
        return self.kind == Kind.FLAG

    def limits(self) -> str:
        """"1 to 4096": the range a message and a help text name."""
        return f"{self.low} to {self.high}"


def _described(name: str) -> OptionField:
    info = RunOptions.__pydantic_fields__[name]
    extra = info.json_schema_extra or {}
    bounds = [m for m in info.metadata if hasattr(m, "ge") or hasattr(m, "le")]
    low = next((m.ge for m in bounds if hasattr(m, "ge")), None)
    high = next((m.le for m in bounds if hasattr(m, "le")), None)
    kind, choices = Kind.NUMBER, None
    annotation = RunOptions.__dataclass_fields__[name].type
    default = info.default
    if isinstance(default, Name):
        kind, choices = Kind.CHOICE, type(default).values()
    elif annotation.startswith("Literal"):
        kind, choices = Kind.CHOICE, PADDINGS
    elif isinstance(default, bool):
        kind = Kind.FLAG
    elif isinstance(default, tuple):
        kind = Kind.LIST
    elif isinstance(default, str):
        kind = Kind.TEXT
        choices = tuple(extra["suggestions"]) if "suggestions" in extra else None
    aliases = getattr(info.validation_alias, "choices", [name])
    return OptionField(name, extra["label"], info.description, kind, default, low, high, choices,
                       optional="None" in annotation, unset=extra.get("unset"),
                       metavar=extra.get("metavar"), example=tuple(extra.get("example", ())),
                       old_names=tuple(a for a in aliases if a != name),
                       whole=not isinstance(default, float))


def strategy_field() -> OptionField:
    """The strategy option as the fronts show it, as the registered strategies describe
    themselves (read as options is loaded: a strategy registered later is offered once this is
    read again); the option itself is judged against the registry as it is when it is read."""
    return _described("strategy")._replace(
        help=f"{STRATEGY_HELP}: {strategies.described()}", kind=Kind.CHOICE,
        choices=strategies.names())


FIELDS: dict[str, OptionField] = {name: _described(name) for name in NAMES}
FIELDS["strategy"] = strategy_field()
# The fields that describe the dataset a run trains on; empty or default without one.
DATA_FIELDS = ("dataset", "split", "text_column", "tokenizer", "padding", "max_length")
# What a run on a dataset takes from its texts instead of these options: their lengths, their count.
DATA_DECIDES = ("seq_len", "target_len", "dataset_size")


def _message(field: OptionField, error: Any) -> str:
    """A pydantic error in the project's one-line words: the field, the value, its limits."""
    kind, value, name = error["type"], error["input"], field.name
    if kind.startswith("int_") and field.low is not None:
        return f"{name}: must be a whole number from {field.limits()}, got {checks.shown(value)}"
    if kind.startswith("float_") or kind == "finite_number":
        return f"{name}: must be a number from {field.limits()}, got {checks.shown(value)}"
    if kind in ("greater_than_equal", "less_than_equal"):
        limits = FIELDS["gpu"] if name == "gpus" else field  # each of the GPUs: a GPU index
        return f"{name}: {checks.shown(value)} is out of range: {limits.limits()}"
    if kind in ("enum", "literal_error"):
        return f"{name}: {checks.shown(value)} is not one of {', '.join(field.choices)}"
    if kind == "bool_type":
        return f"{name}: must be true or false"
    if name == "gpus" and len(error["loc"]) > 1:  # an entry that is no index
        return f"{name}: {checks.shown(value)} is not a GPU index (comma-separated, e.g. 0,1)"
    if kind == "string_type" or (field.kind == Kind.LIST and kind.endswith("_type")):
        return f"{name}: must be text, got {checks.shown(value)}"
    if kind == "value_error":  # the validators' own words (gpus, lora_targets)
        return f"{name}: {error['ctx']['error']}"
    return f"{name}: {error['msg']}"


def _read(values: Mapping[str, Any]) -> tuple[RunOptions, dict[str, str]]:
    """The options, and a message for each wrong field. Where some are wrong, the others are
    still judged (each with the rest at their defaults): every wrong field is named at once."""
    values = dict(values)
    if "model" not in values and "preset" in values:
        values["model"] = values.pop("preset")
    values.pop("preset", None)
    unknown = [k for k in values if k not in NAMES]
    errors = {k: f"{k}: not an option (one of {', '.join(NAMES)})" for k in unknown}
    known = {k: v for k, v in values.items() if k in NAMES}
    try:
        options = RunOptions(**known)
    except ValidationError as error:
        for found in error.errors():
            name = str(found["loc"][0])
            errors.setdefault(name, _message(FIELDS[name], found))
        options = RunOptions(**{k: v for k, v in known.items() if k not in errors})
    options = _model_tokenizer(options)
    errors.update(_rule_errors(options, errors))
    return options, errors


def _model_tokenizer(options: RunOptions) -> RunOptions:
    """Options on a dataset that name no tokenizer take the model's own where its folder holds
    one (`models.own_tokenizer`), as `AutoTokenizer.from_pretrained(model)` would: a model
    folder saved with its tokenizer needs no second name for it."""
    if not options.on_dataset or options.tokenizer.strip():
        return options
    own = models.own_tokenizer(options.model)
    return replace(options, tokenizer=own) if own else options


def _rule_errors(options: RunOptions, errors: dict[str, str]) -> dict[str, str]:
    """What options cannot be together, whatever the machine: LoRA targets or a dropout without
    a rank, frozen modules with LoRA, bf16 weights under fp16 mixed precision, a dataset's
    settings without a dataset or a dataset without its tokenizer, and what one process alone
    does (profiling) kept to one. A strategy's own rules are the machine's (`check`)."""
    found: dict[str, str] = {}
    if options.lora_targets and not options.lora and not {"lora_targets", "lora_rank"} & set(errors):
        found["lora_targets"] = "lora_targets: set a LoRA rank too (--lora-rank R)"
    if options.weights == Weights.BF16 and options.precision == Precision.FP16 and \
            not {"weights", "precision"} & set(errors):
        found["weights"] = ("weights: bf16 weights train with precision bf16 or fp32 (fp16 mixed "
                            "precision keeps fp32 weights)")
    if options.lora_dropout and not options.lora and not {"lora_dropout", "lora_rank"} & set(errors):
        found["lora_dropout"] = "lora_dropout: set a LoRA rank too (--lora-rank R)"
    if options.frozen and options.lora and not {"frozen", "lora_rank"} & set(errors):
        found["frozen"] = ("frozen: LoRA freezes every weight but its adapters already (leave "
                           "frozen empty, or the LoRA rank 0)")
    if not any(name in errors for name in DATA_FIELDS):
        if not options.on_dataset:
            for name in DATA_FIELDS[1:]:
                if getattr(options, name) != FIELDS[name].default:
                    found[name] = (f"{name}: {checks.shown(getattr(options, name))} is a setting "
                                   "of a dataset's texts, and the run trains on the dummy data: "
                                   "give --dataset too")
        elif not options.tokenizer.strip():
            found["tokenizer"] = ("tokenizer: a dataset's texts need one: a folder saved with "
                                  "save_pretrained, or a Hub id in the local cache (the "
                                  "model's own where its folder holds a tokenizer.json)")
            # said now, not once a tokenizer is given: the data's own checks wait for it
            from anatomy.analysis import data

            if (gone := data.missing(options.dataset)) is not None:
                found["dataset"] = str(gone)
    if options.distributed and options.profile_steps > 0 and \
            not {"gpus", "processes", "profile_steps"} & set(errors):
        found["profile_steps"] = "profile_steps: profiling is for a single process (use 0)"
    return found


def located(text: str, model: bool = False) -> str:
    """A file option's value as a run stores it (RunOptions.located): an absolute path where it
    names a file or folder here, else as given (a `model`'s preset names itself first)."""
    if not text or (model and models.is_preset(text)):
        return text
    try:
        path = Path(text).expanduser()
        return str(path.resolve()) if path.exists() else text
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return text


@dataclass(frozen=True)
class Checked:
    """Options judged whole for a machine with `gpu_count` GPUs (`validated`): what the manager
    starts and a prediction predicts without judging them again."""

    options: RunOptions
    gpu_count: int


def validated(values: Mapping[str, Any] | RunOptions, gpu_count: int, *,
              resolve_model: bool = True, here: bool = True,
              config_class: bool = True) -> Checked:
    """The options of one action (a run, a prediction, a sweep's run), judged once: the
    declaration, the rules between options and the machine's (`check`, whose keywords these
    are). InvalidOptions naming every wrong field; nothing has started."""
    if isinstance(values, RunOptions):
        options = _model_tokenizer(values)
        errors = _rule_errors(options, {})
    else:
        options, errors = _read(values)
    errors.update(check(options, gpu_count, errors, resolve_model=resolve_model, here=here,
                        config_class=config_class))
    if errors:
        raise InvalidOptions(errors)
    return Checked(options, gpu_count)


def validate(options: Mapping[str, Any] | RunOptions, gpu_count: int, **judged: bool
             ) -> dict[str, str]:
    """Every message these options would be refused with here, by field (empty: they may start):
    `validated`'s, as messages."""
    try:
        validated(options, gpu_count, **judged)
    except InvalidOptions as error:
        return error.errors
    return {}


def check(options: RunOptions, gpu_count: int, errors: Mapping[str, str] = {}, *,
          resolve_model: bool = True, here: bool = True,
          config_class: bool = True) -> dict[str, str]:
    """What the machine and the model refuse of options the declaration accepts (`errors`: the
    fields refused already, not judged again). `gpu_count` is the number of GPUs a run can use
    here: those CUDA_VISIBLE_DEVICES leaves visible. `resolve_model=False` judges the options
    alone, not whether this machine has the model (an imported run may name a config file that
    stayed on another machine); `here=False` leaves out what depends on this machine's kind (CPU
    processes, FSDP's GPUs: an imported run); `config_class=False` leaves transformers' own checks
    of the config to a caller that builds the config itself (the prediction: the same line,
    without a child interpreter's seconds)."""
    found: dict[str, str] = {}
    judged = {**errors}
    if resolve_model and "model" not in judged:
        found.update(_model_errors(options, judged, config_class))
    if "gpu" not in judged:
        if gpu_count == 0 and options.gpu != 0:
            found["gpu"] = f"gpu: {options.gpu} is out of range: this machine has no GPU (use 0)"
        elif gpu_count and options.gpu >= gpu_count:
            found["gpu"] = f"gpu: {options.gpu} is out of range: 0 to {gpu_count - 1}"
    if not {"gpus", "processes", "strategy"} & set(judged):
        found.update(_machine_process_errors(options, gpu_count, here))
    if gpu_count == 0 and options.precision == Precision.FP16 and "precision" not in judged:
        found["precision"] = "precision: fp16 needs a GPU; this machine has none (use fp32 or bf16)"
    return found


def _model_errors(options: RunOptions, errors: dict[str, str], config_class: bool
                  ) -> dict[str, str]:
    """What the model cannot do: a name that resolves to nothing, sequences longer than its
    positions, checkpointing where it has none, eager attention where it has no other, LoRA
    targets that are none of its layers, frozen names that are none of its modules or freeze
    them all (these load transformers, and only when asked for), a dataset it cannot read."""
    found: dict[str, str] = {}
    try:
        spec = models.resolve(options.model)
        if config_class:
            models.check_config_class(spec)
    except ModelError as error:
        return {"model": str(error)}
    positions = spec.max_positions
    # A dataset's texts are cut at the model's positions: its seq_len is not read.
    if "seq_len" not in errors and spec.task != IMAGE_CLASSIFICATION and positions \
            and options.seq_len > positions and options.applies("seq_len"):
        found["seq_len"] = (f"seq_len: {options.seq_len} is out of range for "
                            f"{spec.display_name}: 1 to {positions}")
    if "target_len" not in errors and options.target_len and options.applies("target_len"):
        if spec.task != models.SEQ2SEQ:
            found["target_len"] = (f"target_len: {spec.display_name} is no sequence-to-sequence "
                                   f"model ({spec.task}): it has no target (leave it 0)")
        elif positions and options.target_len > positions:
            found["target_len"] = (f"target_len: {options.target_len} is out of range for "
                                   f"{spec.display_name}: 1 to {positions}")
    try:
        if options.gradient_checkpointing and not models.supports_checkpointing(spec):
            found["gradient_checkpointing"] = (
                f"gradient_checkpointing: {spec.display_name} ({spec.head or spec.model_type}) "
                "cannot recompute its activations (transformers does not support gradient "
                "checkpointing for it)")
        if options.attention == Attention.EAGER and "attention" not in errors and \
                not models.supports_sdpa(spec):
            found["attention"] = (
                f"attention: {spec.display_name} ({spec.head or spec.model_type}) has no sdpa "
                "attention that eager would replace: it would change nothing (leave it sdpa)")
        if not {"lora_targets", "lora_rank"} & set(errors) and options.lora:
            targets = options.lora_targets
            unknown = models.unknown_lora_targets(spec, targets) if targets else []
            if unknown:
                words = "; ".join(models.unknown_target_words(spec, t) for t in unknown)
                layers = ", ".join(models.linear_module_names(spec)[:12])
                found["lora_targets"] = (f"lora_targets: {words} (the layers LoRA can adapt:"
                                         f" {layers})")
            elif not targets:
                models.default_lora_targets(spec)
            elif problem := models.rank_problem(spec, options.lora_rank, targets):
                found["lora_targets"] = problem
        if options.frozen and not {"frozen", "lora_rank"} & set(errors):
            problem = models.frozen_problem(spec, options.frozen)
            if problem:
                found["frozen"] = problem
    except ModelError as error:
        found["model"] = str(error)
    if options.on_dataset and "model" not in found and \
            not any(name in errors for name in DATA_FIELDS):
        from anatomy.analysis import data

        found.update(data.problems(options, spec))
    return found


def _machine_process_errors(options: RunOptions, gpu_count: int, here: bool) -> dict[str, str]:
    """Several processes on this machine: GPUs that are visible; CPU ranks only without a GPU;
    what the strategy refuses (anatomy/strategies/)."""
    gpus = options.gpus
    if gpus and gpu_count == 0 and here:
        return {"gpus": "gpus: this machine has no GPU (without one, --processes N trains on N"
                        " CPU processes)"}
    beyond = next((g for g in gpus if gpu_count and g >= gpu_count), None)
    if beyond is not None:
        return {"gpus": f"gpus: {beyond} is out of range: 0 to {gpu_count - 1}"}
    found: dict[str, str] = {}
    if options.processes > 1 and here:
        if gpu_count and len(gpus) > 1 and options.processes != len(gpus):
            found["processes"] = (f"processes: {options.processes} does not match the "
                                  f"{len(gpus)} GPUs of --gpus: one process per GPU (leave"
                                  " --processes out)")
        elif gpu_count and len(gpus) <= 1:
            found["processes"] = ("processes: CPU processes are for a machine without a GPU;"
                                  " here name the GPUs: --gpus 0,1")
    refused = strategies.named(options.strategy).problems(options.world_size, gpu_count, here)
    if refused:
        found["strategy"] = refused
    return found


CPU_SEQ_LEN = 128  # the walkthrough's 512 makes a CPU demo take minutes; 128 takes seconds


def defaults_for(has_gpu: bool) -> RunOptions:
    """Defaults that fit the machine: the walkthrough's run on a GPU (bert-large, batch size 4,
    512 × 512); on a CPU the tiny BERT on sequences of 128, a demo of a minute or a few on a busy
    machine (the form says how long before Start: analysis/duration.py)."""
    if has_gpu:
        return RunOptions(model=default_preset(True))
    return RunOptions(model=default_preset(False), seq_len=CPU_SEQ_LEN)
