"""Which of a model's repeated layers each traced event belongs to, so that a recording at a
small depth extrapolates to any depth (prediction/layers.py).

A model's repeated layers are the modules of the lists as long as its depth (the config's
`num_hidden_layers`, or an encoder-decoder's two stacks); layer `i` of stack `s` is tagged
`(s, b)`, `b` its block (prediction/blocks.py: `i` itself where the layers are all alike, else
the period it falls in). An event belongs to the layer:
- whose forward pass runs (forward hooks; a checkpointed layer's recomputation too);
- in the backward pass, that made the autograd node running it (each layer's nodes are tagged
  when its forward pass ends, walking back from its outputs to the previous layer's);
- otherwise, for an allocation, of its operator's inputs (a per-tensor loop's or a foreach
  operator's outputs, one by one); an operator with no input of a layer belongs to the
  parameter whose optimizer state was looked up last, until the next mark (the state a step
  creates, `torch.tensor(0.0)` for its step count); for a free, of the storage it frees
  (`loose`: prediction/layers.py places it in the layer whose events it falls among).
The weights are tagged by the module that holds them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_leaves

from anatomy.prediction.layers import TEMPLATE

KEY = "anatomy layer"
# Operators whose output holds one part per input: with a part per layer, it grows with depth.
JOINS = frozenset({torch.ops.aten.cat.default, torch.ops.aten.stack.default})
Tag = tuple[int, int]


class Grows:
    """An output of no layer that holds a part per layer: `share` bytes of it are the
    template's (clipping's per-parameter norms, stacked)."""

    def __init__(self, share: int):
        self.share = share


def stacks(model, depth: int) -> list[torch.nn.ModuleList]:
    """The model's lists of repeated layers: as long as its depth, of one class."""
    return [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == depth
            and len({type(layer) for layer in m}) == 1]


def signature(module) -> list:
    """A layer as far as it can differ from another of its class: its modules' classes, their
    parameters' and buffers' shapes and kinds, and their plain attributes."""
    out = []
    for name, sub in module.named_modules():
        attributes = sorted((k, v) for k, v in vars(sub).items() if not k.startswith("_")
                            and k != "training" and isinstance(v, (int, float, str, bool, tuple,
                                                                    type(None))))
        out.append((name, type(sub).__name__, attributes,
                    [(n, tuple(p.shape), p.dtype, p.requires_grad)
                     for n, p in sub.named_parameters(recurse=False)],
                    [(n, tuple(b.shape), b.dtype) for n, b in sub.named_buffers(recurse=False)]))
    return out


def signatures(layers: torch.nn.ModuleList) -> list[list]:
    """Each layer's `signature` as far as its memory can tell: less the whole numbers that count
    along the list (a straight line of the layer's index: the index itself, twice it plus one),
    a count of layers that is the list's length as "the depth" (a layer told the model's depth),
    and a fraction only as nought or not (a dropout's probability, stochastic depth's growing
    layer by layer, a scale that follows the model's depth: what they are does not change a
    tensor's size, whether they are nought can). Two layers with the same are the same layer
    but for their place."""
    found = [signature(layer) for layer in layers]
    points: dict[tuple[str, str], dict[int, object]] = {}
    for at, layer in enumerate(found):
        for name, _, attributes, _, _ in layer:
            for key, value in attributes:
                points.setdefault((name, key), {})[at] = value
    counting = {key for key, seen in points.items() if _counts(seen)}
    def seen(key: str, value):
        if isinstance(value, float):
            return value != 0
        if "layers" in key and value == len(found) and not isinstance(value, bool):
            return "the depth"
        return value

    return [[(name, kind, [(k, seen(k, v)) for k, v in attributes
                           if (name, k) not in counting], *rest)
             for name, kind, attributes, *rest in layer] for layer in found]


def _counts(points: dict[int, object]) -> bool:
    """Whether whole numbers at three places or more lie on a line of the place, not flat."""
    if len(points) < 3 or not all(isinstance(v, int) and not isinstance(v, bool)
                                  for v in points.values()):
        return False
    (a, first), (b, second), *others = sorted(points.items())
    step = (second - first) / (b - a)
    return step != 0 and all(v == first + step * (at - a) for at, v in others)


