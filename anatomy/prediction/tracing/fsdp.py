"""One rank of FSDP2 (`fully_shard`) as accelerate drives it, traced: torch's own sharding,
all-gathers, reduce-scatters and mixed-precision casts run, on the rank's tensors, so that every
buffer FSDP makes is counted as torch makes it rather than modelled beside it.

- **The units and their options** are accelerate's: `fsdp2_prepare_model` (accelerate 1.15) is
  called with the plugin the Trainer builds for the worker's fsdp_config — each class of
  `strategies.fsdp.unit_classes` a unit, the input embeddings and the tail (final norm, output
  embeddings) their own, reshard after forward (the root and the tail keep theirs), mixed
  precision as the run's (`FullyShardedDataParallelPlugin.set_mixed_precision`: param_dtype =
  reduce_dtype = output_dtype = bf16 or fp16).
- **The process group** is a real one where one exists (gloo ranks on the CPU: the check of the
  prediction) or torch's fake backend (`fake_group`: one process plays rank 0 of N; its
  collectives move nothing, and make no tensor FSDP would not make on a real rank).
- **Storage resizes**: FSDP2 frees an unsharded parameter by resizing its storage to 0 bytes and
  refills it by resizing it back (`_fsdp_param.free_storage` / `alloc_storage`); no operator
  sees that, so `following` tells the tracker of each, and names the storages FSDP's
  collectives make (`Buffers`), for the prediction to say what they hold at the peak.

`rank` is what the trace of a rank's step asks of a strategy's tracer (tracing/record.py): the
fake group, the model's sharding and the collectives' buffers, together.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.distributed as dist

from anatomy.prediction.tracing.record import RankTrace
from anatomy.strategies.fsdp import ALL_GATHER, REDUCE_SCATTER, unit_classes
from anatomy.vocabulary import Precision

MESH_DIM = "dp_shard"  # accelerate's name for the FSDP dimension of its device mesh


def mesh(device: str = "cpu"):
    """The default process group's ranks as accelerate's one-dimensional FSDP mesh. Made before
    a fake mode is entered: the mesh's own tensor must be real."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=(MESH_DIM,))


def shard(model, precision: str, device_mesh) -> None:
    """`model` sharded in place by accelerate's `fsdp2_prepare_model`, as the Trainer's
    accelerator would with the worker's fsdp_config on this mesh."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    layers = unit_classes(model)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
        **({"transformer_cls_names_to_wrap": layers} if layers else {}))
    # accelerate names the mixed precisions as anatomy does; fp32 is its "no"
    mixed = str(precision) if precision in (Precision.BF16, Precision.FP16) else "no"
    if mixed != "no":  # what AcceleratorState does with the Trainer's precision
        plugin.set_mixed_precision(mixed)
    # The accelerator as fsdp2_prepare_model reads it: its plugin, precision and mesh.
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision=mixed,
        is_main_process=dist.get_rank() == 0, device=device_mesh.device_type,
        torch_device_mesh=device_mesh,
        parallelism_config=SimpleNamespace(fsdp_dim_names=(MESH_DIM,)))
    fsdp2_prepare_model(accelerator, model)


# The default process group and FSDP's module functions are the process's: one trace at a time
# (the dashboard's pages may predict from several threads).
_ONE_AT_A_TIME = threading.Lock()


@contextmanager
def fake_group(world_size: int):
    """Rank 0 of `world_size` in this process, on torch's fake backend (no other process, no
    communication), and its mesh; the group is destroyed on leaving."""
    # Registers the fake backend's constructor (torch names "fake" a backend without one).
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    with _ONE_AT_A_TIME:
        if dist.is_initialized():
            raise RuntimeError("a process group exists already in this process")
        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
        try:
            yield mesh("cpu")
        finally:
            dist.destroy_process_group()


class Buffers:
    """The storages FSDP2 makes for its collectives in a trace, by tid: ALL_GATHER (the
    all-gather's flat output and the unsharded parameters copied out of it, refilled each time
    by a resize), REDUCE_SCATTER (the reduce-scatter's input and output)."""

    def __init__(self, timeline):
        self.timeline = timeline
        self.spans: dict[str, list[tuple[int, int]]] = {ALL_GATHER: [], REDUCE_SCATTER: []}
        self.resized: set[int] = set()

    def inside(self, kind: str, call):
        def wrapped(*args, **kwargs):
            start = len(self.timeline.events)
            try:
                return call(*args, **kwargs)
            finally:
                self.spans[kind].append((start, len(self.timeline.events)))
        return wrapped

    def tids(self, kind: str) -> frozenset[int]:
        from anatomy.prediction.tracing.tracker import ALLOC

        events = self.timeline.events
        made = {events[i][1] for start, end in self.spans[kind] for i in range(start, end)
                if events[i][0] == ALLOC}
        return frozenset(made | (self.resized if kind == ALL_GATHER else set()))

    def by_kind(self) -> dict[str, frozenset[int]]:
        return {kind: self.tids(kind) for kind in self.spans}


@contextmanager
def following(tracker):
    """While inside, FSDP2's storage resizes (frees, refills) are told to `tracker`
    (`LiveTensors.resized`: the bytes a storage held freed, those it holds now allocated), and
    what its collectives allocate is named: yields the `Buffers`."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    buffers = Buffers(tracker.timeline)
    saved_storage = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    saved_calls = {name: getattr(_fsdp_param_group, name) for name in
                   ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce")}

    def resizing(resize):
        def resized(tensor: torch.Tensor) -> None:
            before = tensor.untyped_storage().size()
            resize(tensor)
            if tensor.untyped_storage().size() != before:
                tracker.resized(tensor)
                buffers.resized.add(tracker.storage_tid(tensor))
        return resized

    alloc_storage, free_storage = (resizing(f) for f in saved_storage)
    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc_storage, free_storage
    _fsdp_param_group.alloc_storage = alloc_storage
    for name, call in saved_calls.items():
        kind = REDUCE_SCATTER if name == "foreach_reduce" else ALL_GATHER
        setattr(_fsdp_param_group, name, buffers.inside(kind, call))
    try:
        yield buffers
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage = saved_storage
        _fsdp_param_group.alloc_storage = saved_storage[0]
        for name, call in saved_calls.items():
            setattr(_fsdp_param_group, name, call)


@contextmanager
def rank(world_size: int, tracker, precision: str) -> Iterator[RankTrace]:
    """Rank 0 of `world_size` on the fake group, its storage resizes told to `tracker`: the
    model is sharded as accelerate shards it for the run's `precision`, and the buffers of its
    collectives named by the strategy's names for them."""
    with fake_group(world_size) as device_mesh, following(tracker) as buffers:
        yield RankTrace(prepare=lambda model: shard(model, precision, device_mesh),
                        buffers=buffers.by_kind)
