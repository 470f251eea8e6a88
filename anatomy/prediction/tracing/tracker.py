"""The live-tensor tracker: a TorchDispatchMode that sees every tensor an operator returns, and
learns when its storage is freed from a weak reference on that storage.

On real tensors it measures what is alive (the true live-tensor peak of a CPU step); on fake
tensors (FakeTensorMode) it follows the same step without the memory. Either way it writes a
`Timeline`: allocations and frees of storages, in order, and named marks between them. The
caching allocator's view of those events is prediction/allocator.py's.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field

import torch

try:
    from torch._prims_common import is_non_overlapping_and_dense_or_false
except ImportError:  # torch before 2.11: private, and of the sizes and strides
    from torch._prims_common import _is_non_overlapping_and_dense_or_false

    def is_non_overlapping_and_dense_or_false(tensor: torch.Tensor) -> bool:
        return _is_non_overlapping_and_dense_or_false(tensor.shape, tensor.stride())
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

ALLOC, FREE, MARK = 0, 1, 2
_ADD = torch.ops.aten.add.Tensor


@dataclass
class Timeline:
    """Events in the order they happened: (ALLOC, tid, bytes), (FREE, tid, 0), (MARK, 0, label).

    `tid` names one storage for its whole life; `persistent` holds the tids allocated once for
    the process (cuBLAS workspaces) that a replayed step must not allocate again. With `layers`
    (tracing/depth.py), `tags` holds beside each event the repeated layer it belongs to."""

    events: list[tuple] = field(default_factory=list)
    persistent: set[int] = field(default_factory=set)
    tags: list = field(default_factory=list)
    growth: dict[int, int] = field(default_factory=dict)  # event -> bytes a layer adds to it
    loose: set[int] = field(default_factory=set)  # frees no layer's pass made
    layers: object = None  # a LayerTags while the layers are followed
    _next: int = 0

    def new_tid(self) -> int:
        self._next += 1
        return self._next

    def alloc(self, size: int, tag=None) -> int:
        """A new storage; `tag` its layer, else the layer running."""
        tid = self.new_tid()
        self.events.append((ALLOC, tid, size))
        if self.layers is not None:
            if hasattr(tag, "share"):  # of no layer, but growing with the depth
                self.growth[len(self.events) - 1] = tag.share
                tag = None
            tag = tag if tag is not None else self.layers.now()
            self.layers.allocated(tid, tag)
        self.tags.append(tag)
        return tid

    def free(self, tid: int) -> None:
        self.events.append((FREE, tid, 0))
        tag, made_by_a_layer = self.layers.for_free(tid) if self.layers is not None else \
            (None, True)
        if not made_by_a_layer:
            self.loose.add(len(self.events) - 1)
        self.tags.append(tag)

    def retract(self, tid: int) -> bool:
        """Take back the allocation of `tid` when it is the latest event (a storage that the
        real run never makes: see LiveTensors' accumulation)."""
        if not self.events or self.events[-1][:2] != (ALLOC, tid):
            return False
        self.events.pop()
        self.tags.pop()
        self.growth.pop(len(self.events), None)
        if self.layers is not None:
            self.layers.of_tid.pop(tid, None)
        return True

    def mark(self, label: str) -> None:
        self.events.append((MARK, 0, label))
        self.tags.append(None)
        if self.layers is not None:
            self.layers.marked()


class LiveTensors(TorchDispatchMode):
    """Records the storages of every operator's outputs on `device` (a device type: "cpu"), and
    their frees, in `timeline`. `track` registers tensors made before the mode was entered
    (weights built elsewhere); `storage_tid` finds a tensor's storage among the recorded ones.

    `on_op(func, args, outputs)`, when set, is called after every operator (the CUDA emulation
    uses it to add what CUDA kernels allocate beside their outputs); `output_order(func, n)`,
    when set, gives the order in which the kernel allocates an operator's n outputs (indices;
    None: as they are returned).

    **Gradients summed in place.** Where an input of the backward pass receives gradients from
    two operators, autograd's engine sums them (torch/csrc/autograd/input_buffer.cpp,
    `accumulate`): in place, `old.add_(new)`, when it holds the only reference to the first
    (`can_accumulate_inplace`), else `old + new`. Under any Python dispatch mode — this one
    included, on real tensors as on fake ones — it takes the second, so a trace would allocate a
    gradient-sized sum the run without the mode never makes (ELECTRA-large at batch 265 on an
    H200: four fp32 hidden-sized, 530 MiB, per layer and step). The engine's sum is recognised
    by what only it does: an `add` in the backward pass, with gradients off, of two tensors of
    one shape and dtype, the first dense, not a view (a view shares its storage with its base:
    `storage().use_count()` is 2, and the engine sums out of place — a tied embedding's two
    gradients, the head's a transpose: 890 MiB for Qwen2.5-1.5B, measured on the H200), made
    before the operator whose outputs are being summed, and freed as soon as the sum returns
    (the buffer held the only reference). Its
    allocation is taken back and the sum continues under the first's storage id, as `add_`
    would."""

    def __init__(self, timeline: Timeline | None = None, device: str = "cpu"):
        super().__init__()
        self.timeline = timeline if timeline is not None else Timeline()
        self.device = device  # the device type followed; a model built on "meta" then "cpu"
        self._tids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()
        self.on_op = None
        self.output_order = None
        # The autograd node running (the backward pass's operator), numbered as each first
        # runs, and the node of each storage made in the backward pass: what tells the engine's
        # sum. The number is kept in the node's own metadata: torch hands out a Python object
        # for a node that lives only while referenced, so its id can pass to the next node's
        # object (torch 2.11: one trace in ten told a layer's events apart from its twin's),
        # and holding the object would keep what the node holds past its run.
        self._numbers = itertools.count(1)
        self._number_key = object()  # this tracker's entry in a node's metadata
        self._node_serial = 0  # the running node's number; 0 outside the backward pass
        self._made_in: dict[int, int] = {}
        self._summed: tuple[int, int, weakref.ref] | None = None  # (first's tid, sum's tid, sum)

    # --- recording ---
    def track(self, tensor, tag=None) -> int | None:
        """The storage's tid, registering it (as allocated now, in layer `tag`) when it is
        new."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device:
            return None
        storage = tensor.untyped_storage()
        tid = self._tids.get(storage)
        if tid is not None:
            return tid
        with self._lock:
            tid = self.timeline.alloc(storage.nbytes(), tag)
            self._tids[storage] = tid
            self._refs[tid] = self._watch(storage, tid)
            self._made_in[tid] = self._node_serial
        return tid

    def _watch(self, storage, tid: int) -> weakref.ref:
        return weakref.ref(storage, lambda ref, tid=tid: self._freed(tid, ref))

    def adopt(self, tensor) -> int:
        """Follow a storage made outside the recorded events (its allocation is accounted for
        elsewhere): a new tid, and its free recorded when it comes."""
        storage = tensor.untyped_storage()
        with self._lock:
            tid = self.timeline.new_tid()
            layers = self.timeline.layers
            if layers is not None and self._tids.get(storage) in layers.of_tid:
                layers.of_tid[tid] = layers.of_tid[self._tids.get(storage)]
            self._tids[storage] = tid
            self._refs[tid] = self._watch(storage, tid)
        return tid

    def resized(self, tensor) -> None:
        """A storage resized in place (FSDP2 frees and refills its unsharded parameters so, out
        of any operator's sight): the bytes it held are freed, and those it holds now allocated
        under a new tid, which its end frees."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device:
            return
        storage = tensor.untyped_storage()
        with self._lock:
            held = self._tids.get(storage)
            if held is not None and self._refs.pop(held, None) is not None:
                self.timeline.free(held)
            tid = self.timeline.alloc(storage.nbytes())
            self._tids[storage] = tid
            self._refs[tid] = self._watch(storage, tid)

    def _freed(self, tid: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._refs.get(tid) is not ref:
                return  # its id passed to another storage (an in-place sum), or already freed
            del self._refs[tid]
            summed, self._summed = self._summed, None
            if summed is not None and summed[0] == tid and summed[2]() is not None and \
                    self.timeline.retract(summed[1]):
                # The engine's sum: the real run added in place, into this storage
                total = summed[2]()
                self._tids[total] = tid
                del self._refs[summed[1]]
                self._refs[tid] = self._watch(total, tid)
                return
            self.timeline.free(tid)

    def storage_tid(self, tensor) -> int | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        return self._tids.get(tensor.untyped_storage())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        self._node_serial = 0 if node is None else self._number(node)
        self._summed = None
        out = func(*args, **(kwargs or {}))
        layers = self.timeline.layers
        tags = None if layers is None else layers.derived(func, args, kwargs or {}, out,
                                                           self.storage_tid)
        outputs = [t for t in _holding_memory(out) if isinstance(t, torch.Tensor)]
        if tags is not None and len(tags) != len(outputs):
            tags = None  # a wrapper's inner tensors: no layer to tell
        order = self.output_order(func, len(outputs)) if self.output_order else None
        for i in order or range(len(outputs)):
            self.track(outputs[i], tags[i] if tags else None)
        if self.on_op is not None:
            self.on_op(func, args, out)
        if func is _ADD and node is not None:
            self._summed = self._engine_sum(args, kwargs, out)
        return out

    def _number(self, node) -> int:
        """The node's number, given as it first runs."""
        numbers = node.metadata
        number = numbers.get(self._number_key)
        if number is None:
            number = numbers[self._number_key] = next(self._numbers)
        return number

    def _engine_sum(self, args, kwargs, out) -> tuple[int, int, weakref.ref] | None:
        """The sum, when `add(*args)` may be autograd's engine summing two gradients (see the
        class's doc); whether it is, the first's free tells (`_freed`)."""
        if torch.is_grad_enabled() or kwargs or len(args) != 2 or \
                not all(isinstance(t, torch.Tensor) for t in (*args, out)):
            return None
        first, second = args
        if not (first.shape == second.shape == out.shape and
                first.dtype == second.dtype == out.dtype) or \
                not is_non_overlapping_and_dense_or_false(first) or first._is_view() or \
                first.untyped_storage().nbytes() != out.untyped_storage().nbytes():
            return None
        first_tid, out_tid = self.storage_tid(first), self.storage_tid(out)
        if first_tid is None or out_tid is None or \
                self._made_in.get(first_tid, -1) == self._node_serial:
            return None  # made by the operator running: a sum inside its own formula
        return first_tid, out_tid, weakref.ref(out.untyped_storage())


def local(tensor):
    """A DTensor's shard on this rank (a plain tensor is its own)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _holding_memory(out):
    """The tensors of an operator's outputs that hold memory: a wrapper subclass's inner ones (a
    DTensor's local shard: FSDP2's parameters, gradients and optimizer states), not the
    wrapper, whose storage is a stand-in of the global size."""
    for tensor in tree_leaves(out):
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            yield from _holding_memory([getattr(tensor, name) for name in names])
        else:
            yield tensor


class SavedForBackward:
    """What the component probe reads as activations on a CPU (engine/probe.py, which keeps no
    allocator statistics there): the distinct storages autograd saves for the backward pass
    during the model's latest forward pass and still holds at its end, the parameters left out.
    Hooked on the same module the probe hooks, with the same saved-tensor hooks, so a traced
    step reads what a real one does; storages are told apart by the tracker's ids (fake tensors
    have no addresses)."""

    def __init__(self, model, tracker: LiveTensors):
        self.model, self.tracker = model, tracker
        self.bytes = 0  # the latest forward pass's
        self.kept: dict[object, int] = {}  # its storages (a tracker's id: bytes)
        self._saved: dict[object, tuple[int, weakref.ref]] = {}  # bytes, the storage
        self._hooks = None
        self._handles = [model.register_forward_pre_hook(self._begins),
                         model.register_forward_hook(self._ends)]

    def _key(self, tensor) -> object:
        storage = tensor.untyped_storage()
        tid = self.tracker.storage_tid(tensor)
        return tid if tid is not None else ("untracked", id(storage))

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        self._saved[self._key(tensor)] = (storage.nbytes(), weakref.ref(storage))
        return tensor

    def _begins(self, module, args) -> None:
        if not module.training:
            return
        self._saved = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()

    def _ends(self, module, args, output) -> None:
        if not module.training or self._hooks is None:
            return
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        parameters = {self._key(p) for p in self.model.parameters()}
        # A storage saved for a part of the graph the forward pass dropped (a router's indices,
        # an indexer's scores) is freed before the end: not held for the backward pass
        self.kept = {key: size for key, (size, storage) in self._saved.items()
                     if key not in parameters and storage() is not None}
        self.bytes = sum(self.kept.values())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
