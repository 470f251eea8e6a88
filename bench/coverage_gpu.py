"""The coverage families on a GPU: what a CPU-only machine cannot check (a few minutes on an H200).

    python bench/coverage_gpu.py --expect               # on a CPU-only machine: the predictions
                                                        # -> docs/data/coverage-gpu-expected.json
    python bench/coverage_gpu.py --out DIR              # on the GPU: the three checks below

1. **The same answer with or without CUDA**: the prediction of each family's small config (bf16
   and fp32, for the H200) made on the GPU machine equals the one a CPU-only machine made
   (docs/data/coverage-gpu-expected.json): no branch of the trace depends on CUDA being there
   (transformers' mask creation, an OPT-style decoder's `.item()`).
2. **SDPA's own choice**: for the attention calls the families make that the calibration did not
   query (a learnable bias that needs its gradient, one whose last dimension is strided, a value
   head size other than the query's),
   `torch._fused_sdp_choice` on this GPU next to the kernel the trace takes.
3. **Predicted next to measured**: each family trained for three steps on the GPU by the worker's
   own training code (the Trainer, the dummy data, the component probe), in this process; the
   allocator's peak and the activations predicted next to what the probe read.

Everything goes to DIR/coverage-gpu.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.architectures import COMPARED, H200, architectures, working_config  # noqa: E402

EXPECTED = ROOT / "docs" / "data" / "coverage-gpu-expected.json"
# One small model of each family the prediction once failed on (issue 19).
FAMILIES = ("mixtral", "qwen3_moe", "deberta-v2", "opt", "bart", "t5", "whisper", "swin", "beit",
            "resnet", "phi3", "llama")
PRECISIONS = ("bf16", "fp32")
BATCH, SEQ_LEN, STEPS = 2, 64, 3


def _options(path: Path, precision: str):
    from anatomy.analysis.options import RunOptions

    return RunOptions(model=str(path), batch_size=BATCH, seq_len=SEQ_LEN, precision=precision,
                      dataset_size=BATCH * STEPS, max_steps=STEPS)


def _configs(directory: Path) -> dict[str, Path]:
    heads = dict(architectures())
    return {t: working_config(t, heads[t], directory)[0] for t in FAMILIES}


def predictions(configs: dict[str, Path], gpu_name: str) -> dict[str, dict]:
    from anatomy.prediction import PredictionError, predict

    out = {}
    for model_type, path in configs.items():
        for precision in PRECISIONS:
            key = f"{model_type} {precision}"
            try:
                p = predict(_options(path, precision), device="cuda", gpu_name=gpu_name)
                out[key] = {"peak": p.peak, "peak_reserved": p.peak_reserved,
                            "activations": p.activations,
                            "kernels": sorted(set(p.attention_kernels))}
            except PredictionError as error:
                out[key] = {"refused": str(error)}
    return out


def sdpa_choices() -> list[dict]:
    """torch's choice next to the trace's for the signatures the calibration lacks."""
    import torch
    from torch.nn.attention import SDPBackend

    from anatomy.prediction import device_constants
    from anatomy.prediction.device_constants import mask_kind, sdpa_signature

    calibration = device_constants.load(torch.cuda.get_device_name(0))
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for head_dim, value_dim in ((16, 16), (64, 64), (24, 16), (192, 128)):
            for mask in ("gradmask", "oddmask", "mask", "strided"):
                q = torch.randn(2, 128, 4, head_dim, device="cuda", dtype=dtype
                                ).transpose(1, 2).requires_grad_()
                k = torch.randn(2, 128, 4, head_dim, device="cuda", dtype=dtype
                                ).transpose(1, 2).requires_grad_()
                v = torch.randn(2, 128, 4, value_dim, device="cuda", dtype=dtype
                                ).transpose(1, 2).requires_grad_()
                # a 3-D bias (heads, L, S) broadcasts over the batch; cuDNN takes 2-D or 4-D only
                shape = (4, 128, 128) if mask == "oddmask" else (2, 4, 128, 128)
                bias = torch.zeros(shape, device="cuda", dtype=dtype,
                                   requires_grad=mask in ("gradmask", "strided"))
                if mask == "strided":  # T5's position bias as transformers 5.17 hands it over
                    bias = bias.transpose(-1, -2)
                try:
                    chosen = names.get(SDPBackend(torch._fused_sdp_choice(q, k, v, bias, 0.0,
                                                                           False)), "math")
                except (RuntimeError, ValueError) as error:
                    chosen = f"error: {str(error).splitlines()[0][:80]}"
                signature = sdpa_signature(str(dtype).removeprefix("torch."), head_dim, False,
                                           mask_kind(bias, q, k), False, False, True, value_dim)
                rows.append({"signature": signature, "torch": chosen,
                             "trace": calibration.sdpa_backend(signature)})
    return rows


def measured(configs: dict[str, Path]) -> dict[str, dict]:
    """Three steps of each on GPU 0 by the worker's own training code; the probe's readings."""
    import torch

    from anatomy.engine import protocol, worker
    from anatomy.store import Components

    out = {}
    for model_type, path in configs.items():
        for precision in PRECISIONS:
            options = _options(path, precision)

            class Queue(list):
                put = list.append

            queue = Queue()
            started = time.monotonic()
            code = worker.train(queue, options, time.monotonic(), True, 0.0)
            failure = next((m for m in queue if isinstance(m, protocol.Failure)), None)
            values = next((m.components for m in queue
                           if isinstance(m, protocol.ComponentsMeasured)), Components())
            out[f"{model_type} {precision}"] = (
                {"failed": (failure.text.strip().splitlines() or [""])[-1] if failure else code}
                if code or failure else
                {"peak": values.get("peak_allocated"), "peak_reserved": values.get(
                    "peak_reserved"), **{k: values.get(k) for k in COMPARED},
                 "seconds": round(time.monotonic() - started, 1)})
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect", action="store_true",
                        help="write the predictions of this (CPU-only) machine as the expected")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    directory = Path(tempfile.mkdtemp(prefix="anatomy-coverage-gpu-"))
    configs = _configs(directory)
    if args.expect:
        EXPECTED.parent.mkdir(parents=True, exist_ok=True)
        EXPECTED.write_text(json.dumps(predictions(configs, H200), indent=1, sort_keys=True)
                            + "\n")
        print(f"wrote {EXPECTED}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (--expect is the CPU-only half)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0)
    here = predictions(configs, H200)
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.is_file() else {}
    same = {key: here[key] == expected.get(key) for key in here}
    print(f"1. the same prediction with CUDA as without: {sum(same.values())} of {len(same)}")
    for key in (k for k, ok in same.items() if not ok):
        print(f"   differs: {key}: here {here[key]}, CPU-only {expected.get(key)}")
    choices = sdpa_choices()
    print(f"2. SDPA's choice on {gpu} = the trace's: "
          f"{sum(r['torch'] == r['trace'] for r in choices)} of {len(choices)}")
    for row in choices:
        mark = "" if row["torch"] == row["trace"] else "   <- differs"
        print(f"   {row['signature']:50} torch {row['torch']:10} trace {row['trace']}{mark}")
    runs = measured(configs)
    print(f"3. predicted next to measured on {gpu} (MiB; batch {BATCH}, sequence {SEQ_LEN}):")
    print(f"   {'model':24} {'peak pred':>10} {'peak meas':>10} {'err %':>7} "
          f"{'act pred':>9} {'act meas':>9}")
    for key, run in runs.items():
        predicted = here.get(key, {})
        if "peak" not in run or "peak" not in predicted:
            print(f"   {key:24} {run.get('failed') or predicted.get('refused')}")
            continue
        error = (predicted["peak"] - run["peak"]) / run["peak"] * 100 if run["peak"] else 0
        print(f"   {key:24} {predicted['peak'] / 2**20:10.2f} {run['peak'] / 2**20:10.2f} "
              f"{error:+7.2f} {predicted['activations'] / 2**20:9.2f} "
              f"{run['activations'] / 2**20:9.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coverage-gpu.json").write_text(json.dumps(
        {"gpu": gpu, "torch": torch.__version__, "same_without_cuda": same, "predicted": here,
         "sdpa": choices, "measured": runs}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
