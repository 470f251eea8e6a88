"""The prediction against a GPU: device constants fitted on a calibration set, then a grid of
configurations the constants never saw, each predicted first, then run.

    python bench/prediction_grid.py --calibrate                  # constants -> prediction/calibration/
    python bench/prediction_grid.py --grid                       # the grid + the largest batch sizes
    python bench/prediction_grid.py --calibrate --grid --budget-s 560 --out DIR   # both, one call
    python bench/prediction_grid.py --grid --quick               # 40 configurations, smaller shapes
    python bench/prediction_grid.py --report DIR/prediction-grid.jsonl           # the tables again
    python bench/prediction_grid.py --grid --dry-run             # the plan and its time estimate

Everything runs in this one process on GPU 0 (build the model on the device, the Trainer for a
few steps exactly as the worker sets it up, read the allocator's peaks and NVML, free,
empty_cache, next); the predictions run meanwhile on the CPU in a pool of processes that never
touch CUDA, each finished before its configuration runs. An out-of-memory configuration is
recorded as such and the next one runs. Results are appended to DIR/prediction-grid.jsonl as
they come and DIR/prediction-grid.md is rewritten after each, so a grid cut short by the time
limit still gives its table. `--budget-s` stops starting new work when the next item would not
end in time.

The calibration set (CALIBRATION) and the grid (grid()) share no configuration; docs/PREDICTION.md
names both and holds the table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anatomy.analysis import models  # noqa: E402
from anatomy.analysis.components import MEASURED_STEPS  # noqa: E402
from anatomy.analysis.options import RunOptions  # noqa: E402
from anatomy.analysis.prediction import device_constants  # noqa: E402
from anatomy.analysis.prediction.device_constants import DeviceCalibration, sdpa_signature  # noqa: E402

MIB = 2**20
STEPS = MEASURED_STEPS  # the probe's steps: the prediction replays the same ones


@dataclass(frozen=True)
class Config:
    model: str
    precision: str = "fp32"
    checkpointing: bool = False
    lora_rank: int = 0
    batch_size: int = 4
    seq_len: int = 512
    optim: str = "adamw_torch"
    grad_accum: int = 1

    def options(self) -> RunOptions:
        return RunOptions(model=self.model, precision=self.precision,
                          gradient_checkpointing=self.checkpointing, lora_rank=self.lora_rank,
                          batch_size=self.batch_size, seq_len=self.seq_len, optim=self.optim,
                          grad_accum=self.grad_accum, max_steps=STEPS, dataset_size=10**6)

    @property
    def label(self) -> str:
        words = [self.model, self.precision, f"b{self.batch_size}"]
        if models.resolve(self.model).task != models.IMAGE_CLASSIFICATION:
            words.append(f"s{self.seq_len}")
        words.append(self.optim)
        if self.checkpointing:
            words.append("ckpt")
        if self.lora_rank:
            words.append(f"lora{self.lora_rank}")
        if self.grad_accum > 1:
            words.append(f"accum{self.grad_accum}")
        return " ".join(words)


# The calibration set: what the device constants are fitted on (NVML's memory outside PyTorch;
# the rest are read from the device itself). No configuration of the grid is among them.
CALIBRATION = (
    Config("bert-large-uncased", "fp32", batch_size=4, seq_len=512),
    Config("gpt2", "bf16", True, batch_size=12, seq_len=512, optim="adagrad"),
    Config("qwen2-0.5b", "fp16", False, 16, batch_size=3, seq_len=384, optim="sgd"),
    Config("vit-base-patch16-224", "bf16", batch_size=48, optim="rmsprop"),
)

# The grid's models and their two shapes (batch size, sequence length): small, then longer.
SHAPES = {
    "bert-base-uncased": ((16, 128), (8, 512)),
    "gpt2": ((8, 256), (4, 1024)),
    "tinyllama-1.1b": ((4, 256), (2, 1024)),
    "qwen2-0.5b": ((4, 256), (2, 1024)),
    "vit-base-patch16-224": ((32, 0), (64, 0)),
}
QUICK_SHAPES = {
    "bert-base-uncased": ((8, 128), (4, 256)),
    "gpt2": ((4, 128), (2, 512)),
    "tinyllama-1.1b": ((2, 128), (1, 512)),
    "qwen2-0.5b": ((2, 128), (1, 512)),
    "vit-base-patch16-224": ((16, 0), (32, 0)),
}
# Per model, nine rows that between them vary everything: precision, checkpointing, LoRA or
# full, shape, optimizer, accumulation. (shape index, precision, checkpointing, LoRA, optim,
# accumulation)
ROWS = (
    (0, "fp32", False, 0, "adamw_torch", 1),
    (1, "bf16", False, 0, "adamw_torch", 1),
    (0, "fp16", False, 0, "adamw_torch_fused", 1),
    (1, "bf16", True, 0, "adafactor", 1),
    (1, "fp32", True, 0, "sgd", 1),
    (1, "bf16", False, 8, "adamw_torch", 1),
    (0, "fp16", True, 8, "adamw_torch", 1),
    (0, "fp32", False, 8, "rmsprop", 2),
    (0, "bf16", False, 0, "adagrad", 2),
)
# The largest batch size, predicted then run: each model × precision at one sequence length.
BATCH_SEQ_LEN = {"bert-base-uncased": 512, "gpt2": 1024, "tinyllama-1.1b": 1024,
                 "qwen2-0.5b": 1024, "vit-base-patch16-224": 0}


def grid(quick: bool) -> list[Config]:
    shapes = QUICK_SHAPES if quick else SHAPES
    rows = ROWS[:8] if quick else ROWS
    out = []
    for model, pair in shapes.items():
        for shape, precision, ckpt, lora, optim, accum in rows:
            batch, seq = pair[shape]
            out.append(Config(model, precision, ckpt, lora, batch, seq or 512, optim, accum))
    assert not set(out) & set(CALIBRATION)
    return out


def batch_pairs(quick: bool) -> list[Config]:
    precisions = ("bf16", "fp32", "fp16")
    pairs = [Config(model, precision, batch_size=1, seq_len=seq or 512)
             for precision in precisions for model, seq in BATCH_SEQ_LEN.items()]
    return pairs[:10] if quick else pairs


# --- predictions: a pool of CPU processes that never see the GPU ---

def _no_cuda() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def predict_one(config: Config, gpu_name: str) -> dict:
    from anatomy.analysis.prediction import predict

    started = time.monotonic()
    p = predict(config.options(), device="cuda", gpu_name=gpu_name)
    return {**p.to_dict(), "peak_reserved": p.peak_reserved, "marks": p.marks,
            "seconds": round(time.monotonic() - started, 2)}


def predict_fit(config: Config, gpu_name: str, total: int) -> dict:
    from anatomy.analysis.prediction import max_batch_size

    started = time.monotonic()
    fit = max_batch_size(config.options(), device="cuda", total=total, gpu_name=gpu_name)
    return {"batch_size": fit.batch_size, "capacity": fit.capacity, "peak": fit.peak_at_fit,
            "tried": list(fit.searched), "seconds": round(time.monotonic() - started, 2)}


# --- the GPU side ---

class NvmlPeak:
    """NVML's `used` for the training GPU, sampled every millisecond or so in a thread: the
    current figure and the peak since `reset()`."""

    def __init__(self, index: int):
        from anatomy.engine import nvml

        self.nvml, self.index = nvml, index
        self.current = self.read()
        self.peak = self.current
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> int:
        reading = self.nvml.memory(self.index)
        return reading.used if reading else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.current = self.read()
            self.peak = max(self.peak, self.current)
            time.sleep(0.001)

    def reset(self) -> None:
        self.current = self.read()
        self.peak = self.current

    def settle(self, seconds: float = 0.05) -> int:
        time.sleep(seconds)
        return self.peak

    def close(self) -> None:
        self._stop.set()


class _Components:
    """The reporter the probe callback reports to: keeps what it says."""

    def __init__(self):
        self.values: dict | None = None

    def components(self, values: dict) -> None:
        self.values = values


def run_config(config: Config, sampler: NvmlPeak, baseline: int, context: int) -> dict:
    """Build, train STEPS steps as the worker does, read the figures, free. OOM is a result."""
    import torch

    started = time.monotonic()
    try:
        result = _train(config, sampler, baseline, context, started)
    except torch.cuda.OutOfMemoryError as error:
        result = {"status": "oom", "error": str(error).splitlines()[0][:200]}
    except RuntimeError as error:
        if "out of memory" not in str(error).lower():
            raise
        result = {"status": "oom", "error": str(error).splitlines()[0][:200]}
    # The model, the Trainer and their tensors went with _train's frame (and the error's).
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def _train(config: Config, sampler: NvmlPeak, baseline: int, context: int, started: float
           ) -> dict:
    import torch
    from accelerate.state import AcceleratorState
    from transformers import Trainer, logging

    from anatomy.engine.callbacks import ComponentProbing
    from anatomy.engine.dataset import DummyDataset
    from anatomy.engine.probe import ComponentProbe
    from anatomy.engine.worker import _training_arguments

    logging.set_verbosity_error()
    options = config.options()
    spec = models.resolve(config.model)
    AcceleratorState._reset_state(True)  # a new Trainer may take another precision
    model, _ = models.build_model(spec, "cuda", lora_rank=options.lora_rank,
                                  lora_targets=options.lora_target_list())
    torch.cuda.synchronize()
    result: dict = {"status": "completed", "build_s": round(time.monotonic() - started, 2),
                    "weights_allocated": torch.cuda.memory_allocated()}
    captured = _Components()
    probe = ComponentProbe(model, use_cuda=True)  # resets the allocator's peaks, as the worker
    sampler.reset()
    with tempfile.TemporaryDirectory() as output_dir:
        args = _training_arguments(options.to_dict(), output_dir, True, "no")
        dataset = DummyDataset(spec, options.dataset_size, options.seq_len, options.seed)
        trainer = Trainer(model=model, args=args, train_dataset=dataset,
                          callbacks=[ComponentProbing(captured, probe)])
        trainer.train()
        torch.cuda.synchronize()
    measured = dict(captured.values or probe.result())
    measured["nvml_peak"] = sampler.settle() - baseline
    measured["context"] = context
    result["measured"] = measured
    return result


# --- calibration: the device's own facts, then the calibration set ---

def device_facts(sampler: NvmlPeak, baseline: int) -> dict:
    """The CUDA context (NVML after the first tensor and the initialisers' kernels, as the
    worker's kernel phase), cuBLAS's workspaces (the allocator around the first matrix products,
    forward and backward), which attention kernel torch picks per signature, and each kernel's
    backward scratch."""
    import torch

    from anatomy.engine.worker import load_initialisers

    torch.ones((1, 1)).to("cuda")
    load_initialisers("cuda")
    torch.cuda.synchronize()
    sampler.settle(0.3)
    context = sampler.read() - baseline
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
    del x, w, bias, hidden, y
    return {"context_bytes": int(context), "workspace_forward_bytes": _block(forward),
            "workspace_backward_bytes": _block(backward), "sdpa_backends": sdpa_table(),
            "attention_backward_bytes_per_element": attention_scratch()}


def _bytes(tensor, count: int = 1) -> int:
    return count * -(-tensor.untyped_storage().nbytes() // 512) * 512


def _block(size: int) -> int:
    """A workspace is a whole number of MiB: what is left of small tensors' rounding is not."""
    return max(0, round(size / MIB) * MIB)


def sdpa_table() -> dict[str, str]:
    """torch's own choice (`torch._fused_sdp_choice`) for every signature the shipped models and
    their precisions make, with the layout the models hand over (heads transposed)."""
    import torch
    from torch.nn.attention import SDPBackend

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    table = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for head_dim in (16, 32, 64, 128):
            for causal in (False, True):
                for mask in (False, True):
                    for dropout in (False, True):
                        for gqa in (False, True):
                            if causal and mask:
                                continue
                            q = torch.randn(2, 128, 8, head_dim, device="cuda", dtype=dtype
                                            ).transpose(1, 2).requires_grad_()
                            heads = 2 if gqa else 8
                            k, v = (torch.randn(2, 128, heads, head_dim, device="cuda",
                                                dtype=dtype).transpose(1, 2).requires_grad_()
                                    for _ in range(2))
                            attn_mask = (torch.zeros(128, 128, device="cuda", dtype=dtype)
                                         if mask else None)
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
    that kernel (torch.nn.attention.sdpa_kernel), with the layout the models hand over, at two
    sizes (the larger ratio kept)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"flash": (SDPBackend.FLASH_ATTENTION, torch.bfloat16),
               "efficient": (SDPBackend.EFFICIENT_ATTENTION, torch.float32),
               "cudnn": (SDPBackend.CUDNN_ATTENTION, torch.bfloat16)}
    out = {}
    for name, (backend, dtype) in kernels.items():
        ratios = []
        for batch, seq in ((2, 512), (4, 1024)):
            try:
                bases = [torch.randn(batch, seq, 8, 64, device="cuda", dtype=dtype,
                                     requires_grad=True) for _ in range(3)]
                q, k, v = (b.transpose(1, 2) for b in bases)
                with sdpa_kernel([backend]):
                    attention = F.scaled_dot_product_attention(q, k, v)
                grad = torch.randn(batch, seq, 8, 64, device="cuda", dtype=dtype).transpose(1, 2)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                attention.backward(grad)
                torch.cuda.synchronize()
                grads = sum(_bytes(b.grad) for b in bases)
                scratch = torch.cuda.max_memory_allocated() - before - grads
                ratios.append(max(0, scratch) / q.numel())
                del bases, q, k, v, attention, grad
            except Exception as error:  # noqa: BLE001 - a kernel this GPU lacks: no scratch
                print(f"  {name} backward: not measured ({type(error).__name__}: "
                      f"{str(error)[:80]})", flush=True)
                break
            finally:
                torch.cuda.empty_cache()
        if ratios:
            out[name] = round(max(ratios), 4)
    return out


