"""Operators whose fake (meta) kernels refuse what their real kernels run, given the shapes the
real ones make.

- `_grouped_mm` (a mixture of experts' grouped matmul, transformers' default experts
  implementation): the meta kernel insists on bf16 inputs, while the CPU kernel and the CUDA one
  of the GPUs the trace stands for take the fp32 inputs a Trainer's fp32 weights give. Its output
  is the shape the meta kernel gives for bf16 inputs, in the inputs' own dtype.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten


def _meta_like(tensor: torch.Tensor | None, dtype: torch.dtype | None = None):
    if tensor is None:
        return None
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=dtype or tensor.dtype,
                               device="meta")


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    with _disable_current_modes():
        shaped = aten._grouped_mm.default(
            _meta_like(mat_a, torch.bfloat16), _meta_like(mat_b, torch.bfloat16),
            _meta_like(offs), _meta_like(bias, torch.bfloat16), torch.bfloat16)
    return torch.empty_strided(shaped.shape, shaped.stride(), dtype=out_dtype or mat_a.dtype,
                               device=mat_a.device)


FIXES = {aten._grouped_mm.default: _grouped_mm}


class FakeKernels(TorchDispatchMode):
    """Runs `FIXES`' rules in place of the fake kernels they replace."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rule = FIXES.get(func)
        if rule is not None and all(getattr(t, "dtype", None) != torch.bfloat16 for t in args[:2]):
            return rule(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
