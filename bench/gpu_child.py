"""What bench/prediction_grid.py runs in a fresh process, one at a time: a training run as the
worker trains (its own CUDA context, as a user's run has), the device's facts for the
calibration. Each function returns plain data (it crosses a pipe); an out-of-memory error is a
result, with what the allocator and CUDA said at that moment.
"""

from __future__ import annotations

import gc
import json
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the child imports anatomy inside the functions that use it
    from anatomy.store import Components

MIB = 2**20
# torch's message: "Tried to allocate 1.20 GiB. GPU 0 has a total capacity of 139.80 GiB of
# which 343.12 MiB is free. ... Of the allocated memory 137.10 GiB is allocated by PyTorch, and
# 1.20 GiB is reserved by PyTorch but unallocated."
_OOM_FIGURES = {
    "requested": r"Tried to allocate ([\d.]+ [KMG]iB)",
    "device_total": r"total capacity of ([\d.]+ [KMG]iB)",
    "device_free": r"of which ([\d.]+ [KMG]iB) is free",
    "allocated": r"([\d.]+ [KMG]iB) is allocated by PyTorch",
    "reserved_unallocated": r"([\d.]+ [KMG]iB) is reserved by PyTorch but unallocated",
}
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def oom_figures(message: str) -> dict[str, int]:
    """The byte figures of torch's out-of-memory message (what it names of them)."""
    out = {}
    for name, pattern in _OOM_FIGURES.items():
        found = re.search(pattern, message)
        if found:
            number, unit = found.group(1).split()
            out[name] = round(float(number) * _UNITS[unit])
    return out


def nvml_used(index: int | None) -> int | None:
    if index is None:
        return None
    from anatomy.engine import nvml

    reading = nvml.memory(index)
    return reading.used if reading else None


def allocator_state(cuda: bool) -> dict:
    """The caching allocator's figures now, and the ceiling it could grow to: what CUDA has free
    plus what the allocator already holds."""
    if not cuda:
        return {}
    import torch

    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": reserved,
            "peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved(), "free": free, "total": total,
            "ceiling": free + reserved, "segments": stats.get("segment.all.current", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "inactive_split": stats.get("inactive_split_bytes.all.current", 0)}


class _Reporter:
    """What the component probe's callback reports to: kept."""

    def __init__(self):
        self.values: Components | None = None
        self.said: list[str] = []

    def components(self, values: Components) -> None:
        self.values = values

    def tell(self, level: str, text: str) -> None:
        self.said.append(f"{level}: {text}")


def train(config: dict, device: str, nvml_index: int | None, baseline: int) -> dict:
    """Train `config` (bench/prediction_grid.py's Config, as a dict) for its steps as the worker
    does: the first tensor (kernel phase), the weights allocated on the device and read, then
    initialised, the Trainer with the worker's arguments and the component probe. Returns the
    probe's components, the allocator's figures, NVML's readings over `baseline`, and on an
    out-of-memory error what torch said and the allocator's state then."""
    import torch

    started = time.monotonic()
    cuda = device == "cuda"
    result: dict = {"status": "completed"}
    try:
        result.update(_train(config, device, nvml_index, baseline, result))
    except torch.cuda.OutOfMemoryError as error:
        message = str(error)
        result.update(status="oom", error=message.splitlines()[0][:300],
                      oom=oom_figures(message), memory=allocator_state(cuda))
    except RuntimeError as error:
        if "out of memory" not in str(error).lower():
            raise
        result.update(status="oom", error=str(error).splitlines()[0][:300],
                      memory=allocator_state(cuda))
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def _train(config: dict, device: str, nvml_index: int | None, baseline: int,
           result: dict) -> dict:
    import torch
    from transformers import Trainer, logging
    from transformers.trainer_callback import PrinterCallback

    from anatomy.analysis import models
    from anatomy.analysis.options import RunOptions
    from anatomy.engine.callbacks import ComponentProbing
    from anatomy.engine.probe import ComponentProbe
    from anatomy.engine.training import dummy_dataset, training_arguments

    logging.set_verbosity_error()
    cuda = device == "cuda"
    options = RunOptions(**config)
    spec = models.resolve(options.model)
    dataset = dummy_dataset(options, spec)
    torch.ones((1, 1)).to(device)  # the kernel phase: the CUDA context
    if cuda:
        torch.cuda.synchronize()
    used = nvml_used(nvml_index)
    result["context"] = None if used is None else used - baseline
    built = time.monotonic()
    model, source = models.build_model(spec, device, lora_rank=options.lora_rank,
                                       lora_targets=options.lora_targets,
                                       initialise=False)
    if cuda:
        torch.cuda.synchronize()
    used = nvml_used(nvml_index)
    result["weights_nvml"] = None if used is None else used - baseline
    result["weights_allocated"] = torch.cuda.memory_allocated() if cuda else None
    if source == models.RANDOM_WEIGHTS:
        models.initialise(model)
    result["build_s"] = round(time.monotonic() - built, 2)
    reporter = _Reporter()
    probe = ComponentProbe(model, use_cuda=cuda)  # resets the allocator's peaks, as the worker
    with tempfile.TemporaryDirectory() as output_dir:
        args = training_arguments(options, output_dir, cuda)
        trainer = Trainer(model=model, args=args, train_dataset=dataset,
                          callbacks=[ComponentProbing(reporter, probe)])
        trainer.remove_callback(PrinterCallback)  # as the worker: no line per step
        trainer.train()
        if cuda:
            torch.cuda.synchronize()
    measured = (reporter.values or probe.result()).to_dict()
    out = {"measured": measured, "memory": allocator_state(cuda)}
    del trainer, model, probe
    gc.collect()
    return out


