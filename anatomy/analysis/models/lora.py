"""LoRA's targets: the layers a model's adapters can wrap (from the model built on the meta device),
the default choice, the targets a user names that are none, and peft's LoRA put on a model.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import NamedTuple

from anatomy.analysis.models.classes import config_key, head_class, head_config, transformers_config
from anatomy.analysis.models.errors import ModelError, first_line, where_it_stopped
from anatomy.analysis.models.spec import ModelSpec
from anatomy.analysis.models.tasks import (
    CAUSAL_LM,
    CLASSIFICATIONS,
    IMAGE_CLASSIFICATION,
    SEQ2SEQ,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
)

# LoRA: peft's own defaults (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) where peft has
# the model type; for any other model the attention's query and value projections found among its
# own linear layers (`default_lora_targets`).
_QUERY_VALUE = re.compile(r"^(q|v|query|value|q_proj|v_proj|q_lin|v_lin|query_proj|value_proj)$")
_FUSED_QKV = re.compile(r"qkv|c_attn|query_key_value|in_proj")

# peft's word for every linear layer but the output layer, as QLoRA's recipes name their targets
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class Layer:
    """A module LoRA could wrap: its dotted name, and whether it sits in an attention block."""
    name: str
    kind: str  # "linear", "convolution" or "embedding"
    in_attention: bool
    groups: int = 1  # a grouped (depthwise) convolution's: peft's adapters need rank % groups

    @property
    def short(self) -> str:
        return self.name.split(".")[-1]

    @property
    def grouped(self) -> bool:
        return self.groups > 1


def adaptable_layers(spec: ModelSpec) -> tuple[Layer, ...]:
    """The model's own linear, convolution and embedding layers, the task's output layer left
    out: what LoRA can wrap. Builds the model on the meta device (no memory; torch loads, once)."""
    return _modules(spec, config_key(spec)).layers


class _Modules(NamedTuple):
    """A model's modules as LoRA sees them."""
    layers: tuple[Layer, ...]  # the adaptable layers
    # The linear, convolution and embedding layers peft will not adapt here, each with why, a
    # verb's words ("lies in classifier, a module …"): one peft refuses for the model type, one in
    # a module peft trains whole, one the model reads what peft's wrapper hides of, an embedding
    # of a forward of its own, one whose weight the model looks up through another.
    withheld: tuple[tuple[str, str], ...]
    # The last parts of the names of every other module (a stage called "1", a head): a LoRA
    # target that names one of those too is not a layer peft wraps.
    others: frozenset[str]
    heads: tuple[str, ...]  # the task's output layers: trained whole, never adapted
    kinds: tuple[tuple[str, str], ...]  # every other module's dotted name and class


