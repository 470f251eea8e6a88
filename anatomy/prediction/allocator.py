"""PyTorch's CUDA caching allocator, simulated: the same allocations and frees give the same
`memory_allocated`, `memory_reserved` and their peaks. Pure Python, no torch.

What it models (c10/cuda/CUDACachingAllocator.cpp, default settings: one stream, no expandable
segments, no max_split_size):
- every request is rounded up to a multiple of 512 B (`MIN_BLOCK`; 0 B and anything below, 512);
- requests up to 1 MiB (`SMALL_SIZE`) come from the small pool, whose segments are 2 MiB
  (`SMALL_BUFFER`); larger ones from the large pool, whose segments are 20 MiB (`LARGE_BUFFER`)
  for requests below 10 MiB (`MIN_LARGE_ALLOC`) and otherwise the request rounded up to 2 MiB
  (`ROUND_LARGE`);
- a request takes the smallest cached free block that fits (the lowest address among equals);
  a new segment lies below every segment before it, as cudaMalloc gave them on the H200 (in the
  recorded runs of 2026-12-02 every large segment but a few after releases), so among equal
  free blocks the newest segment's is taken. With the addresses in allocation order instead,
  ELECTRA-large's recorded actions at batch 265 ended with one 266 MiB segment less than the
  run reserved, and RegNet-Y-040's held a request the run refused;
  the rest of the block is split off when it is at least 512 B (small pool) or more than 1 MiB
  (large pool), otherwise the request keeps the whole block, and `memory_allocated` counts the
  block, not the request;
- a freed block merges with free neighbours of its segment; segments are kept (reserved) until
  `empty_cache()`, or until a request would pass the device's capacity: then every segment
  without an allocated block is released and the request retried; if it still does not fit,
  the run is out of memory.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(Exception):
    """A request the device's capacity cannot hold, even after releasing the cache."""


class _Block:
    __slots__ = ("addr", "size", "allocated", "prev", "next", "segment", "small")

    def __init__(self, addr: int, size: int, segment: int, small: bool):
        self.addr, self.size, self.segment, self.small = addr, size, segment, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass
class AllocatorStats:
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0


class CachingAllocator:
    """`malloc(size) -> handle`, `free(handle)`, `empty_cache()`; the figures in `stats`.
    `capacity` (bytes the allocator may reserve) None: unlimited."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.stats = AllocatorStats()
        self._free: dict[bool, list[tuple[int, int, _Block]]] = {True: [], False: []}
        self._segments: dict[int, _Block] = {}  # segment id -> its first block
        self._segment_sizes: dict[int, int] = {}
        self._next_addr = 1 << 60  # new segments below it (cudaMalloc's order)
        self._next_segment = 0

    # --- the free lists: (size, address) order, so the first fit is the best fit ---
    def _insert(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr, block))

    def _remove(self, block: _Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.size, block.addr))
        del pool[i]

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        return pool[i][2] if i < len(pool) else None

    def _new_segment(self, size: int, small: bool) -> _Block:
        grow = segment_size(size)
        if self.capacity is not None and self.stats.reserved + grow > self.capacity:
            self.empty_cache()
            if self.stats.reserved + grow > self.capacity:
                raise OutOfMemory(f"{size} bytes requested, {self.stats.reserved} reserved of "
                                  f"{self.capacity}")
        segment = self._next_segment
        self._next_segment += 1
        self._next_addr -= grow
        block = _Block(self._next_addr, grow, segment, small)
        self._segments[segment] = block
        self._segment_sizes[segment] = grow
        self.stats.reserved += grow
        self.stats.peak_reserved = max(self.stats.peak_reserved, self.stats.reserved)
        return block

    def malloc(self, size: int) -> _Block:
        size = round_size(size)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small)
        if block is not None:
            self._remove(block)
        else:
            block = self._new_segment(size, small)
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            tail = _Block(block.addr + size, rest, block.segment, small)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.allocated = True
        self.stats.allocated += block.size
        self.stats.peak_allocated = max(self.stats.peak_allocated, self.stats.allocated)
        return block

    def free(self, block: _Block) -> None:
        block.allocated = False
        self.stats.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    if self._segments.get(block.segment) is block:
                        self._segments[block.segment] = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert(block)

    def empty_cache(self) -> None:
        """Release every segment that is one free block (torch.cuda.empty_cache)."""
        for segment, first in list(self._segments.items()):
            if not first.allocated and first.next is None and first.prev is None:
                self._remove(first)
                del self._segments[segment]
                self.stats.reserved -= self._segment_sizes.pop(segment)

    def reset_peaks(self) -> None:
        self.stats.peak_allocated = self.stats.allocated
        self.stats.peak_reserved = self.stats.reserved
