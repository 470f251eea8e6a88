"""The staging buffers of CUDA's reduction kernel, for a step traced without CUDA.

A sum or a mean on CUDA runs `gpu_reduce_kernel` (aten/src/ATen/native/cuda/Reduce.cuh). When
each output has many inputs and there are few outputs — a bias's gradient, the sum of a
(batch × tokens) × width gradient over its rows — the kernel splits each output's inputs across
thread blocks (`ctas_per_output`) and gathers their partial sums through global memory: a buffer
of `global_memory_size()` bytes and one semaphore per block column, allocated through the
caching allocator after the output and freed when the kernel returns. On an H200 the bias of a
768-wide layer over 64 × 198 rows stages 74 MiB this way, where its output is 3 KiB.

`staging_buffers` follows the kernel's own choice (`setReduceConfig`) from the operator's
input, the reduced dimensions and the device's multiprocessors: TensorIterator's layout of the
reduction (reduced dimensions first, each group ordered by stride, contiguous neighbours
merged), then the block shape and the split. Followed for sum and mean, whose accumulator is
fp32 for fp32, bf16 and fp16 inputs (fp64 for fp64). A reduction whose operands span 2^31
bytes or more (not elements: `can_use_32bit_indexing` counts byte offsets) runs as parts, each
half of the dimension of the largest extent until each is 32-bit indexable, one kernel each:
each part stages its own buffer (allocated and freed before the next: the largest is what
the allocator sees, in the block the first freed), and where the output cannot accumulate in
its own type (bf16, fp16), an fp32 buffer of the outputs is held across the parts
(`AccumulationBuffer`). On an H200, ViT-sized MLP biases (3,072 wide) in bf16 pass that at
batch sizes beyond ~950.
"""

from __future__ import annotations

from functools import lru_cache

import torch

aten = torch.ops.aten

# Reductions whose CUDA kernel is gpu_reduce_kernel with an accumulator of the input's opmath
# type (sum_functor, MeanOps); (input, dims) from the operator's arguments.
REDUCTIONS = frozenset({aten.sum.default, aten.sum.dim_IntList, aten.mean.default,
                        aten.mean.dim})
MAX_NUM_THREADS = 512  # mnt_wrapper's, but for complex double
WARP = 32
INPUT_VEC_SIZE = 4  # ReduceConfig::input_vec_size (vt0 of sum and mean)
MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD = 16, 256


def staging_buffers(func, args, multiprocessors: int, threads_per_multiprocessor: int
                    ) -> list[int]:
    """Bytes `func(*args)` allocates beside its output on CUDA, in order: the accumulation
    buffer of a reduction run in 32-bit-indexable parts, then the global buffer and the
    semaphores of a reduction split across blocks (0 for each it does not need); none for any
    other operator."""
    if func not in REDUCTIONS or not isinstance(args[0], torch.Tensor):
        return []
    tensor = args[0]
    if not tensor.is_floating_point() or tensor.dim() == 0 or tensor.numel() <= 1:
        return []
    dims = args[1] if len(args) > 1 and func in (aten.sum.dim_IntList, aten.mean.dim) else None
    reduced = {d % tensor.dim() for d in dims} if dims else set(range(tensor.dim()))
    accumulator = 8 if tensor.dtype == torch.float64 else 4
    rule = (tuple(_layout(tensor, reduced)), tensor.element_size(), accumulator,
            tensor.storage_offset(), multiprocessors, threads_per_multiprocessor)
    # Where it stages nothing, empty sizes all the same: at a larger batch size, made linear
    # from this one, the same reduction may split (`extrapolated`).
    return [Staged(size, rule, part) for part, size in enumerate(_sizes(*rule))]


class Staged(int):
    """A staging buffer's size, with the reduction it was chosen for. The buffer is not linear
    in the batch size (the split's regime changes as the rows grow: a buffer of 32 MiB at batch
    size 8 is 132 MiB, not 4 GiB, at 256), where the reduction's layout is: a recording made
    linear from two others (memory.py) recomputes the size from the layout (`extrapolated`)."""

    rule: tuple
    part: int

    def __new__(cls, size: int, rule: tuple, part: int):
        staged = super().__new__(cls, size)
        staged.rule, staged.part = rule, part
        return staged

    def __reduce__(self):
        return type(self), (int(self), self.rule, self.part)

    @staticmethod
    def sizes(rule: tuple) -> tuple[int, ...]:
        """Every size the rule gives, the one of `part` among them."""
        return _sizes(*rule)


INT32_MAX = 2**31 - 1


