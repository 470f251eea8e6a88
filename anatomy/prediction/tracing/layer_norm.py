"""Layer norm's backward on CUDA: the partial sums of its weight's and bias's gradients.

`layer_norm_backward_cuda` (aten/src/ATen/native/cuda/layer_norm_kernel.cu,
`LaunchGammaBetaBackwardCUDAKernel`) sums the weight's and the bias's gradients over the M rows
of N features it normalised. With many rows and few features — M > 64 × 1024 and N / 32 <
multiprocessors / 2: a transformer's hidden states at a large batch size — it spreads the rows
over blocks.y = min(32,768 / ⌈N / 32⌉, ⌈M / 32⌉) rows of thread blocks, each writing its partial
sums into a (blocks.y × N) buffer of the gradient's dtype (`dgamma_blocks`, `dbeta_blocks`), then
`*dgamma = dgamma_blocks.sum(0)`: a reduction (its output, and the staging buffer
tracing/reductions.py follows) that replaces the gradient. The buffers are freed as it returns.
Otherwise it allocates nothing beside its outputs. On an H200 (132 multiprocessors) recorded:
ELECTRA-large (N 1,024) at 265 × 512 rows, two buffers of 4,194,304 B, each sum staging
8,388,608 B and 32 B of semaphores; DeiT-base (N 768) at 1,916 × 197 rows, 4,193,280 B and
8,650,752 B.

Each size is a `Partials`: none at the small batch sizes a recording is made at, they are made
again from the rows when a batch size is made linear (reductions.Staged). The sum's output is
modelled as freed where the kernel frees the gradient it replaces: the same size, a few bytes.
"""

from __future__ import annotations

import math
from functools import lru_cache

from anatomy.prediction.tracing.reductions import Staged, contiguous_sum

BLOCK_X = 32  # block_dim_x
ROWS_PER_BLOCK = 32  # rows_per_block_y
MAX_GRID = 64 * 1024 // 2  # max_grid_size
MANY_ROWS = 64 * 1024
PARTS = ("buffer", "sum", "accumulation", "staging", "semaphores")


class Partials(Staged):
    """A size of layer norm's partial-sum buffers, with the rows and features it follows:
    rule = (((rows, 0, 0), (features, 0, 0)), element size, multiprocessors, threads)."""

    @staticmethod
    def sizes(rule: tuple) -> tuple[int, ...]:
        ((rows, _, _), (features, _, _)), element_size, processors, threads = rule
        return _sizes(rows, features, element_size, processors, threads)


@lru_cache(maxsize=1024)
def _sizes(rows: int, features: int, element_size: int, processors: int, threads: int
           ) -> tuple[int, ...]:
    """(each partial buffer, the sum's output, then the sum's accumulation, staging and
    semaphores): all 0 where the kernel sums directly."""
    if not (rows > MANY_ROWS and features // BLOCK_X < processors // 2):
        return (0,) * len(PARTS)
    blocks_x = -(-features // BLOCK_X)
    blocks_y = min(MAX_GRID // blocks_x, -(-rows // ROWS_PER_BLOCK))
    staged = contiguous_sum((blocks_y, features), {0}, element_size, processors, threads)
    return (blocks_y * features * element_size, features * element_size, *map(int, staged))


def backward_buffers(input_shape, normalized: int, element_size: int, gradients: int,
                     processors: int, threads: int) -> list[tuple[str, Partials]]:
    """What `native_layer_norm_backward` allocates beside its outputs on CUDA, in order, for
    `gradients` (0, 1 or 2) of the weight and the bias of `element_size` bytes: ("alloc" |
    "free", size). Every size is a Partials (0 where none is made)."""
    split = len(input_shape) - normalized
    rows, features = math.prod(input_shape[:split]), math.prod(input_shape[split:])
    rule = (((rows, 0, 0), (features, 0, 0)), element_size, processors, threads)
    sizes = Partials.sizes(rule)

    def size(part: str) -> Partials:
        index = PARTS.index(part)
        return Partials(sizes[index], rule, index)

    steps = [("alloc", size("buffer"))] * gradients
    for _ in range(gradients):  # *dgamma = dgamma_blocks.sum(0), then the bias's
        steps += [("alloc", size(part)) for part in PARTS[1:]]
        steps += [("free", size(part)) for part in reversed(PARTS[1:])]
    return steps + [("free", size("buffer"))] * gradients