@lru_cache(maxsize=32)
def _modules(spec: ModelSpec, config_key: str) -> _Modules:
    """The model's modules (`_Modules`), from the model built on the meta device."""
    model = meta_model(spec)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    heads = {name for name, module in model.named_modules()
             if module is output or _is_classifier(module, spec)}
    saved = _trained_whole(spec, model)
    found, others, kinds, withheld = [], set(), [], []
    import torch
    from transformers.pytorch_utils import Conv1D

    def kind_of(module) -> str | None:  # the layer types peft wraps (and their subclasses)
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            return "linear"
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            return "convolution"
        if isinstance(module, torch.nn.Embedding):
            return "embedding"
        return None

    def own_forward(module) -> bool:
        # peft's LoRA embedding adds its adapters' lookup of the input to what the layer's own
        # forward gives: an embedding of positions (BART's, Whisper's, given token ids, offset
        # and sliced) is no lookup of the input, and its adapters would add the wrong rows; a
        # scaled one (Gemma's, BART's tokens: the lookup of its one input, times a number) is
        return isinstance(module, torch.nn.Embedding) and \
            type(module).forward is not torch.nn.Embedding.forward and \
            not _scaled_lookup(type(module))

    def walk(module, prefix: str, in_attention: bool, whole: str | None) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            kind = kind_of(child)
            whole_here = whole or next((full for s in saved if full.endswith(s)), None)
            if kind is not None and full not in heads and whole_here is None and \
                    not own_forward(child):
                found.append(Layer(full, kind, in_attention, getattr(child, "groups", 1)))
            else:
                others.add(name)
                kinds.append((full, type(child).__name__))
                if kind is not None and full not in heads and whole_here is not None:
                    where = "is" if whole_here == full else f"lies in {whole_here},"
                    withheld.append((full, f"{where} a module peft trains whole beside the "
                                           f"adapters for {spec.task}"))
                elif kind is not None and full not in heads:
                    withheld.append((full, f"is {_a(type(child).__name__)}, an embedding with "
                                           "a forward of its own, which peft's LoRA embedding "
                                           "does not follow (it adds a lookup of the input)"))
            walk(child, f"{full}.", in_attention or "attention" in type(child).__name__.lower()
                 or "attn" in name.lower(), whole_here)

    walk(model, "", False, None)
    for layer, why in {**_hidden_from_the_model(model, found),
                       **_looked_up_elsewhere(model, found)}.items():
        found.remove(layer)
        others.add(layer.short)
        kinds.append((layer.name, type(model.get_submodule(layer.name)).__name__))
        withheld.append((layer.name, why))
    refused = _refused_by_peft(spec.model_type, frozenset(layer.short for layer in found))
    for layer in found:
        if layer.short in refused:
            others.add(layer.short)
            kinds.append((layer.name, type(model.get_submodule(layer.name)).__name__))
            withheld.append((layer.name, f"is a layer peft's LoRA refuses in "
                                         f"{spec.model_type} models"))
    return _Modules(tuple(layer for layer in found if layer.short not in refused),
                    tuple(withheld), frozenset(others), tuple(sorted(heads)), tuple(kinds))


# `.child.attribute`, read, at every dot (`self.encoder.conv1.stride` holds `conv1.stride`)
_CHILD_ATTRIBUTE = re.compile(r"(?=\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?!\s*=[^=]))")
# Methods that run before peft wraps anything: what they read of a layer needs no wrapper.
_BEFORE_PEFT = frozenset({"__init__", "_init_weights", "init_weights", "post_init"})


def _hidden_from_the_model(model, layers: list[Layer]) -> dict[Layer, str]:
    """The layers whose model reads, in its code, an attribute of theirs that peft's LoRA
    wrapper of them does not pass on (it passes on the weight and the bias, not a convolution's
    stride, which Whisper's encoder reads of its conv1 and conv2), each with why, a verb's
    words: adapted, the model stops at that read ("'Conv1d' object has no attribute 'stride'").
    Read from the source of the modules that hold the layer, as `self.conv1.stride`."""
    hidden = {}
    for layer in layers:
        module = model.get_submodule(layer.name)
        path = layer.name.split(".")
        # the nearest holder first: its forward is what calls the layer
        holders = (model.get_submodule(".".join(path[:depth]))
                   for depth in range(len(path) - 1, -1, -1))
        reads = [(attribute, reader) for holder in holders
                 for (child, attribute), reader in _reads(type(holder))
                 if child == layer.short and hasattr(module, attribute)]
        wrapped = _wrapper_of(module) if reads else None
        missed = next(((attribute, reader) for attribute, reader in reads
                       if wrapped is not None and not hasattr(wrapped, attribute)), None)
        if missed is not None:
            hidden[layer] = (f"is {_a(type(module).__name__)} whose {missed[0]} {missed[1]} "
                             "reads, which peft's LoRA wrapper of it does not pass on")
    return hidden


def _a(kind: str) -> str:
    """A class's name with its article: "an Embedding", "a LayerNorm"."""
    return f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind}"


def _scaled_lookup(cls) -> bool:
    """Whether an embedding's own forward is the plain lookup of its one input (times a
    number): `super().forward(input_ids)` of its one argument."""
    import inspect

    try:
        parameters = list(inspect.signature(cls.forward).parameters)[1:]
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError, ValueError):
        return False
    return len(parameters) == 1 and f"super().forward({parameters[0]})" in source