def device_facts(nvml_index: int | None, baseline: int) -> dict:
    """The calibration's facts of the device, read in a process of their own: the CUDA context
    (NVML after the first tensor, as the worker's kernel phase), what CUDA lets a process
    allocate, cuBLAS's workspaces (the allocator around the process's first matrix products,
    forward and backward), the multiprocessors that CUDA's reduction kernel sizes its split by."""
    import torch

    torch.ones((1, 1)).to("cuda")
    torch.cuda.synchronize()
    time.sleep(0.3)
    context = nvml_used(nvml_index) - baseline
    _, usable = torch.cuda.mem_get_info()
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    bias = torch.zeros(64, device="cuda")
    before = torch.cuda.memory_allocated()
    hidden = torch.nn.functional.linear(x, w, bias)  # addmm (cuBLASLt with its bias epilogue)
    y = hidden @ w  # mm
    torch.cuda.synchronize()
    forward = torch.cuda.memory_allocated() - before - _bytes(hidden) - _bytes(y)
    before = torch.cuda.memory_allocated()
    y.sum().backward()  # the autograd thread's first matrix products
    torch.cuda.synchronize()
    backward = torch.cuda.memory_allocated() - before - _bytes(x.grad) - _bytes(w.grad)
    properties = torch.cuda.get_device_properties(0)
    return {"context_bytes": int(context), "usable_bytes": int(usable),
            "workspace_forward_bytes": _whole_mib(forward),
            "workspace_backward_bytes": _whole_mib(backward),
            "multiprocessors": properties.multi_processor_count,
            "threads_per_multiprocessor": properties.max_threads_per_multi_processor}


def _bytes(tensor) -> int:
    return -(-tensor.untyped_storage().nbytes() // 512) * 512


def _whole_mib(size: int) -> int:
    """A workspace is a whole number of MiB: what is left of small tensors' rounding is not."""
    return max(0, round(size / MIB) * MIB)


def attention_facts() -> dict:
    """Which attention kernel torch picks on this GPU for every signature (`sdpa_backends`), and
    each kernel's backward scratch (`attention_backward_bytes_per_element`)."""
    return {"sdpa_backends": sdpa_table(),
            "attention_backward_bytes_per_element": attention_scratch()}


def sdpa_table() -> dict[str, str]:
    """torch's own choice (`torch._fused_sdp_choice`) for every signature the models and their
    precisions make, with the layout the models hand over (heads transposed)."""
    import torch
    from torch.nn.attention import SDPBackend

    from anatomy.prediction.device_constants import sdpa_signature

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    table = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for head_dim in (16, 32, 64, 80, 96, 128, 256):
            for causal in (False, True):
                for mask in ("nomask", "mask", "gradmask"):
                    for dropout in (False, True):
                        for gqa in (False, True):
                            if causal and mask != "nomask":
                                continue
                            q = torch.randn(2, 128, 8, head_dim, device="cuda", dtype=dtype
                                            ).transpose(1, 2).requires_grad_()
                            heads = 2 if gqa else 8
                            k, v = (torch.randn(2, 128, heads, head_dim, device="cuda",
                                                dtype=dtype).transpose(1, 2).requires_grad_()
                                    for _ in range(2))
                            attn_mask = (torch.zeros(128, 128, device="cuda", dtype=dtype,
                                                     requires_grad=mask == "gradmask")
                                         if mask != "nomask" else None)
                            try:
                                choice = SDPBackend(torch._fused_sdp_choice(
                                    q, k, v, attn_mask, 0.1 if dropout else 0.0, causal,
                                    enable_gqa=gqa))
                            except (RuntimeError, ValueError):  # no fused kernel takes it
                                choice = SDPBackend.MATH
                            key = sdpa_signature(str(dtype).removeprefix("torch."), head_dim,
                                                 causal, mask, dropout, gqa, True)
                            table[key] = names.get(choice, "math")
    return table


def attention_scratch() -> dict[str, float]:
    """Bytes a backward attention kernel allocates beyond the gradients it returns, per element
    of the query: the allocator's peak inside the backward pass of one attention call through
    that kernel (torch.nn.attention.sdpa_kernel), with the layout the models hand over; the
    largest ratio over two sizes, head sizes 64 and 128, full and causal attention. Grouped-query
    attention (4 query heads a key head) is its own entry ("cudnn gqa"): a kernel may expand
    the keys' gradients per query head."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"flash": (SDPBackend.FLASH_ATTENTION, torch.bfloat16),
               "efficient": (SDPBackend.EFFICIENT_ATTENTION, torch.float32),
               "cudnn": (SDPBackend.CUDNN_ATTENTION, torch.bfloat16)}
    out = {}
    for name, (backend, dtype) in kernels.items():
        for gqa in (False, True):
            ratios = []
            for batch, seq, head_dim, causal in ((2, 512, 64, False), (4, 1024, 64, True),
                                                 (2, 1024, 128, True)):
                try:
                    ratios.append(_scratch_ratio(torch, F, sdpa_kernel, backend, dtype, batch,
                                                 seq, head_dim, causal, gqa))
                except Exception as error:  # noqa: BLE001 - a kernel this GPU lacks: no scratch
                    print(f"  {name}{' gqa' if gqa else ''} backward: not measured "
                          f"({type(error).__name__}: {str(error)[:80]})", flush=True)
                finally:
                    torch.cuda.empty_cache()
            if ratios:
                out[name + (" gqa" if gqa else "")] = round(max(ratios), 4)
    return out


def _scratch_ratio(torch, F, sdpa_kernel, backend, dtype, batch, seq, head_dim, causal,
                   gqa) -> float:
    heads, kv_heads = 8, (2 if gqa else 8)
    query = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=dtype,
                        requires_grad=True)
    keys = [torch.randn(batch, seq, kv_heads, head_dim, device="cuda", dtype=dtype,
                        requires_grad=True) for _ in range(2)]
    q, k, v = (b.transpose(1, 2) for b in (query, *keys))
    with sdpa_kernel([backend]):
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    grad = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    attention.backward(grad)
    torch.cuda.synchronize()
    grads = sum(_bytes(b.grad) for b in (query, *keys))
    scratch = torch.cuda.max_memory_allocated() - before - grads
    return max(0, scratch) / q.numel()


def train_with_history(config: dict, device: str, path: str, stacks: str = "python") -> dict:
    """`train`, with the caching allocator's history recorded (every block's size, address and
    Python stack; with `stacks="all"` its C++ stack too, which names the kernel of a block the
    autograd thread allocated) and what was alive at its allocated peak written to `path` as
    JSON: what the trace's peak can be held against, block by block (bench/peak_snapshot.py)."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks=stacks)
    result = train(config, device, None, 0)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    Path(path).write_text(json.dumps(live_at_peak(snapshot)))
    _write_events(snapshot, Path(path).with_suffix(".events.json.gz"))
    return result


