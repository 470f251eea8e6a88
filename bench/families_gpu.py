"""The three families the H200's figures missed, on a GPU, in one call: T5 in fp32 (the attention
kernel torch really runs), mixtures of experts in bf16 (the allocator's reserve) and convolution
networks in bf16 (NVML's figure and cuDNN's workspaces), predicted on this machine's CPU next to
what a run measures, beside the grid's own families.

    python bench/families_gpu.py --out $OUT                  # every part, ~8 min on an H200
    python bench/families_gpu.py --out $OUT --parts sdpa     # one part

Parts, in this order (each within what is left of `--budget-s`):
- sdpa: T5's attention calls as this machine's transformers makes them (flan-t5-small, fp32 and
  bf16, training): each call's mask (shape, strides, dtype, whether it needs its gradient),
  `torch._fused_sdp_choice` for it, and the CUDA kernels the profiler saw in one forward and
  backward pass, by kind (memory-efficient `fmha_cutlass*`, flash, cuDNN, softmax of the math
  kernel) -> OUT/sdpa.json;
- families: FAMILIES predicted (on this machine's CPU, the grid's way, for this GPU's memory),
  then run in a fresh process each: allocator peak (`torch.cuda.max_memory_allocated`),
  reserve, NVML's peak over the empty GPU; and NVML's band where cuDNN's workspaces are not
  traced, next to the measured -> OUT/families/prediction-grid.{jsonl,md};
- measured: MEASURED through `anatomy predict --measure-convolutions --json` (their workspaces
  measured on this GPU at the run's batch size), next to the families' runs of the same
  configurations -> OUT/measured.json;
- edge: EDGE's largest batch size predicted for this GPU (`max_batch_size`), then run there:
  where the reserve with no device around it would pass the device, the allocator releases
  its cache -> edge/prediction-grid.{jsonl,md} in OUT/runs.tgz;
- snapshots (not in the default parts): SNAPSHOTS trained with the caching allocator's history
  recorded (every action, bench/peak_snapshot.py) -> OUT/snapshots.tgz;
- grid: bench/prediction_grid.py's own grid (`--quick`) with the time left ->
  grid/prediction-grid.{jsonl,md} in OUT/runs.tgz.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

PARTS = ("sdpa", "families", "measured", "edge", "snapshots", "grid")
DEFAULT_PARTS = ("sdpa", "families", "measured", "edge", "grid")
# The families, at sizes a run takes seconds to a minute for; none is in the calibration set.
FAMILIES = (
    "flan-t5-small fp32 b16 s512 adamw_torch",
    "t5-base-shaped fp32 b8 s512 adamw_torch",
    "flan-t5-small bf16 b16 s512 adamw_torch",
    "mixtral-shaped bf16 b4 s1024 adamw_torch",
    "qwen3-moe-shaped bf16 b8 s1024 adamw_torch",
    "resnet-50 bf16 b256 adamw_torch",
    "convnext-tiny bf16 b256 adamw_torch",
)
# Convolution networks predicted with their workspaces measured on this GPU (a FAMILIES row
# each: the run it is held against).
MEASURED = ("resnet-50 bf16 b256 adamw_torch", "convnext-tiny bf16 b256 adamw_torch")
# Mixtures of experts at the largest batch size predicted for this GPU: "b{}" filled in.
EDGE = ("qwen3-moe-shaped bf16 b{} s1024 adamw_torch", "mixtral-shaped bf16 b{} s1024 adamw_torch")
SNAPSHOTS = (
    "mixtral-shaped bf16 b4 s1024 adamw_torch",
    "qwen3-moe-shaped bf16 b8 s1024 adamw_torch",
    "flan-t5-small fp32 b16 s512 adamw_torch",
)
T5 = ROOT / "bench" / "models" / "flan-t5-small.json"
# Kernel names by attention kernel (the profiler's CUDA activity).
KERNEL_KINDS = {"efficient": ("fmha_cutlass", "mem_eff", "efficient_attention"),
                "flash": ("flash_fwd", "flash_bwd", "flash::"),
                "cudnn": ("cudnn_generated_fort_native_sdpa", "sdpa_", "fmha_sm90", "cudnn"),
                "math softmax": ("softmax",)}


def _say(text: str) -> None:
    print(text, flush=True)


def _spy(original, calls: list[dict], names: dict):
    """`F.scaled_dot_product_attention` that first writes down what the kernel gets (autocast's
    casts made) and torch's own choice for it."""
    import torch

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        mask = attn_mask
        if torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(dtype) for t in (query, key, value))
            mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
        try:
            chosen = names.get(torch.nn.attention.SDPBackend(torch._fused_sdp_choice(
                query, key, value, mask, dropout_p, is_causal, **kwargs)), "math")
        except (RuntimeError, ValueError) as error:
            chosen = f"error: {str(error).splitlines()[0][:80]}"
        calls.append({
            "query": [list(query.shape), list(query.stride()), str(query.dtype)],
            "mask": None if mask is None else [list(mask.shape), list(mask.stride()),
                                               str(mask.dtype), mask.requires_grad],
            "dropout": dropout_p, "causal": is_causal, "torch_choice": chosen})
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, **kwargs)

    return spy