def _looked_up_elsewhere(model, layers: list[Layer]) -> dict[Layer, str]:
    """Embeddings that share their weight with others the model looks its tokens up through
    instead, each with why, a verb's words: T5's and BART's `shared`, whose weight their
    encoder's and decoder's embed_tokens hold, is called by no forward, and its adapters never
    are ("element 0 of tensors does not require grad"). Called: named as `.embed_tokens(` in
    the source of a module that holds it."""
    embeddings = [layer for layer in layers if layer.kind == "embedding"]
    groups: dict[int, list[Layer]] = {}
    for layer in embeddings:
        groups.setdefault(id(model.get_submodule(layer.name).weight), []).append(layer)
    found = {}
    for group in (group for group in groups.values() if len(group) > 1):
        called = [layer for layer in group if any(
            f".{layer.short}(" in source for source in _holders_sources(model, layer.name))]
        if not called:
            continue  # none seen called: the trace follows what the model does
        names = ", ".join(layer.name for layer in called)
        for layer in group:
            if layer not in called:
                found[layer] = (f"shares its weight with {names}, which the model looks its "
                                "tokens up through instead: adapters on it would never be used")
    return found


def _holders_sources(model, name: str) -> list[str]:
    """The source of the methods of the modules that hold a module, the nearest first."""
    path = name.split(".")
    return [source for depth in range(len(path) - 1, -1, -1)
            for _, source in _methods(type(model.get_submodule(".".join(path[:depth]))))]


@lru_cache(maxsize=256)
def _methods(cls) -> tuple[tuple[str, str], ...]:
    """(class, source) of each method of the class and of its bases outside torch that runs
    once the model is built."""
    import inspect

    found = []
    for base in cls.__mro__:
        if base.__module__.startswith(("torch.", "builtins")):
            continue
        for name, function in vars(base).items():
            if name in _BEFORE_PEFT or not inspect.isfunction(function):
                continue
            try:
                found.append((base.__name__, inspect.getsource(function)))
            except (OSError, TypeError):
                continue
    return tuple(found)


@lru_cache(maxsize=256)
def _reads(cls) -> tuple[tuple[tuple[str, str], str], ...]:
    """((child, attribute), class) for every `.child.attribute` read in `_methods`: not one
    set (T5Gemma's set_output_embeddings sets its embed_tokens' num_embeddings)."""
    return tuple(dict.fromkeys(
        ((child, attribute), reader) for reader, source in _methods(cls)
        for child, attribute in _CHILD_ATTRIBUTE.findall(source)))


def _wrapper_of(module):
    """peft's LoRA wrapper of the layer, built on the meta device (None where peft builds
    none: what it refuses is said elsewhere)."""
    import torch
    from peft import LoraConfig
    from peft.tuners.lora.model import LoraModel

    rank = getattr(module, "groups", 1)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return LoraModel._create_new_module(LoraConfig(r=rank), "default", module, r=rank,
                                                lora_alpha=rank)
    except Exception:  # noqa: BLE001 - a layer peft cannot wrap: its own check says why
        return None


def _peft_task(spec: ModelSpec, model):
    """The peft task type LoRA is put on the model with: the task's wrapper (None: the plain
    LoRA model, as for a model that takes no token ids)."""
    from peft import TaskType

    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        return None  # peft's seq2seq wrapper passes token ids, not audio: no task
    return {SEQUENCE_CLASSIFICATION: TaskType.SEQ_CLS, CAUSAL_LM: TaskType.CAUSAL_LM,
            SEQ2SEQ: TaskType.SEQ_2_SEQ_LM,
            TOKEN_CLASSIFICATION: TaskType.TOKEN_CLS}.get(spec.task)


def _trained_whole(spec: ModelSpec, model) -> tuple[str, ...]:
    """peft's modules_to_save for the run: modules trained whole, never adapted. peft's sequence
    and token classification wrappers add "classifier" and "score", and train whole every
    module whose name ends so (DistilBERT's pre_classifier too, by a plain suffix); an adapter
    on such a module is refused ("modules_to_save cannot be applied to modules of type
    Linear"), and one below it is left out (IBERT's classifier.dense)."""
    from peft import TaskType

    if _peft_task(spec, model) in (TaskType.SEQ_CLS, TaskType.TOKEN_CLS):
        return ("classifier", "score")
    if spec.task == IMAGE_CLASSIFICATION:
        return tuple(classifier_modules(spec, model))
    return ()