class LayerTags:
    """Tags a timeline's events with the repeated layer they belong to (see the module's doc);
    `install` hooks the layers, `remove` lets go."""

    def __init__(self):
        self.context: Tag | None = None  # the layer whose forward pass runs
        self.parameter: Tag | None = None  # the layer of the parameter an optimizer is at
        self.of_tid: dict[int, Tag] = {}
        self._outer: list[Tag | None] = []
        self._handles: list = []
        self._layer_of_parameter: dict[int, Tag] = {}
        self.blocks: tuple[int, ...] = ()

    def install(self, lists: list[torch.nn.ModuleList], blocks: tuple[int, ...]) -> None:
        """Hooks each layer of `lists`; `blocks`: the block of each layer (prediction/blocks.py),
        its tag's index."""
        self.blocks = blocks
        for s, layers in enumerate(lists):
            for i, layer in enumerate(layers):
                tag = (s, blocks[i])
                for p in layer.parameters():
                    self._layer_of_parameter[id(p)] = tag
                self._handles += [
                    layer.register_forward_pre_hook(lambda m, a, tag=tag: self._enter(tag)),
                    layer.register_forward_hook(lambda m, a, out, tag=tag: self._leave(tag, out))]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _enter(self, tag: Tag) -> None:
        self._outer.append(self.context)
        self.context = tag

    def _leave(self, tag: Tag, output) -> None:
        self.context = self._outer.pop()
        nodes = [t.grad_fn for t in tree_leaves(output)
                 if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while nodes:
            node = nodes.pop()
            if node is None or KEY in node.metadata:
                continue
            node.metadata[KEY] = tag
            nodes.extend(following for following, _ in node.next_functions)

    def now(self) -> Tag | None:
        """The layer running: its forward pass, or the autograd node of the backward pass."""
        if self.context is not None:
            return self.context
        node = torch._C._current_autograd_node()
        return None if node is None else node.metadata.get(KEY)

    def in_backward(self) -> bool:
        return self.context is None and torch._C._current_autograd_node() is not None

    def allocated(self, tid: int, tag: Tag | None) -> None:
        if tag is not None:
            self.of_tid[tid] = tag

    def for_free(self, tid: int) -> tuple[Tag | None, bool]:
        """A free's layer, and whether a layer's pass made it (else: its storage's layer)."""
        if self.context is not None or self.in_backward():
            return self.now(), True
        return self.of_tid.get(tid), False

    def derived(self, func, args, kwargs, out, tid_of) -> list[Tag | None] | None:
        """The layers of an operator's outputs (in tree_leaves order) outside any layer's pass:
        its inputs'; None: no such outputs."""
        if self.context is not None or self.in_backward():
            return None
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs:
            return None

        def tag_of(tensor) -> Tag | None:
            tid = tid_of(tensor)
            return None if tid is None else self.of_tid.get(tid)

        if func.__name__.startswith("_foreach_"):
            lists = [a for a in args if isinstance(a, (list, tuple)) and len(a) == len(outputs)
                     and all(isinstance(t, torch.Tensor) for t in a)]
            if lists:
                return [tag_of(t) for t in lists[0]]
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        tags = {tag_of(t) for t in inputs} - {None}
        if not tags:  # made from nothing of a layer (a constant lifted): the loop's parameter
            return [self.parameter] * len(outputs)
        if len(tags) == 1:
            return [tags.pop()] * len(outputs)
        if func in JOINS and tags:
            share = sum(t.numel() * t.element_size() for t in inputs
                        if (tag_of(t) or (None, None))[1] == TEMPLATE)
            return [Grows(share)]
        return [None] * len(outputs)

    def marked(self) -> None:
        """A moment of the step (tracer marks fall between layers' passes, never inside one):
        no parameter looked up, and no layer running. A layer whose forward pass did not end
        is left here: activation checkpointing stops a recomputation early once it has the
        tensors the backward needs (torch's _StopRecomputationError), before the layer's
        forward hook, and what comes after (the optimizer step's temporaries) is no layer's."""
        self.parameter = None
        self.context, self._outer = None, []

    def tag_weights(self, lists, timeline, tid_of, segment: tuple[int, int]) -> None:
        """The weights' events: a layer's parameters and buffers, as the build made them."""
        position = {timeline.events[i][1]: i for i in range(*segment)
                    if timeline.events[i][0] == 0}
        for s, layers in enumerate(lists):
            for i, layer in enumerate(layers):
                for tensor in (*layer.parameters(), *layer.buffers()):
                    tid = tid_of(tensor)
                    if tid is not None:
                        self.of_tid[tid] = (s, self.blocks[i])
                        if tid in position:
                            timeline.tags[position[tid]] = (s, self.blocks[i])


class _StateLookups(dict):
    """An optimizer's `state` (a defaultdict of dicts) that says which parameter is looked up."""

    def __init__(self, state, tags: LayerTags):
        super().__init__(state)
        self._tags = tags

    def __missing__(self, key):
        self[key] = value = {}
        return value

    def __getitem__(self, key):
        self._tags.parameter = self._tags._layer_of_parameter.get(id(key))
        return super().__getitem__(key)


@contextmanager
def following_states(tags: LayerTags):
    """Optimizers made meanwhile keep states that say which parameter is looked up (an
    optimizer may make states as it is made: Adagrad)."""
    from torch.optim import optimizer

    made = optimizer.defaultdict
    optimizer.defaultdict = lambda factory: (_StateLookups({}, tags) if factory is dict
                                             else made(factory))
    try:
        yield
    finally:
        optimizer.defaultdict = made
