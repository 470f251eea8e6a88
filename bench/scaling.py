"""One host, several GPUs (issues 12, 21): per model, 1 GPU, 2 × DDP and 2 × FSDP at one
per-device batch size, FSDP also in fp32 and with gradient checkpointing (and 2 × ZeRO-2 / ZeRO-3
where anatomy offers them), measured through the real CLI (`anatomy run --gpus 0,1 --strategy …`)
into a store, each beside its prediction per rank.

    python bench/scaling.py --out /tmp/scaling            # the full set
    python bench/scaling.py --out /tmp/scaling --quick    # 10 steps a run: <= 7 min, 2 H200s
    python bench/scaling.py --report /tmp/scaling/scaling.json               # the tables again

The predictions (each an FSDP rank's own traced step: tens of seconds of CPU for a 1 B model)
are made in processes of their own while the GPUs run, so they cost the set no time.

Per run and per GPU: the memory NVML shows at the end of the kernel, weights and training phases
and at the peak, the allocator's peak (the probe's, per rank), the predicted allocator peak and
NVML peak per rank (NVML: only where NCCL's own memory is calibrated), the global samples/s and
the scaling efficiency = N-GPU samples/s ÷ (N × 1-GPU samples/s). Writes DIR/scaling.json and
DIR/scaling.md (the table of docs/SCALING.md); the runs stay in DIR/scaling.sqlite (open it with
`ANATOMY_STORE=DIR/scaling.sqlite make run`: Live, Compare and Anatomy show them).

NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: NO_MULTICAST is set for every run
whatever the caller's environment says (the GPU machine's notes: a program that uses it can put
the host's GPUs out of service).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anatomy import prediction  # noqa: E402
from anatomy.analysis.compare import scaling_efficiency  # noqa: E402
from anatomy.analysis.options import RunOptions  # noqa: E402
from anatomy.analysis.report import report  # noqa: E402
from anatomy.store import Store  # noqa: E402

MIB = 2**20
MODELS = ("bert-large-uncased", "tinyllama-1.1b")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
# (label, strategy, processes, precision, gradient checkpointing); None: the run's --precision.
# In the order they matter (a set cut short by its time keeps the first): FSDP in bf16 and fp32
# beside one GPU, then DDP, checkpointing and ZeRO.
SETUPS = (("1 GPU", None, 1, None, False), ("2 x FSDP", "fsdp", 2, None, False),
          ("2 x FSDP", "fsdp", 2, "fp32", False), ("2 x DDP", "ddp", 2, None, False),
          ("2 x FSDP", "fsdp", 2, None, True),
          ("2 x ZeRO-2", "zero2", 2, None, False), ("2 x ZeRO-3", "zero3", 2, None, False))


def setups() -> list[tuple]:
    """The setups whose strategy this anatomy offers (ZeRO only where the options know it)."""
    from anatomy.analysis.options import FIELDS

    offered = set(FIELDS["strategy"].choices or ())
    return [s for s in SETUPS if s[1] is None or s[1] in offered]


def _mb(value) -> float | None:
    return None if value is None else round(value / MIB, 1)


def _options(model: str, strategy: str | None, world: int, precision: str, checkpointing: bool,
             args) -> RunOptions:
    extra = {} if strategy is None else {"gpus": ",".join(str(g) for g in range(world)),
                                        "strategy": strategy}
    return RunOptions(model=model, batch_size=args.batch_size, seq_len=args.seq_len,
                      precision=precision, gradient_checkpointing=checkpointing,
                      max_steps=args.steps, dataset_size=args.batch_size * world * args.steps,
                      **extra)


def _cli_args(options: RunOptions, store: Path) -> list[str]:
    out = ["--model", options.model, "--batch-size", str(options.batch_size), "--seq-len",
           str(options.seq_len), "--precision", options.precision, "--max-steps",
           str(options.max_steps), "--dataset-size", str(options.dataset_size),
           "--store", str(store)]
    if options.gradient_checkpointing:
        out += ["--gradient-checkpointing"]
    if options.distributed:
        out += ["--gpus", options.gpus, "--strategy", options.strategy]
    return out


def _predicted(options: RunOptions, gpu_name: str | None) -> dict:
    """The run's prediction per rank (in a process of its own: a failure is said, not raised)."""
    started = time.monotonic()
    try:
        alone = prediction.predict(options, device="cuda", gpu_name=gpu_name)
        out = {"allocator_peak": alone.peak, "nvml_peak": alone.nvml_peak,
               "components": alone.components()}
        if options.distributed:
            ranks = prediction.predict_ranks(options, device="cuda", gpu_name=gpu_name)
            out = {"allocator_peak": ranks.peak, "nvml_peak": ranks.nvml_peak,
                   "components": ranks.components(), "nccl_calibrated": ranks.nccl is not None}
    except Exception as error:  # noqa: BLE001 - a prediction that fails is said
        out = {"error": f"{type(error).__name__}: {error}"}
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def _measured(store: Store, run_id: int) -> dict:
    rep = report(store, run_id)
    gpus = []
    readings = rep.ranks or ()
    if not readings:  # one process: the run's own phases on its GPU
        parts = rep.components
        gpus.append({"gpu": rep.gpu, "rank": 0,
                     **{f"{p.name}_mb": p.memory_mb for p in rep.phases},
                     "nvml_peak_mb": rep.summary.peak_mb,
                     "allocator_peak_mb": _mb(parts.peak_allocated if parts else None)})
    for r in readings:
        parts = r.components
        gpus.append({"gpu": r.gpu, "rank": r.rank,
                     **{f"{p.name}_mb": p.memory_mb for p in r.phases},
                     "nvml_peak_mb": r.peak_mb,
                     "allocator_peak_mb": _mb(parts.peak_allocated if parts else None),
                     # the probe's reading of the rank's weights: its shard under FSDP/ZeRO-3
                     "weights_probe_mb": _mb(parts.weights if parts else None)})
    return {"run": run_id, "status": rep.status, "error": rep.error,
            "samples_per_second": rep.summary.samples_per_second,
            "steady_samples_per_second": rep.summary.steady_samples_per_second, "gpus": gpus,
            "device": rep.device_name, "environment": {
                "torch": rep.environment.torch, "transformers": rep.environment.transformers,
                "driver": rep.environment.driver}}