def meta_model(spec: ModelSpec):
    """The model with its head built on the meta device from its config, random weights and no
    adapters: its modules, without memory. ModelError where transformers cannot build it."""
    import torch

    try:
        head = head_class(spec)
        with torch.device("meta"):
            return head._from_config(head_config(head, transformers_config(spec)),
                                     dtype=torch.float32)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001 - on the meta device nothing runs out of memory
        raise ModelError(f"model: transformers cannot build {spec.display_name}: "
                         f"{where_it_stopped(error)}{first_line(error)}") from None


def _is_classifier(module, spec: ModelSpec) -> bool:
    """A classification head's output layer: it makes the labels' scores."""
    return spec.task in CLASSIFICATIONS and \
        getattr(module, "out_features", None) == spec.num_labels


def classifier_modules(spec: ModelSpec, model) -> list[str]:
    """The names of the classification head's output layers (they train beside the adapters)."""
    return [name for name, module in model.named_modules() if _is_classifier(module, spec)]


def default_lora_targets(spec: ModelSpec) -> tuple[str, ...]:
    """What LoRA wraps when the run names nothing: peft's own default for the model type where
    peft has a list of names (Gemma 4's is a pattern, which a list of targets cannot hold);
    otherwise from the model's own layers: the attention's query and value
    projections, else its fused query-key-value projection, else its attention's linear layers,
    else (a model without attention, such as a convolution network) every linear and convolution
    layer but the head's and the grouped (depthwise) convolutions, whose adapters peft limits
    (an embedding only where named, as peft's own defaults have it); never a layer peft refuses
    for the model type (a Mamba mixer's out_proj) or trains whole (a classification head's).
    ModelError when there is nothing to wrap."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft

    if isinstance(peft.get(spec.model_type), (list, tuple, set)):  # a str is a regex: ours then
        return tuple(peft[spec.model_type])
    layers = adaptable_layers(spec)
    attention = [layer for layer in layers if layer.in_attention and layer.kind == "linear"]
    for chosen in ([layer for layer in attention if _QUERY_VALUE.match(layer.short)],
                   [layer for layer in attention if _FUSED_QKV.search(layer.short)],
                   attention,
                   [layer for layer in layers
                    if not layer.grouped and layer.kind != "embedding"]):
        if chosen:
            return _targets(spec, chosen, layers)
    raise _nothing_to_adapt(spec)


def _nothing_to_adapt(spec: ModelSpec) -> ModelError:
    """A model with no layer peft's LoRA wraps, in words: what its layers are instead."""
    modules = _modules(spec, config_key(spec))
    why = []
    # A layer of the model's own class (IBERT's QuantLinear): no torch layer, which peft wraps
    own = sorted({kind for _, kind in modules.kinds
                  if re.search(r"Linear|Conv", kind) and not kind.startswith(("Linear", "Conv"))})
    if own:
        why.append(f"its {', '.join(own)} layers are none of the torch layers peft wraps")
    why += [f"{name} {reason}" for name, reason in modules.withheld[:1]]
    reasons = f": {', and '.join(why)}" if why else ""
    return ModelError(f"lora: {spec.display_name} has no linear or convolution layer for LoRA's "
                      f"adapters{reasons} (train it without a LoRA rank)")


def _refused_by_peft(model_type: str, names: frozenset[str]) -> frozenset[str]:
    """The layers' short names peft refuses to adapt in this model type (a Mamba mixer's
    out_proj and conv1d), by peft's own check where this peft has one: a target must be
    something peft wraps."""
    try:
        from peft import LoraConfig
        from peft.tuners.tuners_utils import _check_lora_target_modules_mamba as check
    except ImportError:
        return frozenset()
    config = LoraConfig()
    model = SimpleNamespace(config=SimpleNamespace(model_type=model_type))
    refused = set()
    for name in names:
        try:
            check(config, model, name)
        except ValueError:
            refused.add(name)
    return frozenset(refused)


def _targets(spec: ModelSpec, chosen: list[Layer], layers: tuple[Layer, ...]) -> tuple[str, ...]:
    """`_names` of the chosen layers, beside the model's other modules."""
    return _names(chosen, layers, _modules(spec, config_key(spec)).others)


