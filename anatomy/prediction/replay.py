"""A traced run laid out for as many steps and micro-batches as it takes, and what the allocator
makes of it. Pure Python: the recording (prediction/tracing/record.py) is plain data.

The Trainer's run, in the order its memory sees it:

    weights | empty_cache (accelerate's free_memory at train start) | setup |
    step 1: batches · first micro-batch · later micro-batches (accumulation) · first optimizer step
    step 2..n: batches (then the previous step's are freed) · first micro-batch · later ones ·
               optimizer step

Each recorded segment is copied with fresh storage ids; a copy's frees of storages from outside
it follow the run: the optimizer step frees that step's gradients, the cuBLAS workspaces
(persistent) are made once. On "cuda" the allocator is the caching allocator's simulation
(prediction/allocator.py); on "cpu" there is none: every figure is exact tensor bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from anatomy.prediction.allocator import CachingAllocator, OutOfMemory
from anatomy.vocabulary import Phase

ALLOC, FREE, MARK = 0, 1, 2


class Workspace(int):
    """The size of a workspace a kernel can do without, as an allocation's size: cuDNN's
    convolutions (aten/src/ATen/native/cudnn/Conv_v8.cpp, heuristics mode: `try_configs`) ask
    the caching allocator for their engine's workspace; where it raises out of memory (after
    releasing every free segment and retrying, as any request), the next engine is tried, and
    the one that runs is kept for that convolution's `key` (`benchmark_cache.update`), so later
    calls with the key ask for it again. The replay takes a refused workspace as the engine
    with none (what the H200 ran after refusing RegNet-Y-040's at batch 1,340) for the rest of
    the run."""

    key: tuple

    def __new__(cls, size: int, key: tuple):
        workspace = super().__new__(cls, size)
        workspace.key = key
        return workspace

    def __reduce__(self):
        return type(self), (int(self), self.key)
EMPTY_CACHE = "empty_cache"
TRAINING_BEGINS = "training begins"

# The step's moments, as the step marks them, and the stretch each one begins.
STRETCHES = {
    "batches": "fetching the batches",
    "forward begins": "forward pass",
    "forward ends": "backward pass",
    "backward ends": "gradient clipping",
    "before optimizer step": "optimizer step",
    "after optimizer step": "zero_grad",
}


@dataclass
class Recording:
    """One of each segment of a run, traced (tracing/record.py makes it)."""
    events: list[tuple]  # (ALLOC, tid, bytes), (FREE, tid, 0), (MARK, 0, label)
    persistent: set[int]  # tids allocated once for the process (cuBLAS workspaces)
    segments: dict[str, tuple[int, int]]  # name -> [start, end) in events
    grads_first: dict[int, int]  # trainable parameter -> its gradient's tid (first step)
    grads_later: dict[int, int]  # the same, as the later optimizer step frees them
    batch_tids: list[int]
    parameters: int
    trainable_parameters: int
    weights_bytes: int  # distinct parameter storages (as the probe counts them)
    gradient_bytes: int
    optimizer_state_bytes: int
    attention_kernels: tuple[str, ...] = ()
    # What convolutions made of the forward passes' results (tracing/cuda.py: cuDNN's workspaces,
    # not traced, grow with them).
    convolution_share: float = 0.0
    max_tid: int = 0
    # A traced rank's (a strategy's tracer, e.g. tracing/fsdp.py): the storages of its
    # collectives, by the strategy's names for its buffers.
    rank_buffers: dict[str, frozenset[int]] = field(default_factory=dict)
    saved_bytes: int = 0  # what autograd saved in the last micro-batch's forward pass
    # With the layers followed (tracing/depth.py): beside each event the repeated layer it
    # belongs to, (stack, index) or None; the depth traced; one layer of each stack's share of
    # the counts above (parameters, weights_bytes, ...), for layers.py to extrapolate.
    tags: list = field(default_factory=list)
    growth: dict[int, int] = field(default_factory=dict)  # event -> bytes each layer adds
    loose: set[int] = field(default_factory=set)  # frees tagged by their storage's layer
    depth: int = 0
    per_layer: dict[str, int] = field(default_factory=dict)

    def segment(self, name: str) -> list[tuple]:
        start, end = self.segments.get(name, (0, 0))
        return self.events[start:end]


class _Copier:
    def __init__(self, first_tid: int):
        self.next = first_tid

    def copy(self, events: list[tuple], remap: dict[int, int], skip: set[int] = frozenset()
             ) -> tuple[list[tuple], dict[int, int]]:
        """The events with fresh tids for what they allocate (`skip`: tids not to allocate
        again); frees of other tids go through `remap`."""
        local = dict(remap)
        out = []
        for kind, tid, value in events:
            if kind == ALLOC:
                if tid in skip:
                    local[tid] = tid
                    continue
                self.next += 1
                local[tid] = self.next
                out.append((ALLOC, self.next, value))
            elif kind == FREE:
                if local.get(tid) == tid and tid in skip:
                    continue
                out.append((FREE, local.get(tid, tid), 0))
            else:
                out.append((kind, tid, value))
        return out, local


def stream(rec: Recording, steps: int, grad_accum: int) -> Iterator[tuple]:
    """The whole run's events; marks are (MARK, step, label)."""
    copier = _Copier(rec.max_tid + 1)
    yield from rec.segment(Phase.WEIGHTS)
    yield (MARK, 0, Phase.WEIGHTS)
    yield (MARK, 0, EMPTY_CACHE)
    yield from rec.segment("setup")
    yield (MARK, 0, TRAINING_BEGINS)
    made_once: set[int] = set()
    previous_batches: list[int] = []
    for step in range(1, steps + 1):
        yield (MARK, step, "batches")
        events, batches = copier.copy(rec.segment("batches"), {})
        yield from events
        for tid in previous_batches:
            yield (FREE, tid, 0)
        previous_batches = [batches[t] for t in rec.batch_tids if t in batches]
        events, local = copier.copy(_relabel(rec.segment("first micro-batch"), step), {},
                                    skip=made_once)
        made_once |= rec.persistent
        yield from events
        grads = {i: local[tid] for i, tid in rec.grads_first.items() if tid in local}
        for _ in range(grad_accum - 1):
            events, _ = copier.copy(_relabel(rec.segment("later micro-batch"), step), {},
                                    skip=made_once)
            yield from events
        if step == 1 or "optimizer step" not in rec.segments:
            frees = {tid: grads[i] for i, tid in rec.grads_first.items() if i in grads}
            events, _ = copier.copy(_relabel(rec.segment("first optimizer step"), step), frees)
        else:
            frees = {tid: grads[i] for i, tid in rec.grads_later.items() if i in grads}
            events, _ = copier.copy(_relabel(rec.segment("optimizer step"), step), frees)
        yield from events


def _relabel(events: list[tuple], step: int) -> list[tuple]:
    return [(MARK, step, e[2]) if e[0] == MARK else e for e in events]


@dataclass
class Measurement:
    """What a run's allocator would report, from its events."""
    weights_allocated: int = 0  # at the end of the weights phase
    weights_reserved: int = 0
    peak_allocated: int = 0  # from the end of the weights phase to the end of the last step
    peak_reserved: int = 0
    peak_stretch: str = ""  # where the peak falls: forward pass, backward pass, ...
    peak_step: int = 0
    at_marks: dict[tuple[int, str], int] = field(default_factory=dict)  # allocated at each mark
    peaks_by_stretch: dict[str, int] = field(default_factory=dict)  # from step 2 on
    final_allocated: int = 0
    largest_request: int = 0  # the largest single allocation once training begins
    out_of_memory: bool = False
    refused: int = 0  # the request the allocator could not hold (out of memory), bytes
    final_reserved: int = 0  # the allocator's reserve at the end (or when it ran out)

    def activations(self, step: int) -> int:
        """Allocated at the end of the step's last forward pass over its start (the probe's)."""
        return self.at_marks.get((step, "forward ends"), 0) - \
            self.at_marks.get((step, "forward begins"), 0)


def measure(events, cuda: bool, capacity: int | None = None) -> Measurement:
    """Walk the events through the caching allocator (`cuda`) or exact bytes (the CPU).
    `capacity`: the bytes the allocator may reserve; past it the run is out of memory (then
    `out_of_memory`, and the figures up to that request)."""
    allocator = CachingAllocator(capacity) if cuda else None
    live: dict[int, object] = {}
    sizes: dict[int, int] = {}
    allocated = 0
    result = Measurement()
    stretch, step, in_training = "setup", 0, False
    peak = 0
    refused: set[tuple] = set()  # workspaces' keys whose engine ran with none (Workspace)
    for kind, tid, value in events:
        if kind == ALLOC:
            if allocator is not None and isinstance(value, Workspace) and value.key in refused:
                continue
            if in_training and value > result.largest_request:
                result.largest_request = value
            if allocator is not None:
                if not value:  # CUDA's caching allocator allocates nothing for 0 bytes
                    continue
                try:
                    live[tid] = allocator.malloc(value)
                except OutOfMemory:
                    if isinstance(value, Workspace):  # the cache released; the next engine
                        refused.add(value.key)
                        continue
                    result.out_of_memory, result.refused = True, value
                    break
                allocated = allocator.stats.allocated
            else:
                sizes[tid] = value
                allocated += value
            if allocated > peak:
                peak = allocated
                if in_training:
                    result.peak_stretch, result.peak_step = stretch, step
            if step >= 2:
                result.peaks_by_stretch[stretch] = max(result.peaks_by_stretch.get(stretch, 0),
                                                       allocated)
        elif kind == FREE:
            if allocator is not None:
                block = live.pop(tid, None)
                if block is not None:
                    allocator.free(block)
                    allocated = allocator.stats.allocated
            else:
                allocated -= sizes.pop(tid, 0)
        else:
            step = tid
            if value == Phase.WEIGHTS:
                result.weights_allocated = allocated
                result.weights_reserved = allocator.stats.reserved if allocator else allocated
                peak = allocated
                if allocator is not None:
                    allocator.reset_peaks()
            elif value == EMPTY_CACHE:
                if allocator is not None:
                    allocator.empty_cache()
            elif value == TRAINING_BEGINS:
                in_training = True
                result.peak_stretch = "setup"
            else:
                stretch = STRETCHES.get(value, stretch)
                result.at_marks[(step, value)] = allocated
    result.peak_allocated = peak
    result.peak_reserved = allocator.stats.peak_reserved if allocator else peak
    result.final_allocated = allocated
    result.final_reserved = allocator.stats.reserved if allocator else allocated
    return result