def calibrate(out_dir: Path, sampler: NvmlPeak, baseline: int, gpu, log) -> DeviceCalibration:
    import torch
    import transformers

    facts = device_facts(sampler, baseline)
    log(f"context {facts['context_bytes'] / MIB:.0f} MiB, cuBLAS workspaces "
        f"{facts['workspace_forward_bytes'] / MIB:.0f} + "
        f"{facts['workspace_backward_bytes'] / MIB:.0f} MiB, attention kernels "
        f"{sorted(set(facts['sdpa_backends'].values()))}, backward scratch "
        f"{facts['attention_backward_bytes_per_element']}")
    outside = []
    for config in CALIBRATION:
        result = run_config(config, sampler, baseline, facts["context_bytes"])
        record(out_dir, {"kind": "calibration", "config": asdict(config), **result})
        if result["status"] == "completed":
            m = result["measured"]
            outside.append(m["nvml_peak"] - facts["context_bytes"] - m["peak_reserved"])
            log(f"calibration {config.label}: NVML {m['nvml_peak'] / MIB:,.0f} MiB, outside "
                f"PyTorch {outside[-1] / MIB:,.0f} MiB ({result['seconds']:.1f} s)")
        else:
            log(f"calibration {config.label}: {result['status']}")
    calibration = DeviceCalibration(
        device=gpu.name, total_bytes=gpu.total, fitted=True,
        # the most NVML held outside PyTorch in the calibration set: the safe side of it
        outside_bytes=int(max(outside)) if outside else device_constants.DEFAULT.outside_bytes,
        calibration_set=tuple(c.label for c in CALIBRATION),
        source=(f"bench/prediction_grid.py --calibrate, {time.strftime('%Y-%m-%d')}, torch "
                f"{torch.__version__}, transformers {transformers.__version__}"),
        **facts)
    path = calibration.save()
    log(f"wrote {path}")
    return calibration