def _names(chosen: list[Layer], layers: tuple[Layer, ...], others: frozenset[str]
           ) -> tuple[str, ...]:
    """The chosen layers as peft's targets: their short names where those name nothing else (no
    other layer, no other module: peft would wrap ConvNeXt's stage "1" beside its layer "1"),
    else their dotted names."""
    names = set(layer.name for layer in chosen)
    short = {layer.short for layer in chosen}
    if all(layer.name in names for layer in layers if layer.short in short) and \
            not short & others:
        return tuple(sorted(short))
    return tuple(sorted(names))


def unknown_lora_targets(spec: ModelSpec, targets: tuple[str, ...]) -> list[str]:
    """Targets that match none of the layers LoRA adapts in the model, as peft matches them
    (the module's dotted name, or its end after a dot); ModelError where the model has no layer
    for adapters at all."""
    layers = adaptable_layers(spec)
    if not layers:  # whatever is named, nothing of this model takes an adapter
        raise _nothing_to_adapt(spec)
    def unknown(target: str) -> bool:
        if target == ALL_LINEAR:
            # peft's all-linear wraps linear layers alone: a model whose other layers are
            # convolutions (ResNet) has none for it ("No modules were targeted for adaptation")
            return not any(layer.kind == "linear" for layer in layers)
        return not any(layer.name == target or layer.name.endswith(f".{target}")
                       for layer in layers)

    return [target for target in targets if unknown(target)]


def unknown_target_words(spec: ModelSpec, target: str) -> str:
    """What a LoRA target that is none of the adaptable layers names instead, in words: the
    task's output layer, another kind of module, or nothing."""
    modules = _modules(spec, config_key(spec))

    def named(name: str) -> bool:  # as peft matches a target
        return name == target or name.endswith(f".{target}")

    if target == ALL_LINEAR:
        kept = [*modules.heads, *(name for name, _ in modules.withheld)]
        but = f" but {', '.join(kept[:3])}, which LoRA never adapts" if kept else ""
        return (f"{ALL_LINEAR} adapts linear layers, and {spec.display_name} has none{but}: name "
                "its convolution layers instead")

    head = next((name for name in modules.heads if named(name)), None)
    if head is not None:
        return (f"{target} is the output layer of {spec.display_name}'s head ({head}), which "
                "trains whole beside the adapters, never adapted")
    withheld = next((item for item in modules.withheld if named(item[0])), None)
    if withheld is not None:
        return f"{target} names {withheld[0]} of {spec.display_name}: it {withheld[1]}"
    other = next(((name, kind) for name, kind in modules.kinds if named(name)), None)
    if other is not None:
        return (f"{target} names {other[0]} of {spec.display_name}, {_a(other[1])}: no "
                "linear, convolution or embedding layer")
    return f"{target} names no module of {spec.display_name}"


def _names_withheld_alone(spec: ModelSpec, target: str) -> bool:
    """Whether the target names a layer peft will not adapt here, and none it adapts."""
    modules = _modules(spec, config_key(spec))
    return bool(unknown_lora_targets(spec, (target,))) and any(
        name == target or name.endswith(f".{target}") for name, _ in modules.withheld)


def rank_problem(spec: ModelSpec, rank: int, targets: tuple[str, ...]) -> str | None:
    """Why peft cannot adapt the named targets at this rank, in words, or None: a grouped
    (depthwise) convolution takes an adapter only at a rank its groups divide (peft's "Targeting
    a Conv2d with groups=16 and rank 8 …", and a run that started and failed)."""
    layers = adaptable_layers(spec)
    grouped = [layer for layer in layers if layer.grouped
               and any(layer.name == t or layer.name.endswith(f".{t}") for t in targets)]
    if all(rank % layer.groups == 0 for layer in grouped):
        return None
    groups = sorted({layer.groups for layer in grouped})
    shorts = ", ".join(dict.fromkeys(layer.short for layer in grouped))
    others = ", ".join(dict.fromkeys(layer.short for layer in layers if not layer.grouped))
    span = f"{groups[0]} to {groups[-1]}" if len(groups) > 1 else str(groups[0])
    return (f"lora_targets: {shorts} of {spec.display_name} are grouped convolutions (groups "
            f"{span}): peft adapts them only at a rank their groups divide, a multiple of "
            f"{math.lcm(*groups)}, and {rank} is not (or leave {shorts} out; the other layers "
            f"LoRA can adapt: {others})")


