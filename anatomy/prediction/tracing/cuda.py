"""CUDA's kernels, for a step traced on a machine without CUDA.

The fake tensors of a trace are CPU tensors (a fake CUDA tensor needs CUDA's device guard, which a
CPU build of torch lacks), so the operators that run CPU code where CUDA would run other code are
replaced here by what CUDA runs. Each difference is named; the constants measured on a GPU come
from the device's calibration (prediction/device_constants.py):

- **autocast**: the CPU's autocast lists differ from CUDA's. The CPU's run as they are (the
  linear layers, matmuls and losses are on both); the operators CUDA autocasts to fp32 and the
  CPU does not (layer_norm, group_norm, softmax and log_softmax, exp/log/pow/rsqrt and their
  kin, sum/cumsum/prod and norms) get their fp32 inputs here, and the few CUDA casts to 16 bits
  that the CPU lacks (einsum, addmv, addr, mv) their 16-bit ones (`CUDA_FP32`,
  `CUDA_LOWER_PRECISION`; torch 2.13's aten/src/ATen/autocast_mode.h);
- **scaled dot-product attention**: CUDA picks flash, memory-efficient, cuDNN or the math
  kernel by dtype, head size, mask (none, one cuDNN takes, a learnable bias that needs its
  gradient, a shape cuDNN does not take), dropout and grouped-query attention; the choice is the
  calibrated device's (`DeviceCalibration.sdpa_backend`, queried from torch on that GPU), and the
  chosen kernel's own operator runs, so its saved tensors and log-sum-exp buffers are the
  kernel's. The math kernel is written out (its fp32 upcast of 16-bit inputs, its s×s matrices);
- **cross entropy**: the CPU's autocast runs `cross_entropy_loss` in fp32, CUDA's only its
  nll_loss: a 16-bit input's log-probabilities stay 16-bit, and the fp32 copy is theirs
  (`_cross_entropy`);
- **dropout**: CUDA's fused kernel keeps a 1-byte mask where the CPU keeps one of the input's
  dtype (`native_dropout`), and allocates it before its output (`_output_order`); in-place
  dropout takes no fused kernel on either device (noise of the input's dtype);
- **cuBLAS workspaces**: the first matrix product of the forward pass (main thread) and of the
  backward pass (autograd's device thread) each allocate their handle's workspace through the
  caching allocator, for the life of the process, and the forward's a cuBLASLt one beside it
  (`_workspaces`);
- **attention backward buffers**: the flash / efficient / cuDNN backward kernels allocate
  scratch (flash's fp32 dq accumulator, cuDNN's workspace) beside their outputs, freed when they
  return: bytes per element of the query, calibrated per kernel;
- **reductions' staging buffers**: CUDA's reduction kernel splits a sum or mean with many
  inputs an output (a bias's gradient over every token) across thread blocks and gathers their
  partial sums through a buffer in global memory, freed when it returns (tracing/reductions.py,
  from Reduce.cuh's own choice and the device's multiprocessors);
- **softmax's backward**: CUDA's kernel first multiplies the gradient by the softmax's output
  into a temporary of the gradient's shape (`Tensor tmp = grad * output;` in
  aten/src/ATen/native/cuda/SoftMax.cu, softmax_backward_cuda_out), freed when it returns; the
  CPU's kernel makes none. On the math attention it is one more b × h × s × s matrix beside the
  gradients (log-softmax's backward makes none on either device); the math attention's
  `_safe_softmax` holds the plain softmax and a boolean of the -inf scores beside its result;
- **layer norm's backward**: with many rows and few features it writes the weight's and the
  bias's gradients as partial sums in buffers of their own, then sums them
  (tracing/layer_norm.py);
- **batch norm past 32-bit indexing**: over more than 2^31 - 1 elements CUDA's batch norm takes
  its general kernel, whose statistics reduce an fp32 copy of a bf16 input, freed as it returns
  (tracing/reductions.py, `batch_norm_buffers`): 10 GB at each of ResNet-50's widest batch norms
  at batch 3,254 on the H200;
- **convolutions** are not CUDA's: cuDNN picks an engine for each convolution as it runs, from
  heuristics that neither PyTorch's source nor a CPU can tell, and allocates that engine's
  workspace (up to five times the output on the H200: RegNet's grouped convolutions) through the
  caching allocator, trying the next engine where it does not fit (aten/src/ATen/native/cudnn/
  Conv_v8.cpp, `try_configs`). The trace keeps what share of the forward passes' results the
  convolutions made (`convolution_share`); "What fits" keeps that share of the device's
  convolution margin free (device_constants.py);
- **optimizers** pick torch's multi-tensor (foreach) kernels on CUDA tensors by themselves, and
  `clip_grad_norm_` too (trainer_step.py's `foreach=True`); the fused AdamW kernel is its own
  operator on either device.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn import _reduction as _Reduction
from torch.overrides import TorchFunctionMode

from anatomy.prediction.device_constants import (
    DeviceCalibration,
    mask_kind,
    sdpa_signature,
)
from anatomy.prediction.tracing import layer_norm
from anatomy.prediction.tracing.reductions import (
    REDUCTIONS,
    Staged,
    batch_norm_buffers,
    staging_buffers,
)
from anatomy.prediction.tracing.tracker import LiveTensors

aten = torch.ops.aten

# Operators CUDA's autocast runs in fp32 and the CPU's leaves alone (policies fp32 and
# fp32_set_opt_dtype of autocast_mode.h), as the Python functions that reach them.
CUDA_FP32 = frozenset({
    F.layer_norm, F.group_norm, F.softplus, F.cosine_similarity, F.softmax, F.log_softmax,
    torch.softmax, torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax,
    torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log, torch.log2, torch.log10,
    torch.log1p, torch.expm1, torch.reciprocal, torch.Tensor.reciprocal, torch.rsqrt,
    torch.Tensor.rsqrt, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.acos,
    torch.asin, torch.cosh, torch.sinh, torch.tan, torch.erfinv, torch.logsumexp,
    torch.Tensor.logsumexp, torch.cumsum, torch.Tensor.cumsum, torch.cumprod, torch.prod,
    torch.Tensor.prod, torch.sum, torch.Tensor.sum, torch.linalg.vector_norm, torch.norm,
    torch.Tensor.norm, torch.renorm, torch.dist, torch.cdist,
})
# Reductions whose CUDA autocast passes dtype=float32 rather than casting the input.
_SET_OPT_DTYPE = frozenset({torch.sum, torch.Tensor.sum, torch.cumsum, torch.Tensor.cumsum,
                            torch.cumprod, torch.prod, torch.Tensor.prod, F.softmax,
                            F.log_softmax, torch.softmax, torch.log_softmax,
                            torch.Tensor.softmax, torch.Tensor.log_softmax})
# Products CUDA's autocast runs in 16 bits and the CPU's does not.
CUDA_LOWER_PRECISION = frozenset({torch.einsum, torch.addmv, torch.addr, torch.mv,
                                  torch.Tensor.mv, torch.chain_matmul, torch.linalg.multi_dot})
# The operators that call cuBLAS (after decomposition, as the tracker sees them).
GEMM_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default,
                      aten.baddbmm.default, aten.addbmm.default, aten.mv.default,
                      aten.addmv.default, aten.addr.default, aten._addmm_activation.default})
ATTENTION_BACKWARD = {
    aten._scaled_dot_product_flash_attention_backward.default: "flash",
    aten._scaled_dot_product_efficient_attention_backward.default: "efficient",
    aten._scaled_dot_product_cudnn_attention_backward.default: "cudnn",
}
LOWER_PRECISION = (torch.float16, torch.bfloat16)


def _cast_floats(value, dtype, only_from=None):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype \
            and (only_from is None or value.dtype in only_from):
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype, only_from) for v in value)
    return value


def _bytes_of(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes_of(v) for v in value)
    return 0


CONVOLUTIONS = frozenset({F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
                          F.conv_transpose3d})
CONVOLUTION_OPS = frozenset({torch.ops.aten.convolution.default,
                             torch.ops.aten.convolution_backward.default})


class CudaKernels(TorchFunctionMode):
    """Replaces, during a trace, what the CPU would run by what CUDA runs (the module's list).
    `tracker` receives the allocations CUDA kernels make beside their outputs."""

    # cuDNN's convolution workspaces where their sizes are known: (operator, args, outputs) ->
    # the sizes (replay.Workspace) each call asks for after its outputs, freed as it returns.
    # None by default: their sizes are cuDNN's heuristics', measured on the GPU only where asked
    # (prediction/workspaces.Placeholders: predict --measure-convolutions, sweep
    # --from-prediction; bench/convolution_workspaces.py replays an H200's recorded ones).
    convolution_workspaces = None

    def __init__(self, calibration: DeviceCalibration, tracker: LiveTensors):
        super().__init__()
        self.calibration = calibration
        self.tracker = tracker
        self.workspaces: set[str] = set()
        tracker.on_op = self._after_op
        tracker.output_order = _output_order
        self.sdpa_calls: list[str] = []  # the kernel of each attention call, for the report
        # The bytes of the forward passes' results, and of the convolutions' among them: cuDNN's
        # workspaces, not traced, grow with the convolutions' outputs.
        self.output_bytes = self.convolution_bytes = 0

    # --- Python-level functions ---
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = self._function(func, args, kwargs or {})
        # The forward passes' results (the optimizer's step runs without gradients), not a
        # tensor's attributes read (`.grad`, `.data`: the same storages again).
        if torch.is_grad_enabled() and getattr(func, "__name__", "") != "__get__":
            made = _bytes_of(out)
            self.output_bytes += made
            if func in CONVOLUTIONS:
                self.convolution_bytes += made
        return out

    def _function(self, func, args, kwargs):
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        if func is F.cross_entropy and torch.is_autocast_enabled("cpu"):
            return _cross_entropy(*args, **kwargs)
        if torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            if func in CUDA_FP32:
                if func in _SET_OPT_DTYPE and "dtype" not in kwargs and _any_lower(args):
                    kwargs = {**kwargs, "dtype": torch.float32}
                elif func not in _SET_OPT_DTYPE:
                    args = _cast_floats(args, torch.float32, LOWER_PRECISION)
            elif func in CUDA_LOWER_PRECISION:
                args = _cast_floats(args, dtype)
        return func(*args, **kwargs)

    def convolution_share(self) -> float:
        """What convolutions made of the forward passes' results, in bytes (0 without any)."""
        return self.convolution_bytes / self.output_bytes if self.output_bytes else 0.0

    def _dropout(self, input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        if inplace:  # dropout_ never takes the fused kernel (Dropout.cpp `_dropout_impl<true>`;
            # HF MobileNetV2's classifier): noise of the input's dtype, multiplied in place.
            # CUDA's bernoulli_ fills it where it is; the CPU's makes an int32 temporary first.
            if p == 1.0:
                return input.mul_(input.new_zeros(()))
            return input.mul_(torch.empty_like(input).fill_(1.0 / (1.0 - p)))
        if p == 1.0:
            return input * 0.0
        # CUDA's fused kernel: the output and a bool mask, the mask saved for the backward pass.
        return torch.native_dropout(input, p, True)[0]

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):  # scaled_dot_product_attention is a 16-bit op
            # CUDA's autocast casts every floating argument, the mask too: a float mask (ALiBi's
            # bias, b × h × s × s) is copied to 16 bits at every call, and the kernel keeps it.
            dtype = torch.get_autocast_dtype("cpu")
            query, key, value, attn_mask = (_cast_floats(t, dtype)
                                            for t in (query, key, value, attn_mask))
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        signature = sdpa_signature(str(query.dtype).removeprefix("torch."), query.shape[-1],
                                   is_causal, mask_kind(attn_mask, query, key), dropout_p > 0,
                                   enable_gqa and key.shape[-3] != query.shape[-3], grad,
                                   value.shape[-1])
        backend = self.calibration.sdpa_backend(signature)
        self.sdpa_calls.append(backend)
        # The kernel runs as CUDA's autocast runs a listed operator: with autocast off inside.
        with torch.autocast("cpu", enabled=False):
            return self._kernel(backend, query, key, value, attn_mask, dropout_p, is_causal,
                                scale, enable_gqa, grad)

    @staticmethod
    def _kernel(backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                grad):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # torch's SDPA turns a boolean mask into an additive one of the query's dtype at
            # every call (convert_boolean_attn_mask): a new b × 1 × s × s tensor that the fused
            # kernels keep for the backward pass (ModernBERT's sliding-window mask, per layer).
            attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(
                float("-inf"), dtype=query.dtype, device=attn_mask.device))
        if backend == "efficient" and attn_mask is not None:
            attn_mask = _efficient_mask(attn_mask, query, key)
        if backend == "flash":
            return aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "efficient":
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale)[0]
        if backend == "cudnn":
            return aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, grad, dropout_p, is_causal, False,
                scale=scale)[0]
        return _math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                               enable_gqa)

    def recomputation(self):
        """Contexts for activation checkpointing's `context_fn`: the forward pass already runs
        in this mode; the recomputation runs inside the backward pass, which a TorchFunctionMode
        does not follow (Tensor.backward is a torch function: it runs with its modes off)."""
        return nullcontext(), _Entered(self)

    # --- what kernels allocate beside their outputs (called by the tracker after each op) ---
    def _after_op(self, func, args, out) -> None:
        if func in GEMM_OPS:
            thread = "backward" if torch._C._current_autograd_node() is not None else "forward"
            if thread not in self.workspaces:
                self.workspaces.add(thread)
                for size in _workspaces(self.calibration, thread):
                    self.tracker.timeline.persistent.add(self.tracker.timeline.alloc(size))
        elif func in ATTENTION_BACKWARD:
            grad_query, grad_key = out[0], out[1]
            size = self.calibration.attention_backward_bytes(
                ATTENTION_BACKWARD[func], grad_query.numel(),
                gqa=grad_key.shape[-3] != grad_query.shape[-3])
            if size:
                tid = self.tracker.timeline.alloc(size)
                self.tracker.timeline.free(tid)
        elif func is aten._softmax_backward_data.default:
            self._scratch(_softmax_backward_scratch(args[0], args[1]))
        elif func is aten._safe_softmax.default:
            self._scratch(_safe_softmax_scratch(args[0], out))
        elif func in REDUCTIONS:
            self._scratch(staging_buffers(func, args, *self.calibration.processors()))
        elif func is aten.native_batch_norm.default:
            self._scratch(batch_norm_buffers(args))
        elif func in CONVOLUTION_OPS and self.convolution_workspaces is not None:
            for size in self.convolution_workspaces(func, args, out):
                self.tracker.timeline.free(self.tracker.timeline.alloc(size))
        elif func is aten.native_layer_norm_backward.default:
            weights = [t for t in out[1:] if isinstance(t, torch.Tensor)]
            if weights:
                self._nested(layer_norm.backward_buffers(
                    tuple(args[1].shape), len(args[2]), weights[0].element_size(),
                    len(weights), *self.calibration.processors()))

    def _scratch(self, sizes: list[int]) -> None:
        """Buffers a kernel allocates one after the other beside its outputs and frees as it
        returns (the last made, the first freed: C++ frees its locals so)."""
        self._nested([("alloc", size) for size in sizes] +
                     [("free", size) for size in reversed(sizes)])

    def _nested(self, steps: list[tuple[str, int]]) -> None:
        """A kernel's own buffers, ("alloc", size) and ("free", size) in its order, each free
        the latest buffer still held."""
        timeline = self.tracker.timeline
        held: list[int | None] = []
        for action, size in steps:
            if action == "alloc":
                # Empty staging sizes stay (a batch size made linear from this one may stage
                # there: reductions.Staged); the replay allocates nothing for 0 bytes.
                held.append(timeline.alloc(size) if size or isinstance(size, Staged) else None)
            else:
                tid = held.pop()
                if tid is not None:
                    timeline.free(tid)