# --- results ---

def record(out_dir: Path, row: dict) -> None:
    with (out_dir / "prediction-grid.jsonl").open("a") as file:
        file.write(json.dumps(row) + "\n")


def _error(predicted, measured) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured * 100


def _mib(value) -> str:
    return "" if value is None else f"{value / MIB:,.0f}"


def _pct(value) -> str:
    return "" if value is None else f"{value:+.2f}%"


def report(rows: list[dict]) -> str:
    """The markdown for docs/PREDICTION.md from the recorded rows (a partial grid included)."""
    header = next((r for r in rows if r.get("kind") == "header"), {})
    grid_rows = [r for r in rows if r.get("kind") == "grid"]
    lines = [f"GPU: {header.get('gpu', '?')}; torch {header.get('torch', '?')}, transformers "
             f"{header.get('transformers', '?')}, peft {header.get('peft', '?')}; constants: "
             f"{header.get('calibration', '?')}.", "",
             "| configuration | weights | gradients | states | activations | peak predicted / "
             "measured (MiB) | error | reserved pred. / meas. | NVML pred. / meas. (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors, nvml_ok, nvml_rows, under = [], 0, 0, []
    for row in grid_rows:
        config, p, m = row["config"], row.get("predicted", {}), row.get("measured")
        label = Config(**config).label
        if row["status"] != "completed" or not m:
            lines.append(f"| {label} | | | | | {row['status']} | | | |")
            continue
        c = p["components"]

        def cell(name: str, measured_value, c=c) -> str:
            exact = "=" if c[name] == measured_value else _mib(measured_value)
            return f"{_mib(c[name])} / {exact}"

        error = _error(c["peak"], m["peak_allocated"])
        errors.append(error)
        if error < 0:
            under.append((error, label))
        nvml_error = p.get("nvml_peak", 0) - m["nvml_peak"]
        nvml_rows += 1
        if abs(nvml_error) <= max(0.03 * m["nvml_peak"], 300 * MIB):
            nvml_ok += 1
        lines.append(
            f"| {label} | {cell('weights', m.get('weights'))} | "
            f"{cell('gradients', m.get('gradients'))} | "
            f"{cell('optimizer_states', m.get('optimizer_states'))} | "
            f"{_mib(c['activations'])} / {_mib(m.get('activations'))} | "
            f"{_mib(c['peak'])} / {_mib(m['peak_allocated'])} | {_pct(error)} | "
            f"{_mib(p.get('peak_reserved'))} / {_mib(m.get('peak_reserved'))} | "
            f"{_mib(p.get('nvml_peak'))} / {_mib(m['nvml_peak'])} ({nvml_error / MIB:+,.0f}) |")
    if errors:
        absolute = sorted(abs(e) for e in errors)
        p95 = absolute[min(len(absolute) - 1, round(0.95 * (len(absolute) - 1)))]
        worst = min(under) if under else None
        lines += ["", f"{len(errors)} configurations completed of {len(grid_rows)} run. "
                  f"Allocator peak: median |error| {statistics.median(absolute):.2f}%, 95th "
                  f"percentile {p95:.2f}%, largest |error| {absolute[-1]:.2f}%; worst "
                  "under-prediction " + (f"{worst[0]:+.2f}% ({worst[1]})" if worst else "none") +
                  f". NVML peak within 3% or 300 MiB: {nvml_ok} of {nvml_rows}."]
    fits = [r for r in rows if r.get("kind") == "batch"]
    if fits:
        lines += ["", "| model, precision | predicted largest batch size | runs | verdict |",
                  "|---|---|---|---|"]
        verdicts = []
        for row in fits:
            config = Config(**row["config"])
            runs = ", ".join(f"{b}: {s}" for b, s in row["runs"])
            verdicts.append(row["verdict"])
            lines.append(f"| {config.model}, {config.precision} | {row['predicted']} | {runs} | "
                         f"{row['verdict']} |")
        good = sum(v in ("equal", "one below") for v in verdicts)
        lines += ["", f"Predicted largest batch size equal to the runs' or one below: {good} of "
                  f"{len(verdicts)} pairs; above: {sum(v == 'above' for v in verdicts)}."]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path) -> None:
    path = out_dir / "prediction-grid.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (out_dir / "prediction-grid.md").write_text(report(rows))


