"""Profiling training steps with torch.profiler, in the training process; the operator classes
and their totals are anatomy/analysis/operations.py's."""

from __future__ import annotations

from anatomy.analysis.operations import OPTIMIZER_RANGE, OperationProfile, aggregate
from anatomy.vocabulary import Precision


def profile_steps(model, batch: dict, steps: int = 1, device: str = "cpu", *, optimizer=None,
                  precision: str = Precision.FP32, warmup: int = 1) -> OperationProfile:
    """Profile `steps` training steps (forward, backward, clip, optimizer step) of `model`.

    The model must already be on `device`; `batch` (tensors by argument name, labels included)
    is moved there. Without `optimizer`, AdamW with the Trainer's defaults (lr 5e-5, no weight
    decay). fp16/bf16 run the forward pass under autocast, as the Trainer does (fp16 without a
    loss scaler: a few steps' timing does not need one). `warmup` steps run unprofiled first:
    the optimizer's states and cuBLAS's handles are created there, not in what is measured.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    on_gpu = torch.device(device).type == "cuda"
    batch = {k: v.to(device) for k, v in batch.items()}
    model.train()
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(precision)

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        with record_function(OPTIMIZER_RANGE):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the Trainer's max_grad_norm
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, with_flops=True, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    return aggregate(prof.events(), "cuda" if on_gpu else "cpu", steps)