class _Entered:
    def __init__(self, mode: CudaKernels):
        self.mode = mode

    def __enter__(self):
        self.mode.__enter__()

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _workspaces(calibration: DeviceCalibration, thread: str) -> list[int]:
    """The blocks a thread's first matrix product allocates for the life of the process: its
    cuBLAS handle's workspace (the backward thread's whole figure), and on the forward thread
    beside it the cuBLASLt workspace of the linear layers' fused bias (what the forward's
    figure holds beyond the backward's), two blocks as the H200's actions show (33,554,432 B,
    then 1,048,576 B), not one: the second falls in the small pool."""
    handle = calibration.workspace_backward_bytes
    if thread == "backward":
        return [handle] if handle else []
    total = calibration.workspace_forward_bytes
    if not handle or total <= handle:
        return [total] if total else []
    return [handle, total - handle]


def _output_order(func, count: int) -> list[int] | None:
    """The order CUDA's kernel allocates an operator's outputs in, where it is not the order
    they are returned in: dropout's mask before its output (dropout_cuda, Dropout.cu)."""
    if func is aten.native_dropout.default and count == 2:
        return [1, 0]
    return None


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                   reduce=None, reduction="mean", label_smoothing=0.0):
    """`cross_entropy_loss` as CUDA's autocast runs it: the CPU's lists it (an fp32 copy of the
    input, then log_softmax in fp32), CUDA's does not, so its parts run as they are listed there
    (aten/src/ATen/native/LossNLL.cpp): log_softmax in the input's own dtype (the loss passes
    it), then nll_loss, an fp32 operator, on an fp32 copy of that. Class-index targets without
    label smoothing; the other forms run as the CPU runs them."""
    if (input.dtype not in LOWER_PRECISION or target.is_floating_point() or label_smoothing):
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce,
                               reduction, label_smoothing)
    if size_average is not None or reduce is not None:
        reduction = _Reduction.legacy_get_string(size_average, reduce)
    with torch.autocast("cpu", enabled=False):
        log_probs = torch.log_softmax(input, 0 if input.dim() == 1 else 1, dtype=input.dtype)
        return torch._C._nn.nll_loss_nd(log_probs.float(),
                                        target, None if weight is None else weight.float(),
                                        _Reduction.get_enum(reduction), ignore_index)