class BatchNormUpcast(Staged):
    """The fp32 copy of a bf16 input that CUDA's batch norm makes for its statistics when the
    input is too large for 32-bit indexing (aten/src/ATen/native/cuda/Normalization.cu:
    `batch_norm_choose_impl` takes `Impl::General` where `canUse32BitIndexMath` fails, and
    `batch_norm_mean_var` then runs `var_mean_out`, whose two-output `make_reduction`
    (ReduceOpsUtils.h) reduces `self.to(dtype1)` unless the input is already the statistics'
    dtype or fp16 into fp32 — bf16 into fp32 is copied). Tensors of fewer elements take cuDNN's
    or the contiguous kernels, which copy nothing. Rule: ((largest offset + 1, elements),) of the
    input, both linear in the batch size; 0 bytes below the limit, elements × 4 above it."""

    @staticmethod
    def sizes(rule: tuple) -> tuple[int, ...]:
        ((span, elements),) = rule[0]
        return (elements * 4 if span > INT32_MAX else 0,)


def batch_norm_buffers(args) -> list[int]:
    """What CUDA's batch norm allocates beside its outputs in a training forward pass: the
    upcast copy (BatchNormUpcast: 0 bytes where it makes none, so that a batch size made
    linear from this one may make it), for a bf16 input; none otherwise. The parts of its
    32-bit-indexed reduction stage a few KiB each (small pool): not followed."""
    tensor, training = args[0], args[5]
    if not training or tensor.dtype != torch.bfloat16 or tensor.numel() == 0:
        return []
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    rule = (((span, tensor.numel()),),)
    return [BatchNormUpcast(BatchNormUpcast.sizes(rule)[0], rule, 0)]


def extrapolated(first, second, steps: int) -> int | None:
    """The size `steps` batch sizes beyond the first of two consecutive recordings' sizes,
    when both are sizes of the same rule (a Staged kind: each number of its layout linear in
    the batch size); None otherwise."""
    if not (isinstance(first, Staged) and type(first) is type(second)) or \
            first.part != second.part or first.rule[1:] != second.rule[1:] or \
            len(first.rule[0]) != len(second.rule[0]):
        return None
    layout = tuple(tuple(x + (y - x) * steps for x, y in zip(a, b))
                   for a, b in zip(first.rule[0], second.rule[0]))
    rule = (layout, *second.rule[1:])
    return type(second)(second.sizes(rule)[second.part], rule, second.part)


def contiguous_sum(shape: tuple[int, ...], reduced: set[int], element_size: int,
                   multiprocessors: int, threads_per_multiprocessor: int) -> list[int]:
    """`staging_buffers` of a sum over `reduced` of a contiguous tensor of `shape` that a
    kernel makes itself (layer norm's backward sums its partial gradients so)."""
    strides, stride = [], 1
    for size in reversed(shape):
        strides.insert(0, stride)
        stride *= size
    accumulator = 8 if element_size == 8 else 4
    rule = (tuple(_layout_of(shape, strides, reduced)), element_size, accumulator, 0,
            multiprocessors, threads_per_multiprocessor)
    return [Staged(size, rule, part) for part, size in enumerate(_sizes(*rule))]


def _layout(tensor, reduced: set[int]) -> list[tuple[int, int, int]]:
    return _layout_of(tuple(tensor.shape), tuple(tensor.stride()), reduced)


def _layout_of(shape, strides, reduced: set[int]) -> list[tuple[int, int, int]]:
    """TensorIterator's dimensions of the reduction, fastest first: (size, input stride,
    output stride) in elements, the output contiguous with 0 strides where reduced."""
    out_stride, out_strides = 1, {}
    for d in reversed(range(len(shape))):
        if d not in reduced:
            out_strides[d] = out_stride
            out_stride *= shape[d]
    dims = [(shape[d], strides[d], out_strides.get(d, 0))
            for d in range(len(shape)) if shape[d] != 1]
    # reorder_dimensions: the reduced dimensions first; each group by its strides
    dims.sort(key=lambda d: (d[2] != 0, d[2] if d[2] else d[1]))
    merged: list[tuple[int, int, int]] = []
    for size, stride_in, stride_out in dims:  # coalesce_dimensions
        if merged:
            last = merged[-1]
            if last[1] * last[0] == stride_in and last[2] * last[0] == stride_out:
                merged[-1] = (last[0] * size, last[1], last[2])
                continue
        merged.append((size, stride_in, stride_out))
    return merged