def _write_events(snapshot: dict, path: Path) -> None:
    """Every action the caching allocator recorded, in order, as [action, address, size, stream,
    frame]: the frames interned in a table. A run at the capacity's edge can then be replayed
    block by block and segment by segment next to the simulated allocator's (an out-of-memory
    run's last actions included: the history holds the `oom` action)."""
    import gzip

    table: dict[str, int] = {}
    rows = []
    for event in snapshot["device_traces"][0]:
        where = " <- ".join(_frames(event.get("frames", []))[:3])
        rows.append([event["action"], event.get("addr", 0), event.get("size", 0),
                     event.get("stream", 0), table.setdefault(where, len(table))])
    segments = [{"address": s["address"], "total_size": s["total_size"],
                 "allocated_size": s["allocated_size"], "stream": s["stream"],
                 "blocks": [[b["size"], b["state"]] for b in s["blocks"]]}
                for s in snapshot["segments"]]
    with gzip.open(path, "wt") as out:
        json.dump({"frames": list(table), "events": rows, "segments_at_end": segments}, out)


def live_at_peak(snapshot: dict) -> dict:
    """The blocks alive when the allocated bytes were highest over the recorded history, each
    with its size, the action's index and its innermost frames outside torch's own plumbing."""
    live: dict[int, tuple[int, int, list]] = {}
    allocated = peak = 0
    at_peak: dict[int, tuple[int, int, list]] = {}
    peak_index = -1
    for index, event in enumerate(snapshot["device_traces"][0]):
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = (event["size"], index, event.get("frames", []))
            allocated += event["size"]
            if allocated > peak:
                peak, peak_index = allocated, index
                at_peak = dict(live)
        elif action == "free_completed" and event["addr"] in live:
            allocated -= live.pop(event["addr"])[0]
    before = sum(segment["allocated_size"] for segment in snapshot["segments"]) - \
        allocated  # alive before the history started (the weights): alive at the end still
    blocks = [{"size": size, "index": index, "frames": _frames(frames)}
              for size, index, frames in sorted(at_peak.values(), key=lambda b: b[1])]
    return {"peak_over_start": peak, "peak_index": peak_index, "events": index + 1,
            "alive_before_history": before, "blocks": blocks}


def _frames(frames: list) -> list[str]:
    keep = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}"
            for f in frames if f["filename"].endswith(".py")
            and "torch/utils/_" not in f["filename"]
            and "torch/nn/modules/module.py" not in f["filename"]]
    # C++ frames (stacks="all"): the innermost that name an ATen kernel or cuDNN
    native = [f["name"] for f in frames if not f["filename"].endswith(".py")
              and ("at::native" in f["name"] or "cudnn" in f["name"].lower())]
    return native[:2] + keep[:4]