def linear_module_names(spec: ModelSpec) -> tuple[str, ...]:
    """The short names of the model's layers LoRA can wrap, for a message: the embeddings last,
    as the targets less often chosen."""
    layers = sorted(adaptable_layers(spec), key=lambda layer: layer.kind == "embedding")
    return tuple(dict.fromkeys(layer.short for layer in layers))


def lora_target_modules(spec: ModelSpec, chosen: tuple[str, ...] = ()) -> str | tuple[str, ...]:
    """peft's `target_modules`: the chosen modules, else `default_lora_targets`; `ALL_LINEAR`
    handed to peft as it is, for peft's own rule. anatomy's reading of it (every nn.Linear but
    the output layer and a classifier's) missed what peft adds: the routers and experts of a
    mixture of experts, which transformers 5 made no nn.Linear (GLM-4 MoE, DeepSeek-V3), and
    keeps: a classifier that is none of peft's head names (Flaubert's sequence_summary)."""
    if chosen == (ALL_LINEAR,):
        if unknown_lora_targets(spec, chosen):
            raise ModelError(f"lora_targets: {unknown_target_words(spec, ALL_LINEAR)}")
        return ALL_LINEAR
    return chosen or default_lora_targets(spec)


def apply_lora(model, spec: ModelSpec, rank: int, targets: tuple[str, ...] = (),
               dropout: float = 0.0):
    """peft's LoRA on the model: adapters of rank `rank` on the target modules, `dropout` on
    their inputs (peft's lora_dropout: in training each adapted module keeps its input dropped
    out and the mask, beside the input its layer keeps), everything else frozen; for
    classification the head, which the task adds, trains as well."""
    from peft import LoraConfig, get_peft_model

    task_type = _peft_task(spec, model)
    modules = lora_target_modules(spec, targets)
    problem = rank_problem(spec, rank, targets) if targets and modules != ALL_LINEAR else None
    # a layer peft would not adapt, or the model would stop at once wrapped
    # (`_hidden_from_the_model`), named alone: in anatomy's words, as the options' check has it
    withheld = next((target for target in targets if modules != ALL_LINEAR
                     and _names_withheld_alone(spec, target)), None)
    if withheld is not None:
        problem = f"lora_targets: {unknown_target_words(spec, withheld)}"
    if problem:
        raise ModelError(problem)
    # peft's all-linear leaves out the output embeddings and a sequence classifier's head, not a
    # token classifier's, which TOKEN_CLS saves whole, nor a layer its task trains whole by the
    # end of its name (DistilBERT's pre_classifier): wrapped too, peft refuses ("modules_to_save
    # cannot be applied to modules of type Linear"); nor a layer it refuses for the model type
    # (a Mamba mixer's out_proj). Each is left out of peft's own all-linear.
    kept_out = [*(classifier_modules(spec, model) if spec.task == TOKEN_CLASSIFICATION else ()),
                *(name for name, _ in _modules(spec, config_key(spec)).withheld)] \
        if modules == ALL_LINEAR else None
    config = LoraConfig(r=rank, target_modules=modules if isinstance(modules, str) else list(modules),
                        task_type=task_type, exclude_modules=kept_out or None,
                        lora_dropout=dropout,
                        modules_to_save=classifier_modules(spec, model)
                        if spec.task == IMAGE_CLASSIFICATION else None)
    try:
        with warnings.catch_warnings():
            # peft reads the model's is_gradient_checkpointing, which transformers 5 deprecates:
            # a FutureWarning on every LoRA run about a call neither the user nor anatomy makes.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                    FutureWarning)
            return get_peft_model(model, config)
    except ValueError as error:
        # peft names a module it cannot wrap by its whole repr, many lines: its class is enough.
        text = re.sub(r"(\w+)\(\n.*?\n\)", r"\1", str(error), count=1, flags=re.DOTALL)
        raise ModelError(f"lora_targets: {first_line(ValueError(text))}") from None