# --- the whole session ---

def estimate(configs: list[Config], pairs: list[Config]) -> float:
    """Seconds on an H200, roughly: a configuration builds and runs three steps in a few
    seconds; a largest-batch-size check runs two or three configurations near the memory's
    limit."""
    per_model = {"tinyllama-1.1b": 6.0, "qwen2-0.5b": 5.0}
    grid_s = sum(per_model.get(c.model, 3.5) for c in configs)
    return 25 + grid_s + 22 * len(pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", action="store_true", help="fit the device constants")
    parser.add_argument("--grid", action="store_true", help="run the grid (the default)")
    parser.add_argument("--quick", action="store_true", help="40 configurations, smaller shapes")
    parser.add_argument("--no-batch-sizes", action="store_true",
                        help="skip the largest-batch-size checks")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start nothing that would end after this many seconds")
    parser.add_argument("--out", default=str(ROOT / "docs" / "data"),
                        help="folder for prediction-grid.jsonl and prediction-grid.md")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="CPU processes for the predictions")
    parser.add_argument("--report", metavar="JSONL", help="only write the tables from a run")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)

    if args.report:
        path = Path(args.report)
        write_report(path.parent)
        print((path.parent / "prediction-grid.md").read_text())
        return 0
    run_grid = args.grid or not args.calibrate
    configs = grid(args.quick) if run_grid else []
    pairs = [] if args.no_batch_sizes or not run_grid else batch_pairs(args.quick)
    log(f"plan: {'calibration (' + str(len(CALIBRATION)) + ' runs), ' if args.calibrate else ''}"
        f"{len(configs)} grid configurations, {len(pairs)} largest-batch-size checks; about "
        f"{estimate(configs, pairs) + (60 if args.calibrate else 0):.0f} s on an H200")
    if args.dry_run:
        for config in configs:
            print("  ", config.label)
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "prediction-grid.jsonl").write_text("") if run_grid else None

    from anatomy.engine.devices import machine

    info = machine()
    if not info.has_gpu:
        print("error: no GPU here (NVML sees none); this benchmark runs on one", file=sys.stderr)
        return 2
    gpu = info.devices[0]
    sampler = NvmlPeak(gpu.nvml_index)
    sampler.settle(0.3)
    baseline = sampler.read()  # before this process touches CUDA

    import peft
    import torch
    import transformers

    if args.calibrate:
        context = calibrate(out_dir, sampler, baseline, gpu, log).context_bytes
    else:  # the context comes with the first tensor, as in a run's kernel phase
        from anatomy.engine.worker import load_initialisers

        torch.ones((1, 1)).to("cuda")
        load_initialisers("cuda")
        torch.cuda.synchronize()
        sampler.settle(0.3)
        context = sampler.read() - baseline
    constants = device_constants.load(gpu.name)
    record(out_dir, {"kind": "header", "gpu": gpu.name, "torch": torch.__version__,
                     "transformers": transformers.__version__, "peft": peft.__version__,
                     "python": platform.python_version(), "calibration": constants.source,
                     "calibration_set": list(constants.calibration_set)})
    if not run_grid:
        sampler.close()
        return 0

    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn"),
        initializer=_no_cuda)
    predictions = {c: pool.submit(predict_one, c, gpu.name) for c in configs}
    fits = {c: pool.submit(predict_fit, c, gpu.name, gpu.total) for c in pairs}
    spent: list[float] = []
    for index, config in enumerate(configs, 1):
        expected = statistics.mean(spent[-5:]) if spent else 6.0
        if args.budget_s and time.monotonic() - started + expected > args.budget_s:
            log(f"budget reached: {len(configs) - index + 1} configurations not run")
            break
        predicted = predictions[config].result()  # predicted first, then run
        result = run_config(config, sampler, baseline, context)
        spent.append(result["seconds"])
        record(out_dir, {"kind": "grid", "config": asdict(config), "predicted": predicted,
                         **result})
        write_report(out_dir)
        if result["status"] == "completed":
            m = result["measured"]
            log(f"[{index}/{len(configs)}] {config.label}: peak predicted "
                f"{predicted['components']['peak'] / MIB:,.0f} / measured "
                f"{m['peak_allocated'] / MIB:,.0f} MiB "
                f"({_pct(_error(predicted['components']['peak'], m['peak_allocated']))}), NVML "
                f"{predicted.get('nvml_peak', 0) / MIB:,.0f} / {m['nvml_peak'] / MIB:,.0f} MiB "
                f"({result['seconds']:.1f} s, predicted in {predicted['seconds']:.1f} s)")
        else:
            log(f"[{index}/{len(configs)}] {config.label}: {result['status']}")
    for config in pairs:
        if args.budget_s and time.monotonic() - started + 25 > args.budget_s:
            log("budget reached: largest-batch-size checks stop here")
            break
        fit = fits[config].result()
        size = fit["batch_size"]
        runs: list[tuple[int, str]] = []
        if size is None:
            runs.append((1, run_config(replace(config, batch_size=1), sampler, baseline,
                                       context)["status"]))
            verdict = "above" if runs[-1][1] == "completed" else "equal"
        else:
            at = run_config(replace(config, batch_size=size), sampler, baseline, context)
            runs.append((size, at["status"]))
            if at["status"] != "completed":
                verdict = "above"
            else:
                beyond = run_config(replace(config, batch_size=size + 1), sampler, baseline,
                                    context)
                runs.append((size + 1, beyond["status"]))
                if beyond["status"] != "completed":
                    verdict = "equal"
                else:
                    further = run_config(replace(config, batch_size=size + 2), sampler,
                                         baseline, context)
                    runs.append((size + 2, further["status"]))
                    verdict = "one below" if further["status"] != "completed" else "below"
        record(out_dir, {"kind": "batch", "config": asdict(config), "predicted": size,
                         "prediction": fit, "runs": runs, "verdict": verdict})
        write_report(out_dir)
        log(f"largest batch size, {config.model} {config.precision}: predicted {size}; runs "
            f"{runs}: {verdict}")
    pool.shutdown(cancel_futures=True)
    sampler.close()
    write_report(out_dir)
    log(f"done: {out_dir / 'prediction-grid.md'}")
    print((out_dir / "prediction-grid.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