def sdpa(out: Path) -> dict:
    """T5's attention calls on this GPU, as transformers makes them here."""
    import torch
    import torch.nn.functional as F
    import transformers
    from torch.nn.attention import SDPBackend
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    values = {k: v for k, v in json.loads(T5.read_text()).items() if not k.startswith("_")}
    config = AutoConfig.for_model(**values)
    model = AutoModelForSeq2SeqLM.from_config(config).cuda().train()  # its default
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0),
              "attn_implementation": model.config._attn_implementation, "precisions": {}}
    original = F.scaled_dot_product_attention
    for precision in ("fp32", "bf16"):
        calls: list[dict] = []
        spy = _spy(original, calls, names)
        ids = torch.randint(5, 1000, (2, 128), device="cuda")
        F.scaled_dot_product_attention = spy
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, \
                    torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                model(input_ids=ids, labels=ids).loss.backward()
            torch.cuda.synchronize()
        finally:
            F.scaled_dot_product_attention = original
        kernels: dict[str, int] = {}
        for event in prof.key_averages():
            name = event.key.lower()
            for kind, marks in KERNEL_KINDS.items():
                if any(mark in name for mark in marks):
                    kernels[f"{kind}: {event.key[:90]}"] = event.count
                    break
        result["precisions"][precision] = {"calls": calls, "kernels": kernels}
        _say(f"sdpa, T5 {precision} ({transformers.__version__}, torch {torch.__version__}):")
        for call in calls:
            _say(f"   mask {call['mask']}  dropout {call['dropout']}  causal {call['causal']}"
                 f"  -> torch {call['torch_choice']}")
        for name, count in sorted(kernels.items()):
            _say(f"   kernel x{count}: {name}")
    (out / "sdpa.json").write_text(json.dumps(result, indent=1))
    return result


