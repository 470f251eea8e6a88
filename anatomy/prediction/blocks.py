"""How a model's layers repeat, and its config at the depth the prediction traces (the depth
stand-in, prediction/recordings.py). Pure Python over the config.

A model's layers are `first` layers of their own (at least one: T5's first layer alone holds its
relative attention bias), then a stretch that repeats every `period` layers (a full-attention
layer every sixth, experts every other layer), then the `tail`: what is left after the stretch's
last whole period (a part of one, a last layer of another kind). The trace keeps the first
layers, two periods, and the last period with the tail: four blocks (layers.DEPTH) of which the
second is the template that layers.py copies for each period added. A model whose layers are all
alike is one first layer and a period of one: four layers traced.

The config at the traced depth is the same model with fewer periods: every field its config
class ties to the layer count cut to the layers kept, found in the config as `save_pretrained`
writes it, not in a table of models —
- a list with an entry per layer (`layer_types`, `mlp_layer_types`, per-layer sizes and flags;
  an entry that names a layer, such as the layer a layer takes its keys and values from, names
  it by its index among the layers kept);
- a mapping by layer index (`per_layer_config`, transformers' heterogeneous layers);
- a list of the indices of some layers, under a name that says so (`moe_layers`,
  `full_attn_idxs`, `window_block_indexes`);
- a backbone's stages (`stage_names`: the stem, then a stage per layer; `out_features`,
  `out_indices`): the stages kept, which the config class names again.
The caller holds the result to the model built at its full depth (each layer kept the same,
the model outside its layers the same) and traces in full where it is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from anatomy.analysis import models
from anatomy.prediction.layers import DEPTH


class Blocks(NamedTuple):
    """A model's `layers` as `first` layers, whole periods of `period` layers, and a `tail`."""

    layers: int
    first: int = 1
    period: int = 1
    tail: int = 0

    @property
    def count(self) -> int:
        """The blocks at the model's depth: the first layers, then one block per period (the
        tail goes with the last)."""
        return 1 + (self.layers - self.first - self.tail) // self.period

    @property
    def kept(self) -> list[int]:
        """The model's layers that the trace keeps, by their index in the model."""
        last = self.layers - self.period - self.tail
        return list(range(self.first + 2 * self.period)) + list(range(last, self.layers))

    @property
    def traced(self) -> tuple[int, ...]:
        """The block of each layer traced."""
        return (0,) * self.first + (1,) * self.period + (2,) * self.period + \
            (3,) * (self.period + self.tail)


def find(layers: int, alike: Callable[[int, int], bool]) -> Blocks | None:
    """The blocks that trace the fewest layers, `alike(i, j)` saying whether layers i and j are
    the same but for their index; None where no stretch repeats often enough for a trace of
    four blocks to be shorter than the model."""
    known: dict[tuple[int, int], bool] = {}

    def same(i: int, j: int) -> bool:
        if (i, j) not in known:
            known[(i, j)] = alike(i, j)
        return known[(i, j)]

    best: Blocks | None = None
    for period in range(1, (layers - 1) // DEPTH + 1):
        # repeats[i]: layer i is the one a period before it again; through[i]: the first
        # layer from i on that is not (the end of a stretch)
        through = [layers] * (layers + 1)
        for i in range(layers - 1, period - 1, -1):
            through[i] = through[i + 1] if same(i, i - period) else i
        for first in range(1, layers - DEPTH * period + 1):
            end = through[first + period] if first + period < layers else layers
            periods = (end - first) // period
            if periods < DEPTH:
                continue
            found = Blocks(layers, first, period, layers - first - periods * period)
            if best is None or len(found.kept) < len(best.kept):
                best = found
    return best


_ITSELF = object()  # an entry that names its own layer (a layer taking its own keys and values)
_LABELS = ("id2label", "label2id")
_NAMES_INDICES = re.compile(r"layer|idx|index|indices")
_STAGES = ("stage_names", "out_features", "out_indices")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _names_layers(entries: list, layers: int) -> bool:
    """A list with an entry per layer whose entries are layers: each one at or before its own
    (a layer reuses an earlier layer's keys and values), not flags alone."""
    return all(_is_int(v) and 0 <= v <= i for i, v in enumerate(entries)) and \
        (entries == list(range(layers)) or max(entries, default=0) > 1)


def per_layer_fields(config: Mapping[str, Any], layers: int) -> dict[str, str]:
    """The config's fields tied to its layer count, by kind: "entries" (one per layer),
    "layers" (one per layer, naming layers), "by index", "indices", "stages"."""
    out = {}
    for key, value in config.items():
        if key in _LABELS or "token" in key:  # labels and token ids are no layers
            continue
        if isinstance(value, list) and len(value) == layers:
            out[key] = "layers" if _names_layers(value, layers) else "entries"
        elif isinstance(value, dict) and value and all(
                str(k).isdigit() and int(k) < layers for k in value):
            out[key] = "by index"
        elif isinstance(value, list) and value and key not in _STAGES and \
                _NAMES_INDICES.search(key) and all(_is_int(v) for v in value) and \
                0 <= value[0] and value[-1] < layers and \
                all(a < b for a, b in zip(value, value[1:])):
            out[key] = "indices"
        elif key == "stage_names" and isinstance(value, list) and len(value) == layers + 1:
            out[key] = "stages"
    return out


def per_layer(config: Mapping[str, Any], layers: int) -> list[tuple]:
    """Each layer's own entries in the config's per-layer fields (what the config says of it
    alone), alike for two layers the config makes alike."""
    fields = per_layer_fields(config, layers)
    out = []
    for i in range(layers):
        entries = []
        for key, kind in sorted(fields.items()):
            value = config[key]
            if kind == "entries":
                entries.append(value[i])
            elif kind == "layers":
                entries.append(_ITSELF if value[i] == i else ("before", i - value[i]))
            elif kind == "by index":
                entries.append(next((v for k, v in value.items() if int(k) == i), None))
            elif kind == "indices":
                entries.append(i in value)
        out.append(tuple(entries))
    return out


def at_traced_depth(config: Mapping[str, Any], kept: list[int]) -> dict | None:
    """The config with the layers `kept` (indices in the model, in order) and no others: its
    layer counts, and every field tied to them cut alike; None where a field names a layer
    that is not kept (the trace cannot stand in for the model)."""
    layers = next(config[k] for k in models.LAYER_KEYS if _is_int(config.get(k)))
    new = {old: at for at, old in enumerate(kept)}
    out = {**config, **{k: len(kept) for k in models.LAYER_KEYS if _is_int(config.get(k))}}
    for key, kind in per_layer_fields(config, layers).items():
        value = config[key]
        if kind == "entries":
            out[key] = [value[i] for i in kept]
        elif kind == "layers":
            if any(value[i] not in new for i in kept):
                return None
            out[key] = [new[value[i]] for i in kept]
        elif kind == "by index":
            out[key] = {type(k)(new[int(k)]): v for k, v in value.items() if int(k) in new}
        elif kind == "indices":
            out[key] = [new[i] for i in value if i in new]
        elif kind == "stages":  # named again by the config class, from the indices kept
            out.pop("stage_names")
            out.pop("out_features", None)
            indices = config.get("out_indices")
            if isinstance(indices, list):
                stages = [0 if i == 0 else i if i < 0 else 1 + new[i - 1] for i in indices
                          if _is_int(i) and (i <= 0 or i - 1 in new)]
                out["out_indices"] = stages or [len(kept)]
    return out
