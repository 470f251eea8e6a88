"""Parameters a training leaves as they are (requires_grad=False: no gradient, no optimizer
state): frozen by name, and named again from a model a script froze itself.

A name is a module's or a parameter's dotted name as `named_modules` / `named_parameters` write
it (model.embed_tokens, vit.embeddings, model.layers.0), and freezes everything under it. A
model's frozen parameters are named by the largest modules wholly frozen (a module whose every
parameter is, its parent not), and a parameter alone where its module trains in part: one name
for a frozen vision tower, one a layer for the lower layers frozen.
"""

from __future__ import annotations

from functools import lru_cache

from anatomy.analysis.models.classes import config_key
from anatomy.analysis.models.errors import ModelError
from anatomy.analysis.models.lora import meta_model
from anatomy.analysis.models.spec import ModelSpec

MAX_FROZEN_NAMES = 64  # names a run records; a model frozen in more pieces is not recorded


def freeze(model, names: tuple[str, ...]) -> None:
    """Freeze every parameter under each of `names` (a module's or a parameter's dotted name).
    ModelError naming the first that is neither, and where everything would be frozen (the
    Trainer's optimizer refuses an empty list of parameters)."""
    if not names:
        return
    found = _named(model)
    unknown = next((name for name in names if name not in found), None)
    if unknown is not None:
        raise ModelError(f"frozen: {unknown_words(unknown, found)}")
    for name in names:
        for parameter in found[name]:
            parameter.requires_grad_(False)
    for module in model.modules():
        if _input_asks_gradients(module):
            module._requires_grad = False  # as transformers' freeze_feature_encoder() leaves it
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(_everything(names))


def trained_count(model) -> int:
    """The model's parameters that train (requires_grad), counted once each."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def frozen_asking_gradients(model) -> list[str]:
    """Speech models' feature encoders frozen by requires_grad alone, not by transformers' own
    `freeze_feature_encoder()`: the encoder still asks a gradient of its input while it trains
    (`_requires_grad`), and autograd keeps its convolutions' activations for it, which `freeze`
    (as the method) does not."""
    return [name for name, module in model.named_modules() if _input_asks_gradients(module)]


def _input_asks_gradients(module) -> bool:
    """A module of transformers' speech models (wav2vec2's feature encoder, HuBERT's, WavLM's…)
    wholly frozen that sets its input's requires_grad while it trains (`_requires_grad`)."""
    if getattr(module, "_requires_grad", None) is not True or \
            not hasattr(module, "_freeze_parameters"):
        return False
    held = list(module.parameters())
    return bool(held) and not any(p.requires_grad for p in held)


def frozen_names(model) -> tuple[str, ...]:
    """The model's frozen parameters by name: the largest modules wholly frozen, then the
    parameters frozen alone in a module that trains in part (a model that trains everything:
    none)."""
    out: list[str] = []

    def walk(module, prefix: str) -> None:
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad:
                out.append(f"{prefix}{name}")
        for name, child in module.named_children():
            held = list(child.parameters())
            if held and not any(p.requires_grad for p in held):
                out.append(f"{prefix}{name}")
            else:
                walk(child, f"{prefix}{name}.")

    walk(model, "")
    return tuple(out)


def frozen_problem(spec: ModelSpec, names: tuple[str, ...]) -> str | None:
    """Why the model cannot be trained with `names` frozen, in `freeze`'s words (a name that is
    no module or parameter of it, everything frozen); None where it can. From the model built on
    the meta device, once a model."""
    known = _known(spec, config_key(spec))
    unknown = next((name for name in names if name not in known), None)
    if unknown is not None:
        return f"frozen: {unknown_words(unknown, known)}"
    frozen = frozenset().union(*(known[name] for name in names))
    if names and frozen >= known[""]:
        return _everything(names)
    return None


def unknown_words(name: str, known) -> str:
    """A name that is no module or parameter, and the names it could have meant: those ending
    as it does (embed_tokens: model.embed_tokens), else the model's top-level modules."""
    ending = sorted(n for n in known if n.endswith(f".{name}"))[:4]
    if ending:
        return f"{name} names no module or parameter of the model (did you mean " \
               f"{' or '.join(ending)}?)"
    top = sorted({n.split(".")[0] for n in known if n})[:8]
    return f"{name} names no module or parameter of the model (its modules: {', '.join(top)})"


def _everything(names: tuple[str, ...]) -> str:
    return (f"frozen: {', '.join(names)} freeze every parameter of the model: nothing would "
            "train")


@lru_cache(maxsize=32)
def _known(spec: ModelSpec, config_key: str) -> dict[str, frozenset[int]]:
    """Each name's parameters, numbered; "" the model's every one."""
    model = meta_model(spec)
    number = {id(p): i for i, p in enumerate(model.parameters())}
    return {"": frozenset(number.values()),
            **{name: frozenset(number[id(p)] for p in held)
               for name, held in _named(model).items()}}


def _named(model) -> dict[str, list]:
    """Each module's and parameter's dotted name, and the parameters under it (a module or
    parameter shared under two names, as tied embeddings are, by each)."""
    found: dict[str, list] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name:
            found[name] = list(module.parameters())
    for name, parameter in model.named_parameters(remove_duplicate=False):
        found.setdefault(name, [parameter])
    return found
