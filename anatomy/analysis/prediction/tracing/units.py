"""FSDP's units of a model, as the Trainer wraps them (transformer-based auto wrap): each module
of a class named in the model's `_no_split_modules` is one unit, and the root holds the rest
(embeddings, the head). Built on the meta device: no memory, no weights."""

from __future__ import annotations

from dataclasses import dataclass

from anatomy.analysis import models


@dataclass(frozen=True)
class Units:
    """Parameter bytes (fp32, as the model holds them) of FSDP's units: the root's own (what no
    wrapped layer holds) and each wrapped layer's, largest first; the parameters' first
    dimensions, for the padding of a shard."""

    root: int
    layers: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]  # (first dimension, bytes per row) of every parameter

    @property
    def largest(self) -> int:
        return self.layers[0] if self.layers else self.root


def units(model_name: str, lora_rank: int = 0, lora_targets: tuple[str, ...] = ()) -> Units:
    model, _ = models.build_model(models.resolve(model_name), "meta", lora_rank=lora_rank,
                                  lora_targets=lora_targets, pretrained=False)
    wrapped = set(getattr(model, "_no_split_modules", None) or ())
    layers: list[int] = []
    inside: set[int] = set()
    for module in model.modules():
        if type(module).__name__ in wrapped:
            params = [p for p in module.parameters() if id(p) not in inside]
            inside.update(id(p) for p in params)
            layers.append(sum(p.numel() * p.element_size() for p in params))
    every = {id(p): p for p in model.parameters()}  # tied weights once
    root = sum(p.numel() * p.element_size() for i, p in every.items() if i not in inside)
    rows = tuple((p.shape[0] if p.dim() else 1,
                  (p.numel() // max(1, p.shape[0] if p.dim() else 1)) * p.element_size())
                 for p in every.values())
    return Units(root, tuple(sorted(layers, reverse=True)), rows)
