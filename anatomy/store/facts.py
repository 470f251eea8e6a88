"""A run's facts as typed records: what its row's JSON columns hold (environment, summary, source,
origin), read by field, never by string key.

Each record is a frozen dataclass whose fields are checked when it is built from JSON
(`from_dict`): an import builds them strictly, so a wrong value is refused in one line that says
where it is (`environment.world_size: must be a whole number from 1 to 65535, got 'two'`); the
store reads what it wrote leniently (a value that fails its check is kept as stored, beside the
fields, and no reader sees it). A key this anatomy does not know (a newer one's, a user's own
fact) is kept too, and `to_dict` writes the record back key for key, in the order it was read:
a stored run prints as it always did (as transformers' TrainerState round-trips its JSON).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, TypeVar

from anatomy import strategies
from anatomy.store import checks
from anatomy.store.checks import MAX_EPOCH, MAX_GPUS, MAX_RANK, Check, InvalidValue
from anatomy.vocabulary import TENSOR_PARTS, Attention, Precision, SourceKind, Weights

R = TypeVar("R", bound="Record")


def fact(check: Check, default: Any = None) -> Any:
    """A record's field and the check its stored value passes."""
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True, kw_only=True)
class Record:
    """The common part of the records: the keys it does not know and the order it was read in."""

    # What a newer anatomy (or a user's describe()) stored, and values that failed their check
    # in a lenient read: kept as they came, seen by no reader.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    stored_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    KEEP_NULLS: ClassVar[bool] = True  # a stored null is written back (False: left out)

    @classmethod
    def _checks(cls) -> dict[str, Check]:
        return {f.name: f.metadata["check"] for f in fields(cls) if "check" in f.metadata}

    @classmethod
    def from_dict(cls: type[R], values: Any, where: str = "", strict: bool = True) -> R:
        """The record from its JSON object. `strict`: a wrong value raises InvalidValue (an
        import); else it is kept aside, as stored (the store's own rows)."""
        values = checks.obj(values, where) if strict else dict(values or {})
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        checked = cls._checks()
        for key, value in values.items():
            here = f"{where}.{key}" if where else key
            check = checked.get(key)
            try:
                if check is None:
                    if strict:
                        checks.encodable(key, f"{where or 'the object'} (a key)")
                        checks.plain(value, here)
                    extra[key] = value
                else:
                    known[key] = check(value, here)
            except InvalidValue:
                if strict:
                    raise
                extra[key] = value
        return cls(**known, extra=extra, stored_order=tuple(values))

    @classmethod
    def of(cls: type[R], **values: Any) -> R:
        """The record from these fields, checked, kept in the order given, a None given kept as
        a stored null (what a writer says, as it says it)."""
        unknown = set(values) - set(cls._checks())
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
        return cls.from_dict(values, cls.__name__)

    def to_dict(self) -> dict[str, Any]:
        """As read (its keys in their order), then what was set since, in field order."""
        names = list(self._checks())
        order = [*self.stored_order, *(n for n in names if n not in self.stored_order),
                 *(k for k in self.extra if k not in self.stored_order)]
        out = {}
        for name in order:
            if name in self.extra:
                out[name] = self.extra[name]
                continue
            value = getattr(self, name, None)
            if value is None and (name not in self.stored_order or not self.KEEP_NULLS):
                continue
            out[name] = _json(value)
        return out

    def merged(self: R, other: R) -> R:
        """This record with `other`'s values over it (keys added after this one's), as a dict
        update would have them."""
        return type(self).from_dict({**self.to_dict(), **other.to_dict()}, strict=False)


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    return value


def record(kind: type[Record]) -> Check:
    """A check that builds a nested record from its JSON (strictly: the outer record's read
    decides), or takes one built already (a writer's)."""
    def check(value: Any, where: str) -> Record | None:
        if value is None or isinstance(value, kind):
            return value
        return kind.from_dict(value, where)
    return check