def _grid(out: Path, budget: float, labels: list[str] | None) -> None:
    command = [sys.executable, str(HERE / "prediction_grid.py"), "--parts", "grid",
               "--out", str(out), "--budget-s", str(int(budget))]
    command += ["--configs", *labels] if labels else ["--quick"]
    subprocess.run(command, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def bands(out: Path) -> None:
    """The families' NVML next to the predicted band (low: traced; high: with what cuDNN's
    workspaces may add), where there is one."""
    path = out / "families" / "prediction-grid.jsonl"
    if not path.is_file():
        return
    _say("NVML, measured next to the predicted (band where cuDNN's workspaces are not traced):")
    for line in path.read_text().splitlines():
        row = json.loads(line)
        predicted = row.get("predicted") or {}
        if row.get("kind") != "grid" or row.get("status") != "completed":
            continue
        low, high = predicted.get("nvml_peak"), predicted.get("nvml_high")
        measured = row.get("nvml_peak")
        if low is None or measured is None:
            continue
        inside = "" if high is None else (" inside" if low <= measured <= high else " outside")
        _say(f"   {row['label']:45} measured {measured / 2**20:10,.0f}  predicted "
             f"{low / 2**20:10,.0f}" + ("" if high is None else f" to {high / 2**20:,.0f}")
             + f" MiB{inside}")


def measured(out: Path) -> None:
    """`predict --measure-convolutions` for MEASURED, each next to its families' run."""
    sys.path.insert(0, str(HERE))
    from prediction_grid import Config

    rows = {}
    for label in MEASURED:
        config = Config.from_label(label)
        command = [sys.executable, "-m", "anatomy", "predict", "--model", config.model,
                   "--precision", config.precision, "--batch-size", str(config.batch_size),
                   "--optim", config.optim, "--max-steps", str(3), "--dataset-size",
                   str(max(64, config.batch_size * 3)), "--measure-convolutions", "--json"]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        rows[label] = {"seconds": round(time.monotonic() - started, 1),
                       "returncode": done.returncode, "stderr": done.stderr[-2000:]}
        try:
            rows[label].update(json.loads(done.stdout))
        except ValueError:
            rows[label]["stdout"] = done.stdout[-2000:]
        predicted = rows[label]
        _say(f"measured workspaces, {label}: NVML {(predicted.get('nvml_peak') or 0) / 2**20:,.0f}"
             f" MiB, reserve {(predicted.get('peak_reserved') or 0) / 2**20:,.0f} MiB, peak "
             f"{(predicted.get('components', {}).get('peak') or 0) / 2**20:,.0f} MiB "
             f"({rows[label]['seconds']} s; {done.stderr.strip().splitlines()[-1:]})")
    (out / "measured.json").write_text(json.dumps(rows, indent=1))


def edge_labels() -> list[str]:
    """EDGE at the largest batch size predicted for this machine's GPU."""
    from anatomy.analysis.options import RunOptions
    from anatomy.engine.devices import machine
    from anatomy.prediction import max_batch_size

    sys.path.insert(0, str(HERE))
    from prediction_grid import Config

    gpu = machine().devices[0]
    labels = []
    for label in EDGE:
        config = Config.from_label(label.format(1))
        options: RunOptions = config.options()
        fit = max_batch_size(options, device="cuda", total=gpu.total, gpu_name=gpu.name)
        _say(f"edge: {fit.line(gpu.name)}")
        if fit.batch_size:
            labels.append(label.format(fit.batch_size))
    return labels


def snapshots(out: Path, labels: list[str]) -> None:
    folder = out / "snapshots"
    subprocess.run([sys.executable, str(HERE / "peak_snapshot.py"), "--out", str(folder),
                    *labels], check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    with tarfile.open(out / "snapshots.tgz", "w:gz") as archive:
        archive.add(folder, arcname="snapshots")
    for path in sorted(folder.iterdir()):
        path.unlink()
    folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--budget-s", type=float, default=520,
                        help="the families and the grid start nothing that would end after it")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    started = time.monotonic()

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    args.out.mkdir(parents=True, exist_ok=True)
    if "sdpa" in parts:
        sdpa(args.out)
    if "families" in parts:
        _grid(args.out / "families", left(), list(FAMILIES))
        bands(args.out)
    if "measured" in parts and left() > 60:
        measured(args.out)
    if "edge" in parts and left() > 90:
        _grid(args.out / "edge", left(), edge_labels())
    if "snapshots" in parts and left() > 90:
        snapshots(args.out, list(SNAPSHOTS))
    if "grid" in parts and left() > 30:
        _grid(args.out / "grid", left(), None)
    _pack(args.out, ("families", "edge", "grid"))
    _say(f"done in {time.monotonic() - started:.0f} s")
    return 0


def _pack(out: Path, names: tuple[str, ...]) -> None:
    """The grids' folders in one archive, OUT/runs.tgz: few files come back from a GPU call."""
    folders = [out / name for name in names if (out / name).is_dir()]
    if not folders:
        return
    with tarfile.open(out / "runs.tgz", "w:gz") as archive:
        for folder in folders:
            archive.add(folder, arcname=folder.name)
    for folder in folders:
        for path in sorted(folder.iterdir()):
            path.unlink()
        folder.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