def plan(args) -> list[tuple[str, RunOptions, str]]:
    """(model, options, setup label) of every run, in order."""
    out = []
    for model in args.models.split(","):
        for label, strategy, world, precision, checkpointing in setups():
            options = _options(model, strategy, world, precision or args.precision,
                               checkpointing, args)
            out.append((model, options, label))
    return out


def run_all(args) -> list[dict]:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store_path = Path(args.store or out_dir / "scaling.sqlite")
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    os.environ.update(NO_MULTICAST)  # and the prediction's processes
    runs = plan(args)
    results = []
    workers = max(1, min(len(runs), (os.cpu_count() or 2) // 4))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        predicted = [pool.submit(_predicted, options, args.gpu_model) for _, options, _ in runs]
        for (model, options, label), prediction_done in zip(runs, predicted):
            started = time.monotonic()
            entry = {"model": model, "setup": label, "world_size": options.world_size,
                     "strategy": options.strategy if options.distributed else "-",
                     "batch_size": args.batch_size, "precision": options.precision,
                     "checkpointing": options.gradient_checkpointing, "steps": args.steps}
            before = {r.id for r in Store(store_path).runs()}
            try:
                done = subprocess.run([sys.executable, "-m", "anatomy", "run",
                                       *_cli_args(options, store_path)], env=env, cwd=ROOT,
                                      capture_output=True, text=True, timeout=args.run_timeout)
                entry["exit_code"] = done.returncode
                entry["output_tail"] = (done.stdout + done.stderr)[-1500:]
            except subprocess.TimeoutExpired as error:
                entry["exit_code"] = None
                entry["output_tail"] = f"timed out after {error.timeout} s"
            store = Store(store_path)
            new = sorted({r.id for r in store.runs()} - before)
            if new:
                entry["measured"] = _measured(store, new[-1])
            entry["wall_s"] = round(time.monotonic() - started, 1)
            entry["predicted"] = prediction_done.result()
            results.append(entry)
            print(f"{model} {label} {_variant(entry)}: exit {entry['exit_code']}, "
                  f"{entry['wall_s']} s", flush=True)
            _write(results, out_dir)
    return results


def _variant(entry: dict) -> str:
    return entry.get("precision", "?") + (" + ckpt" if entry.get("checkpointing") else "")


def _efficiency(results: list[dict]) -> None:
    """Scaling efficiency of each N-GPU entry against its model's 1-GPU entry."""
    for entry in results:
        single = next((e for e in results if e["model"] == entry["model"]
                       and e["world_size"] == 1 and _variant(e) == _variant(entry)
                       and e.get("measured")), None)
        # The steady rates (after the first steps): in a short run the first step's one-time
        # costs would decide the Trainer's figure (report.steady_rate).
        key = "steady_samples_per_second"
        rate = (entry.get("measured") or {}).get(key)
        one = (single or {}).get("measured", {}).get(key)
        entry["scaling_efficiency"] = scaling_efficiency(rate, one, entry["world_size"])


def _error(measured_mb, predicted_bytes) -> str:
    if measured_mb is None or predicted_bytes is None or not measured_mb:
        return "-"
    return f"{(predicted_bytes / MIB - measured_mb) / measured_mb:+.1%}"


def markdown(results: list[dict]) -> str:
    _efficiency(results)
    lines = ["| model | setup | precision / ckpt | GPU (rank) | weights MB (probe) | training MB |"
             " NVML peak MB | predicted NVML MB | error | allocator peak MB |"
             " predicted allocator MB | error | samples/s (steady) | scaling eff. |",
             "|" + "---|" * 14]
    for e in results:
        measured, predicted = e.get("measured") or {}, e.get("predicted") or {}
        gpus = measured.get("gpus") or [{}]
        for i, g in enumerate(gpus):
            first = i == 0
            eff = e.get("scaling_efficiency")
            nvml = predicted.get("nvml_peak")
            allocator = predicted.get("allocator_peak")
            lines.append(
                f"| {e['model'] if first else ''} | {e['setup'] if first else ''} | "
                f"{_variant(e) if first else ''} | "
                f"{g.get('gpu', '-')} ({g.get('rank', '-')}) | {g.get('weights_probe_mb', '-')} | "
                f"{g.get('training_mb', '-')} | {g.get('nvml_peak_mb', '-')} | "
                f"{_mb(nvml) or 'not calibrated'} | {_error(g.get('nvml_peak_mb'), nvml)} | "
                f"{g.get('allocator_peak_mb', '-')} | {_mb(allocator)} | "
                f"{_error(g.get('allocator_peak_mb'), allocator)} | "
                f"{_rate(measured) if first else ''} | "
                f"{(f'{eff:.0%}' if eff is not None else '-') if first else ''} |")
        if measured.get("status") not in (None, "completed"):
            lines.append(f"| | | | {measured['status']}: {str(measured.get('error'))[:120]} |"
                         + " |" * 10)
        if "error" in predicted:
            lines.append(f"| | | | prediction: {predicted['error'][:120]} |" + " |" * 10)
    return "\n".join(lines) + "\n"


def _rate(measured: dict) -> str:
    steady = measured.get("steady_samples_per_second")
    return "-" if steady is None else f"{steady:.1f}"


def _write(results: list[dict], out_dir: Path) -> None:
    text = markdown(results)
    (out_dir / "scaling.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out_dir / "scaling.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/anatomy-scaling"))
    parser.add_argument("--store", help="the store the runs go to (default OUT/scaling.sqlite)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--precision", default="bf16", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--gpu-model", help="the calibration to predict with (default: GPU 0's)")
    parser.add_argument("--quick", action="store_true",
                        help="10 steps a run: the set in <= 7 min on two H200s")
    parser.add_argument("--run-timeout", type=int, help="seconds a run may take (600; --quick 150)")
    parser.add_argument("--report", metavar="JSON", help="print the table of a finished set")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())), end="")
        return 0
    if args.quick:
        args.steps = 10
    if args.run_timeout is None:
        args.run_timeout = 150 if args.quick else 600
    if args.gpu_model is None:
        from anatomy.engine.devices import machine

        info = machine()
        if info.gpu_count < 2:
            print(f"error: needs two GPUs; this machine has {info.gpu_count}", file=sys.stderr)
            return 2
        args.gpu_model = info.devices[0].name
    results = run_all(args)
    _efficiency(results)
    _write(results, Path(args.out))
    print(markdown(results), end="")
    return 0 if all(e.get("exit_code") == 0 for e in results) else 1


if __name__ == "__main__":
    sys.exit(main())