@dataclass(frozen=True)
class TrainingArguments(Record):
    """What a user's Trainer was given, by anatomy's option names (the callback reads them)."""

    batch_size: int | None = fact(checks.count)
    grad_accum: int | None = fact(checks.count)
    precision: Precision | None = fact(checks.member(Precision))
    weights: Weights | None = fact(checks.member(Weights))
    attention: Attention | None = fact(checks.member(Attention))  # only where it was eager
    gradient_checkpointing: bool | None = fact(checks.flag)
    optim: str | None = fact(checks.text)
    label_smoothing: float | None = fact(checks.number)  # only where the Trainer smoothed
    seed: int | None = fact(checks.count)
    max_steps: int | None = fact(checks.count)
    epochs: float | None = fact(checks.number)
    lora_rank: int | None = fact(checks.count)
    lora_targets: str | None = fact(checks.text)
    lora_dropout: float | None = fact(checks.number)
    frozen: str | None = fact(checks.text)  # comma-separated: what the script froze itself


def _names(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(checks.text(item, f"{where}[{i}]", optional=False)
                 for i, item in enumerate(checks.array(value, where)))


def _strategy(value: Any, where: str) -> str | None:
    """A registered strategy's name (anatomy/strategies/)."""
    return checks.choice(value, where, strategies.names(), optional=True)


def _world_size(value: Any, where: str) -> int | None:
    return checks.whole(value, where, 1, MAX_RANK + 1, optional=True)


def _length_counts(value: Any, where: str) -> tuple[tuple[int, int], ...] | None:
    """(tokens, texts) pairs: how many texts have each length."""
    if value is None:
        return None
    out = []
    for index, pair in enumerate(checks.array(value, where)):
        here = f"{where}[{index}]"
        if len(checks.array(pair, here)) != 2:
            raise InvalidValue(here, f"must be a pair [tokens, texts], got {checks.shown(pair)}")
        out.append((checks.whole(pair[0], f"{here}[0]"), checks.whole(pair[1], f"{here}[1]")))
    return tuple(out)


@dataclass(frozen=True)
class TrainingData(Record):
    """The dataset a run trained on, as it was read (analysis/data.py): where it came from (a
    path made absolute, or a Hub id), its split and column, the tokenizer, how its batches were
    padded and cut, the tensors the tokenizer gave, and how many texts have each length: what a
    reader predicts the run again from, without the data. And what its files were as the run
    read them, to tell later that the path holds other data (analysis/data.py's `DataStamp`;
    None for a Hub dataset, or a run stored before runs kept it)."""

    dataset: str | None = fact(checks.text)
    split: str | None = fact(checks.text)
    text_column: str | None = fact(checks.text)
    tokenizer: str | None = fact(checks.text)
    padding: str | None = fact(lambda v, w: checks.choice(v, w, ("longest", "max_length"),
                                                          optional=True))
    max_length: int | None = fact(checks.count)  # where texts are cut (None: nowhere)
    inputs: tuple[str, ...] | None = fact(_names)  # besides the token ids
    padding_side: str | None = fact(lambda v, w: checks.choice(v, w, ("right", "left"),
                                                               optional=True))
    lengths: tuple[tuple[int, int], ...] | None = fact(_length_counts)
    # Each file's name, size and modification time, hashed (not datasets' `_fingerprint`: that
    # is known only once the data is loaded, and a saved dataset's is what its state.json says).
    fingerprint: str | None = fact(checks.text)
    file_bytes: int | None = fact(checks.count)  # its files' sizes together
    modified: float | None = fact(checks.number)  # the latest of its files' times (epoch seconds)


@dataclass(frozen=True)
class RunFacts(Record):
    """What a run ran on and with: the machine and its driver (the manager, `watch` or the
    phase API write these), then torch, the model and how the processes shared the work (the
    worker, or the Trainer callback). Fields in the order they are written."""

    driver: str | None = fact(checks.text)
    cuda_driver: str | None = fact(checks.text)
    gpu_count: int | None = fact(lambda v, w: checks.whole(v, w, 0, MAX_GPUS, optional=True))
    host: str | None = fact(checks.text)
    gpus_sampled: tuple[int, ...] | None = fact(checks.wholes(0, MAX_GPUS - 1))  # watch's
    gpu_name: str | None = fact(checks.text)  # None: no GPU (the CPU's RSS is sampled)
    gpu_total: int | None = fact(checks.memory)
    gpu_uuid: str | None = fact(checks.text)
    ram_total: int | None = fact(checks.memory)
    why_no_gpu: str | None = fact(checks.text)
    world_size: int | None = fact(_world_size)  # training processes (None: one)
    strategy: str | None = fact(_strategy)
    gpus: tuple[int, ...] | None = fact(checks.wholes(0, MAX_GPUS - 1))  # rank by rank, NVML's
    # A run across hosts: its hosts in the order they joined, and each rank's host
    # (its index among them), rank by rank; None for a run of one host.
    hosts: tuple[str, ...] | None = fact(_names)
    rank_hosts: tuple[int, ...] | None = fact(checks.wholes(0, MAX_RANK))
    torch: str | None = fact(checks.text)
    torch_cuda: str | None = fact(checks.text)
    transformers: str | None = fact(checks.text)
    device_name: str | None = fact(checks.text)
    weights: str | None = fact(checks.text)  # where the weights came from
    attention: str | None = fact(checks.text)
    parameters: int | None = fact(checks.count)
    trainable_parameters: int | None = fact(checks.count)
    model: str | None = fact(checks.text)
    model_source: str | None = fact(checks.text)
    task: str | None = fact(checks.text)
    image_size: int | None = fact(checks.count)  # an image model's images' side
    distributed_type: str | None = fact(checks.text)
    fsdp_version: int | None = fact(checks.count)
    data: TrainingData | None = fact(record(TrainingData))  # a dataset's, not the dummy data
    training_arguments: TrainingArguments | None = fact(record(TrainingArguments))
    model_class: str | None = fact(checks.text)
    model_name: str | None = fact(checks.text)
    # The model's config (a config file's or folder's as read when the run started, a user's
    # Trainer's as transformers writes it): what every prediction of the run rebuilds it from.
    model_config: Mapping[str, Any] | None = fact(checks.plain_object)
    model_path: str | None = fact(checks.text)  # the file or folder it came from, absolute
    # The inputs other than text a user's training fed its model (pixel_values, input_features:
    # a vision-language model trained with its images), by their forward's names; None where it
    # fed none, or anatomy's own run made the batches (its dummy data, its dataset's texts).
    media_inputs: tuple[str, ...] | None = fact(_names)
    # What a user's training held or did that the prediction does not build, in words: its
    # adapters beyond a LoRA of one rank with a dropout (DoRA, trained biases, LoHa…), weights
    # not in fp32, the Trainer's label smoothing or compilation; None where nothing.
    left_out: tuple[str, ...] | None = fact(_names)
    # A user's Trainer that evaluated once it began training (eval_strategy, or evaluate()
    # after train()): the run's clock at its first evaluation's first batch, and the batch size
    # it evaluated at. What the run held from then on is no training step's: an evaluation's
    # batch, the logits it keeps, the cache it leaves reserved; None where it did not evaluate.
    evaluated_at: float | None = fact(checks.number)
    eval_batch_size: int | None = fact(checks.count)

    @property
    def device(self) -> str:
        """The training device's name: the GPU's, or "CPU"."""
        return self.gpu_name or "CPU"

    @property
    def device_total(self) -> int | None:
        """The training device's memory (a CPU run: the machine's RAM)."""
        return self.gpu_total or self.ram_total


def _moments(value: Any, where: str) -> Mapping[str, int] | None:
    """The allocator at named moments of a step (vocabulary.Moment): bytes by name."""
    if value is None:
        return None
    for key, item in checks.obj(value, where).items():
        checks.encodable(key, f"{where} (a key)")
        checks.memory(item, f"{where}.{key}", optional=False)
    return value


@dataclass(frozen=True)
class Components(Record):
    """Bytes by component (vocabulary.Part); None where this run did not measure one. Fields in
    the order a stored run's JSON lists them; analysis/components.py says how each is measured."""

    weights: int | None = fact(checks.memory)
    activations: int | None = fact(checks.memory)
    gradients: int | None = fact(checks.memory)
    optimizer_states: int | None = fact(checks.memory)
    temporary: int | None = fact(checks.memory)
    allocator_cache: int | None = fact(checks.memory)
    peak_allocated: int | None = fact(checks.memory)
    peak_reserved: int | None = fact(checks.memory)
    moments: Mapping[str, int] | None = fact(_moments)  # the allocator at a step's moments (GPU)
    steps_measured: int | None = fact(checks.count)
    context: int | None = fact(checks.memory)  # the CUDA context: kernel phase − baseline (NVML)
    non_torch: int | None = fact(checks.memory)  # NVML's peak beyond the context and the reserve
    peak: int | None = fact(checks.memory)  # the sampled peak over the baseline
    # The samples of the micro-batch the activations were measured on: a full one's where the
    # run had one (a partial one, an epoch's last, holds fewer), else the largest it had.
    micro_batch: int | None = fact(checks.count)
    # That micro-batch's shape, where it had token ids: the length they were padded to, and each
    # sequence's own tokens (its attention mask's ones, longest first) where it held padding.
    # A collator that pads each batch to its own longest makes it differ batch by batch.
    padded_to: int | None = fact(checks.count)
    sequence_lengths: tuple[int, ...] | None = fact(checks.wholes())

    KEEP_NULLS: ClassVar[bool] = False

    def get(self, part: str) -> int | None:
        """A component by its part (vocabulary.Part), for tables that list them in turn."""
        return getattr(self, part)

    def sum_of(self, parts: tuple[str, ...] = TENSOR_PARTS) -> int | None:
        """The walkthrough's arithmetic: these parts all at once (None if one is missing)."""
        found = [self.get(part) for part in parts]
        return None if any(v is None for v in found) else sum(found)


def _class_totals(value: Any, where: str) -> dict:
    value = checks.obj(value, where, ("time_us", "flops", "count"))
    extra = [key for key in value if key not in ("time_us", "flops", "count")]
    if extra:
        raise InvalidValue(where, f"unknown key {checks.shown(extra[0])}: totals are time_us, "
                           "flops, count")
    checks.number(value["time_us"], f"{where}.time_us", optional=False)
    checks.whole(value["flops"], f"{where}.flops")
    checks.whole(value["count"], f"{where}.count")
    return value


def _known(value: Any, where: str, known: dict[str, Check]) -> dict:
    """An object whose known keys pass their checks and whose others are free-form JSON."""
    for key, item in checks.obj(value, where).items():
        check = known.get(key)
        if check is None:
            checks.encodable(key, f"{where} (a key)")
            checks.plain(item, f"{where}.{key}")
        else:
            check(item, f"{where}.{key}")
    return value


def _operators(value: Any, where: str) -> list:
    for index, operator in enumerate(checks.array(value, where)):
        here = f"{where}[{index}]"
        _known(checks.obj(operator, here, ("name", "class", "time_us", "flops", "count")), here, {
            "name": lambda v, w: checks.text(v, w, optional=False),
            "class": lambda v, w: checks.text(v, w, optional=False),
            "time_us": lambda v, w: checks.number(v, w, optional=False),
            "flops": checks.whole, "count": checks.whole})
    return value


def _operations(value: Any, where: str) -> Mapping[str, Any] | None:
    """A profile's operation classes, as analysis/operations.py's OperationProfile writes them."""
    if value is None:
        return None
    value = checks.obj(value, where, ("device", "time_source", "steps", "classes", "operators",
                                      "optimizer"))
    return _known(value, where, {
        "device": lambda v, w: checks.text(v, w, optional=False),
        "time_source": lambda v, w: checks.text(v, w, optional=False),
        "steps": checks.whole,
        "classes": lambda v, w: {checks.encodable(k, f"{w} (a key)"):
                                 _class_totals(item, f"{w}.{k}")
                                 for k, item in checks.obj(v, w).items()},
        "operators": _operators,
        "optimizer": _class_totals,
    })


def _rank_components(value: Any, where: str) -> Mapping[int, Components] | None:
    """Ranks 1…'s components, by rank (rank 0's are the summary's `components`)."""
    if value is None:
        return None
    out = {}
    for key, item in checks.obj(value, where).items():
        here = f"{where}.{key}"
        number = checks.digits(str(key))
        rank = checks.whole(key if number is None else number, here, high=MAX_RANK)
        out[rank] = Components.from_dict(item, here)
    return out


@dataclass(frozen=True)
class TrainingSummary(Record):
    """How the training went, as the worker (or the callback) reported it, with what the probe
    measured and the profiler found."""

    time_s: float | None = fact(checks.number)
    samples_per_second: float | None = fact(checks.number)
    steps: int | None = fact(checks.count)
    loss: float | None = fact(checks.loss)
    components: Components | None = fact(record(Components))  # rank 0's
    operations: Mapping[str, Any] | None = fact(_operations)  # analysis/operations.py's
    rank_components: Mapping[int, Components] | None = fact(_rank_components)
    # A watched command's exit code (negative: killed by that signal).
    exit_code: int | None = fact(lambda v, w: checks.whole(v, w, -(2**31), 2**31 - 1,
                                                            optional=True))

    # A time under a hundredth of a second, the precision a time is shown at ("0.00 s"), has
    # measured no training (a step reported as the training began): no time, no speed from it.
    SHORTEST_S: ClassVar[float] = 0.01

    @classmethod
    def measured(cls, steps: int, time_s: float, samples: int | None) -> TrainingSummary:
        """`steps` steps, which trained `samples` examples (None: unknown) in `time_s` seconds;
        a time too short to measure (under SHORTEST_S) gives neither a time nor a speed."""
        if time_s < cls.SHORTEST_S:
            return cls.of(steps=steps)
        return cls.of(steps=steps, time_s=round(time_s, 3),
                      samples_per_second=None if samples is None else round(samples / time_s, 3))

    def trainer_figures(self) -> dict[str, Any]:
        """The Trainer's own figures as stored (what `show` prints as the summary)."""
        return {k: v for k, v in self.to_dict().items()
                if k not in ("components", "operations", "rank_components")}


@dataclass(frozen=True)
class RunSource(Record):
    """Who started a run: no kind for anatomy's own worker (`anatomy run`, the dashboard, a
    sweep); a user's script (the callback or the phase API) or a command under `watch`."""

    kind: SourceKind | None = fact(checks.member(SourceKind))
    script: str | None = fact(checks.text)
    argv: tuple[str, ...] | None = fact(lambda v, w: None if v is None else tuple(
        checks.text(item, f"{w}[{i}]", optional=False) for i, item in enumerate(checks.array(v, w))))
    command: tuple[str, ...] | None = fact(lambda v, w: None if v is None else tuple(
        checks.text(item, f"{w}[{i}]", optional=False) for i, item in enumerate(checks.array(v, w))))
    cwd: str | None = fact(checks.text)
    host: str | None = fact(checks.text)

    @property
    def by_user(self) -> bool:
        """A user's training made it (watch, a script): only what it reported is known."""
        return self.kind is not None

    def words(self) -> str:
        """Who started the run, in words."""
        if self.kind == SourceKind.WATCH:  # quoted as a shell reads it, to be run again
            return "anatomy watch -- " + shlex.join(self.command or ())
        if self.kind == SourceKind.SCRIPT:
            return f"script {self.script or '(interactive)'}"
        return "the CLI"  # anatomy's own worker, started by another process than this one

    def short_words(self) -> str:
        """`words` with the script and the program by their file names: a heading's words."""
        if self.kind == SourceKind.WATCH and self.command:
            return "anatomy watch -- " + shlex.join((os.path.basename(self.command[0]),
                                                     *self.command[1:]))
        if self.kind == SourceKind.SCRIPT and self.script:
            return f"script {os.path.basename(self.script)}"
        return self.words()


@dataclass(frozen=True)
class Origin(Record):
    """Where an imported run came from: the exporting store's id, its host and path, the run's
    id there and when it was created there."""

    store: str | None = fact(checks.text)
    host: str | None = fact(checks.text)
    path: str | None = fact(checks.text)
    run: int | None = fact(checks.count)
    created_at: float | None = fact(lambda v, w: checks.seconds(v, w, MAX_EPOCH, optional=True))

    def words(self) -> str:
        out = f"run {self.run}" if self.run is not None else "a run"
        if self.path:
            out += f" of {self.path}"
        if self.host:
            out += f" on {self.host}"
        return out

    def same_run(self, other: Origin) -> bool:
        """Both name the same run: its store and id there, or (files that do not name their
        store) its id and the moment it was created."""
        if self.run is None or self.run != other.run:
            return False
        if self.store and other.store:
            return self.store == other.store
        return self.created_at == other.created_at