def _any_lower(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in LOWER_PRECISION for a in args)


def _softmax_backward_scratch(grad, output) -> list[int]:
    """What CUDA's softmax backward allocates beside its gradient (softmax_backward_cuda_out,
    then host_softmax_backward): `tmp = grad * output` (the two's promoted dtype, the layout
    torch's elementwise rule gives it, asked of the fake tensors), then contiguous copies of
    `tmp` and of `output` where they are not contiguous."""
    tmp = grad * output
    sizes = [tmp.untyped_storage().nbytes()]
    sizes += [t.numel() * t.element_size() for t in (tmp, output) if not t.is_contiguous()]
    return sizes


def _safe_softmax_scratch(scores, out) -> list[int]:
    """What `_safe_softmax` (the math attention's softmax, aten/src/ATen/native/transformers/
    attention.cpp) holds beside its result while it runs: the softmax, -inf and 0 as one-element
    tensors, the boolean of the scores that are -inf and of the rows that are all -inf."""
    rows = scores.numel() // max(scores.shape[-1], 1)
    one = out.element_size()
    return [out.numel() * one, one, scores.numel(), rows, one]


def _efficient_mask(mask, query, key):
    """torch's preprocess_mask for the memory-efficient kernel: a mask whose strides are not
    multiples of 8 elements is copied into one padded to them (its last dimension's), then
    expanded to batch × heads × queries × keys (a view)."""
    aligned = all(stride % 8 == 0 for stride in mask.stride()[:-1]) and mask.stride(-1) == 1
    if not aligned:
        last = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """torch's `_scaled_dot_product_attention_math` as CUDA runs it: 16-bit inputs upcast to
    fp32 (torch keeps allow_fp16_bf16_reduction_math_sdp off), both factors scaled by the square
    root of the scale, the causal mask as an additive float matrix added in place, the
    softmax `_safe_softmax` (its temporaries: `_after_op`), the kernel's dropout (a boolean mask
    arrives additive: `_kernel` converts it as torch does, before any kernel)."""
    origin = query.dtype
    if origin in LOWER_PRECISION:
        query, key, value = query.float(), key.float(), value.float()
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    query = query * factor
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        causal = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        attn_mask = torch.where(causal.logical_not(), float("-inf"), 0.0).to(query.dtype)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, -3)
        value = value.repeat_interleave(groups, -3)
    attn = torch.matmul(query, key.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)  # in place, as torch adds it to plain (not subclassed) tensors
    attn = aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    return torch.matmul(attn, value).to(origin)