@lru_cache(maxsize=4096)  # a size made linear asks once for each of its three parts
def _sizes(dims, element_size: int, accumulator: int, offset: int, multiprocessors: int,
           threads_per_multiprocessor: int) -> tuple[int, int, int]:
    """[accumulation buffer, staging buffer, semaphores]: gpu_reduce_kernel over the
    32-bit-indexable parts of the reduction (one part where it is indexable as it is)."""
    parts = _parts(dims, element_size, offset)
    staged = [_config(part, element_size, accumulator, start, multiprocessors,
                      threads_per_multiprocessor) or [0, 0] for part, start in parts]
    held = 0
    if len(parts) > 1 and accumulator != element_size:  # the output cannot accumulate itself
        held = accumulator * max([1] + [size * stride_out for size, _, stride_out in dims])
    return held, max(s[0] for s in staged), max(s[1] for s in staged)


def _parts(dims, element_size: int, offset: int) -> list[tuple[list, int]]:
    """TensorIterator's with_32bit_indexing: while an operand's byte offsets pass 2^31 - 1
    (or the elements do), the dimension of the largest extent halved, the first half first;
    each part with its offset in elements."""
    limit = 2**31 - 1
    out, todo = [], [(list(dims), offset)]
    while todo:
        part, start = todo.pop()
        numel = 1
        for size, _, _ in part:
            numel *= size
        spans = [1 + sum((size - 1) * stride * element_size for size, stride, _ in part),
                 1 + sum((size - 1) * stride * element_size for size, _, stride in part)]
        splittable = [d for d in range(len(part)) if part[d][0] > 1]
        if numel <= limit and max(spans) <= limit or not splittable:
            out.append((part, start))
            continue
        extents = [max((size - 1) * stride_in, (size - 1) * stride_out)
                   for size, stride_in, stride_out in part]
        dim = max(reversed(splittable), key=lambda d: extents[d])  # ties: the outer
        size, stride_in, stride_out = part[dim]
        first, second = list(part), list(part)
        first[dim] = (size // 2, stride_in, stride_out)
        second[dim] = (size - size // 2, stride_in, stride_out)
        todo.append((second, start + size // 2 * stride_in))
        todo.append((first, start))
    return out


def _config(dims, element_size: int, accumulator: int, offset: int, multiprocessors: int,
            threads_per_multiprocessor: int) -> list[int]:
    """setReduceConfig, then what gpu_reduce_kernel allocates for it."""
    if not dims:
        return []
    numel = 1
    for size, _, _ in dims:
        numel *= size
    reduce_dims = sum(1 for _, _, stride_out in dims if stride_out == 0)
    outputs = 1
    for size, _, stride_out in dims:
        if stride_out:
            outputs *= size
    inputs = numel // outputs
    on_fastest = reduce_dims == len(dims) or dims[0][1] < dims[reduce_dims][1]
    dim0, dim1 = (inputs, outputs) if on_fastest else (outputs, inputs)
    fastest = dims[0][1] if on_fastest else dims[reduce_dims][1]
    output_vec = 1
    if fastest == 1:
        if on_fastest and dim0 >= 128 and reduce_dims == 1:
            dim0 //= INPUT_VEC_SIZE  # vectorised along the input
        elif not on_fastest:
            output_vec = _output_vec_size(dims, reduce_dims, offset)
            dim0 //= output_vec
    max_threads = MAX_NUM_THREADS // output_vec
    pow2_0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    pow2_1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(pow2_0, WARP)
    height = min(pow2_1, max_threads // width)
    width = min(pow2_0, max_threads // height)
    step_input = step_output = 1
    if on_fastest:
        step_input *= width  # input_mult[BLOCK_X]: the lanes share an output
    else:
        step_output *= width
    values = -(-inputs // step_input)
    across_warps = values >= min(height * 16, MAX_VALUES_PER_THREAD)
    if across_warps:
        step_input *= height
    else:
        step_output *= height
    grid_x = -(-(outputs // output_vec) // step_output)
    values = -(-inputs // step_input)
    target = multiprocessors * (threads_per_multiprocessor // (width * height))
    if not (across_warps and values >= MAX_VALUES_PER_THREAD and grid_x <= target):
        return []
    ctas = max(min(-(-target // grid_x), -(-values // MIN_VALUES_PER_THREAD)),
               -(-values // MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return []
    buffer = accumulator * outputs * ctas
    if not on_fastest:  # no reduction across the lanes: one partial value per lane
        buffer *= width * output_vec
    return [buffer, 4 * grid_x]


def _output_vec_size(dims, reduce_dims: int, offset: int) -> int:
    """get_output_vec_size: 4 outputs a thread where the input's start, the outputs' count and
    every other stride allow it."""
    vec = 4
    for n in [offset, dims[reduce_dims][0]] + [d[1] for i, d in enumerate(dims)
                                                if i != reduce_dims]:
        while n % vec:
            vec //= 2
    return vec


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))
