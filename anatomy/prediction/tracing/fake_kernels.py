"""Operators whose fake (meta) kernels refuse what their real kernels run, or hold less memory
than they do, given the shapes the real ones make.

- `_grouped_mm` (a mixture of experts' grouped matmul, transformers' default experts
  implementation): the meta kernel insists on bf16 inputs, while the CPU kernel and the CUDA one
  of the GPUs the trace stands for take the fp32 inputs a Trainer's fp32 weights give. Its output
  is the shape the meta kernel gives for bf16 inputs, in the inputs' own dtype. The meta kernel
  also checks the CUDA kernel's 16-byte alignment of rows, which fp32 inputs on the CPU need not
  have (a width of 44 elements): it is asked with rows padded to it, which gives the same shape.
- `im2col` (`F.unfold`, MobileViT-v2's patches): ATen's kernels make the output like the input
  and resize it to the patches' shape (Im2Col.cpp, .cu), so a smaller output keeps the input's
  storage (a 7×7 map whose 2×2 patches cover 6×6: 100,352 bytes held for 73,728), which
  autograd then saves; the meta kernel holds the output's size.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten


ALIGNMENT = 8  # bf16 elements: 16 bytes


def _meta_like(tensor: torch.Tensor | None, dtype: torch.dtype | None = None):
    """A meta tensor of `tensor`'s shape and layout (rows or columns contiguous), its rows
    padded to the alignment."""
    if tensor is None:
        return None
    dtype = dtype or tensor.dtype
    shape = list(tensor.shape)
    if len(shape) < 2:
        return torch.empty(shape, dtype=dtype, device="meta")
    columns = tensor.stride(-2) == 1 and tensor.stride(-1) != 1
    if columns:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    padded = shape[:-1] + [-(-shape[-1] // ALIGNMENT) * ALIGNMENT]
    made = torch.empty(padded, dtype=dtype, device="meta")[..., :shape[-1]]
    return made.transpose(-1, -2) if columns else made


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if torch.bfloat16 in (mat_a.dtype, mat_b.dtype):  # the meta kernel's own case
        return aten._grouped_mm.default(mat_a, mat_b, offs, bias, out_dtype)
    with _disable_current_modes():
        shaped = aten._grouped_mm.default(
            _meta_like(mat_a, torch.bfloat16), _meta_like(mat_b, torch.bfloat16),
            _meta_like(offs), _meta_like(bias, torch.bfloat16), torch.bfloat16)
    return torch.empty_strided(shaped.shape, shaped.stride(), dtype=out_dtype or mat_a.dtype,
                               device=mat_a.device)


def _im2col(input, kernel_size, dilation, padding, stride):
    shaped = aten.im2col.default(input, kernel_size, dilation, padding, stride)
    return torch.empty_like(input).resize_(shaped.shape)


FIXES = {aten._grouped_mm.default: _grouped_mm, aten.im2col.default: _im2col}


class FakeKernels(TorchDispatchMode):
    """Runs `FIXES`' rules in place of the fake kernels they replace."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return FIXES.get(func, func)(*args, **(kwargs or {}))


@contextmanager
def self_swaps():
    """A module converted to what it already is (Switch Transformers' router calls
    `self.classifier.to(self.dtype)` in its forward): `Tensor.to` returns the tensor itself, and
    `Module._apply` swaps each fake parameter (a tensor subclass) with a new parameter around it,
    which torch refuses for a fake tensor (the trace holds references to it). Swapping a tensor
    with a view of all of itself changes nothing."""
    from torch import utils

    swap = utils.swap_tensors

    def same(t1, t2) -> bool:
        return t1.untyped_storage()._cdata == t2.untyped_storage()._cdata and \
            (t1.dtype, t1.shape, t1.stride(), t1.storage_offset()) == \
            (t2.dtype, t2.shape, t2.stride(), t2.storage_offset())

    def swap_unless_same(t1, t2):
        if t1 is not t2 and not same(t1, t2):
            swap(t1, t2)

    utils.swap_tensors = swap_unless_same
    try:
        yield
    finally:
        utils.swap_tensors = swap
