"""The prediction against a GPU, in parts, each configuration predicted on the CPU first, then
run in a fresh process (its own CUDA context, as a user's run): the device's constants, a grid
of models the prediction never saw (allocator and NVML peaks), the largest batch size predicted
then confirmed at the capacity's edge, and the walkthrough's four figures next to its own script.

    python bench/prediction_grid.py --parts calibrate,grid,walkthrough --out DIR --budget-s 530
    python bench/prediction_grid.py --parts edge,fits --out DIR --budget-s 530
    python bench/prediction_grid.py --parts ... --resume OLD.jsonl   # skip what OLD recorded
    python bench/prediction_grid.py --parts grid --configs "LABEL" ... --out DIR  # chosen rows
    python bench/prediction_grid.py --parts edge                     # CPU only: refit the edge
    python bench/prediction_grid.py --report DIR/prediction-grid.jsonl   # the tables again
    python bench/prediction_grid.py --dry-run [--parts ...]          # the plan and its time
    python bench/prediction_grid.py --device cpu --quick --out DIR   # every part on tiny models

Parts:
- calibrate: the device's facts (context, what CUDA lets a process allocate, cuBLAS's
  workspaces, the attention kernel per signature and its backward scratch) and the calibration
  set's runs (NVML beyond the context and the allocator's reserve): the constants, written to
  anatomy/prediction/calibration/<gpu>.json and DIR/<gpu>.json;
- grid: GRID's configurations (models of bench/models/, their published configurations),
  predicted, then run STEPS steps: components, allocator peak and reserve, NVML peak;
- edge: the edge margin fitted on the runs at the capacity's edge of FITTING_SET
  (docs/data/prediction-grid.jsonl: the previous session's largest batch sizes, other models
  than FITS'), recomputed with the prediction as it is now (CPU only, written to the
  calibration file);
- fits: FITS' largest batch sizes predicted (`max_batch_size`), then run at that size and the
  next (the one after when the next fits too; the one before when it does not fit), each run
  recording the allocator's state and CUDA's free memory at its end or at its out-of-memory;
- walkthrough: `python -m anatomy run` (the walkthrough's run) and bench/walkthrough_script.py
  (its own procedure, nothing of anatomy), their baseline, kernel, weights and training figures.

Results are appended to DIR/prediction-grid.jsonl as they come and DIR/prediction-grid.md is
rewritten after each, so a session cut short still gives its tables. `--budget-s` starts nothing
that would end after it. The predictions run in a pool of CPU processes that never touch CUDA.
The calibration set, the edge's fitting set and the grids share no configuration (asserted).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

from anatomy.analysis import models  # noqa: E402
from anatomy.analysis.components import MEASURED_STEPS  # noqa: E402
from anatomy.analysis.options import RunOptions  # noqa: E402
from anatomy.prediction import device_constants  # noqa: E402
from anatomy.prediction.device_constants import DeviceCalibration  # noqa: E402

MIB = 2**20
STEPS = MEASURED_STEPS  # the probe's steps: the prediction replays the same ones
MODELS = "bench/models"
FITTING_SET = ROOT / "docs" / "data" / "prediction-grid.jsonl"
RUN_TIMEOUT_S = 240  # one fresh process: build, STEPS steps at the largest batch, exit


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
                          grad_accum=self.grad_accum, max_steps=STEPS,
                          dataset_size=max(64, self.batch_size * self.grad_accum * STEPS))

    def run_options(self) -> dict:
        """The options as the fresh process rebuilds them (RunOptions' fields)."""
        return asdict(self.options())

    @property
    def label(self) -> str:
        words = [models.display_name(self.model), self.precision, f"b{self.batch_size}"]
        if not _is_image(self.model):
            words.append(f"s{self.seq_len}")
        words.append(self.optim)
        if self.checkpointing:
            words.append("ckpt")
        if self.lora_rank:
            words.append(f"lora{self.lora_rank}")
        if self.grad_accum > 1:
            words.append(f"accum{self.grad_accum}")
        return " ".join(words)

    @classmethod
    def from_label(cls, label: str) -> Config:
        """'deit-base bf16 b64 adamw_torch', 'smollm2-360m fp32 b2 s1024 adafactor ckpt lora16
        accum2': a configuration as `label` writes it, its model one of bench/models/."""
        words = label.split()
        values: dict = {"model": bench_model(words[0]), "precision": words[1]}
        for word in words[2:]:
            if word == "ckpt":
                values["checkpointing"] = True
            elif word.startswith("lora"):
                values["lora_rank"] = int(word[4:])
            elif word.startswith("accum"):
                values["grad_accum"] = int(word[5:])
            elif word[0] in "bs" and word[1:].isdigit():
                values["batch_size" if word[0] == "b" else "seq_len"] = int(word[1:])
            else:
                values["optim"] = word
        return cls(**values)

    @property
    def family(self) -> str:
        """The configuration without its batch size: what a largest-batch check is about."""
        return self.label.replace(f" b{self.batch_size}", "")


def _is_image(model: str) -> bool:
    try:
        return models.resolve(model).task == models.IMAGE_CLASSIFICATION
    except models.ModelError:  # a config this version refuses: its architecture still says
        path = ROOT / model
        return path.is_file() and \
            models.task_of(json.loads(path.read_text())) == models.IMAGE_CLASSIFICATION


def bench_model(name: str) -> str:
    return f"{MODELS}/{name}.json"


# The calibration set: what the device constants are fitted on (NVML's memory outside PyTorch;
# the rest are read from the device itself). No configuration of the grids is among them.
CALIBRATION = (
    Config("bert-large-uncased", "fp32", batch_size=4, seq_len=512),
    Config("gpt2", "bf16", True, batch_size=12, seq_len=512, optim="adagrad"),
    Config("qwen2-0.5b", "fp16", False, 16, batch_size=3, seq_len=384, optim="sgd"),
    Config("vit-base-patch16-224", "bf16", batch_size=48, optim="rmsprop"),
)

DECODERS = ("llama-3.2-1b", "qwen2.5-1.5b", "smollm2-360m", "falcon-rw-1b", "bloom-560m",
            "qwen3-moe-shaped")
ENCODERS = ("electra-large", "modernbert-base")
VISION = ("deit-base", "efficientnet-b0", "regnet-y-040")
SEQ2SEQ = ("flan-t5-small", "opus-mt-en-de")
# Per family, rows that between them vary precision, checkpointing, LoRA or full fine-tuning,
# shape, optimizer and accumulation: (precision, checkpointing, LoRA rank, batch size, sequence
# length, optimizer, accumulation).
ROWS = {
    DECODERS: (("bf16", False, 0, 4, 512, "adamw_torch", 1),
               ("fp32", True, 0, 2, 1024, "adafactor", 1),
               ("bf16", False, 16, 8, 512, "adamw_torch", 2)),
    ENCODERS: (("bf16", False, 0, 16, 512, "adamw_torch", 1),
               ("fp32", False, 0, 8, 512, "adamw_torch_fused", 1),
               ("fp16", True, 0, 16, 256, "sgd", 1)),
    VISION: (("bf16", False, 0, 64, 0, "adamw_torch", 1),
             ("fp32", False, 0, 32, 0, "rmsprop", 1),
             ("bf16", False, 0, 64, 0, "adagrad", 2)),
    SEQ2SEQ: (("bf16", False, 0, 16, 256, "adamw_torch", 1),
              ("fp32", False, 0, 8, 512, "adafactor", 1)),
}
LARGE = (Config(bench_model("llama-2-7b"), "bf16", True, 16, batch_size=4, seq_len=1024),
         Config(bench_model("mistral-7b"), "bf16", False, 16, batch_size=2, seq_len=1024))

# The largest batch size, predicted then confirmed: models none of whose runs the edge was
# fitted on, decoders at 1,024 tokens, encoders and sequence-to-sequence at 512 or 256.
FITS = tuple(Config(bench_model(name), precision, ckpt, lora, 1, seq or 512, optim) for
             name, precision, ckpt, lora, seq, optim in (
                 ("smollm2-360m", "bf16", False, 0, 1024, "adamw_torch"),
                 ("smollm2-360m", "fp32", False, 0, 1024, "adamw_torch"),
                 ("llama-3.2-1b", "bf16", False, 0, 1024, "adamw_torch"),
                 ("llama-3.2-1b", "bf16", False, 16, 1024, "adamw_torch"),
                 ("qwen2.5-1.5b", "bf16", False, 0, 1024, "adamw_torch"),
                 ("qwen2.5-1.5b", "fp32", True, 0, 2048, "adafactor"),
                 ("falcon-rw-1b", "bf16", False, 0, 1024, "adamw_torch"),
                 ("falcon-rw-1b", "fp16", True, 0, 1024, "adamw_torch_fused"),
                 ("bloom-560m", "bf16", False, 0, 1024, "adamw_torch"),
                 ("bloom-560m", "fp32", False, 0, 512, "rmsprop"),
                 ("electra-large", "bf16", False, 0, 512, "adamw_torch"),
                 ("electra-large", "fp32", False, 0, 512, "adafactor"),
                 ("modernbert-base", "bf16", False, 0, 1024, "adamw_torch"),
                 ("modernbert-base", "fp32", False, 0, 512, "sgd"),
                 ("deit-base", "bf16", False, 0, 0, "adamw_torch"),
                 ("deit-base", "fp32", False, 0, 0, "adamw_torch"),
                 ("efficientnet-b0", "bf16", False, 0, 0, "adamw_torch"),
                 ("regnet-y-040", "fp32", False, 0, 0, "sgd"),
                 ("qwen3-moe-shaped", "bf16", False, 0, 1024, "adamw_torch"),
                 ("flan-t5-small", "bf16", False, 0, 512, "adamw_torch"),
                 ("opus-mt-en-de", "bf16", False, 0, 256, "adamw_torch"),
                 ("opus-mt-en-de", "fp32", False, 0, 512, "adafactor"),
                 ("llama-2-7b", "bf16", True, 16, 1024, "adamw_torch"),
                 ("mistral-7b", "bf16", False, 16, 1024, "adamw_torch"),
             ))

# --device cpu: every part on tiny models, to run the whole script where there is no GPU.
CPU_CALIBRATION = (Config("tiny", "fp32", batch_size=2, seq_len=32),)
CPU_GRID = (Config("tiny-gpt2", "fp32", batch_size=2, seq_len=32),
            Config("tiny-llama", "bf16", True, 4, batch_size=2, seq_len=32, optim="sgd"))
CPU_FITS = (Config("tiny-gpt2", "fp32", batch_size=1, seq_len=16),)


def grid(quick: bool = False) -> list[Config]:
    out = []
    for names, rows in ROWS.items():
        for name in names:
            for precision, ckpt, lora, batch, seq, optim, accum in rows[:2] if quick else rows:
                out.append(Config(bench_model(name), precision, ckpt, lora, batch, seq or 512,
                                  optim, accum))
    out += LARGE
    return out


def plan(device: str, quick: bool, labels: list[str] | None = None
         ) -> tuple[tuple[Config, ...], list[Config], tuple[Config, ...]]:
    """The calibration set, the grid (`labels`' configurations where given) and the
    largest-batch configurations for this device."""
    if device == "cpu":
        return CPU_CALIBRATION, list(CPU_GRID), CPU_FITS
    configs = [Config.from_label(label) for label in labels] if labels else grid(quick)
    fits = FITS[:12] if quick else FITS
    families = {c.family for c in CALIBRATION}
    assert not families & {c.family for c in configs} and not set(CALIBRATION) & set(configs)
    assert not {c.model for c in fits} & set(fitting_models()), "the edge was fitted on these"
    return CALIBRATION, configs, fits


def fitting_models() -> list[str]:
    return sorted({row["config"]["model"] for row in _rows(FITTING_SET)
                   if row.get("kind") == "batch"})


# --- the CPU side: predictions in processes that never see the GPU ---

def _no_cuda() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def predict_one(config: Config, gpu_name: str | None, device: str, total: int | None = None
                ) -> dict:
    """`total`: the GPU's memory, which bounds the allocator's reserve (None: the calibrated
    GPU's)."""
    from anatomy.prediction import PredictionError, predict

    started = time.monotonic()
    try:
        p = predict(config.options(), device=device, gpu_name=gpu_name,
                    total=total if device == "cuda" else None)
    except PredictionError as error:
        return {"refused": str(error), "seconds": round(time.monotonic() - started, 2)}
    return {**p.to_dict(), "peak_reserved": p.peak_reserved, "marks": p.marks,
            "weights_allocated": p.weights_allocated, "weights_reserved": p.weights_reserved,
            "seconds": round(time.monotonic() - started, 2)}


def predict_fit(config: Config, gpu_name: str | None, device: str, total: int) -> dict:
    """The largest batch size predicted to fit, and each size around it as the edge sees it
    (allocated peak, largest request): what a refit of the edge needs from this run."""
    from anatomy.prediction import BatchSizes, PredictionError, max_batch_size
    from anatomy.prediction.memory import calibration_for

    started = time.monotonic()
    options = config.options()
    try:
        fit = max_batch_size(options, device=device, total=total, gpu_name=gpu_name)
    except PredictionError as error:
        return {"refused": str(error), "seconds": round(time.monotonic() - started, 2)}
    sizes = BatchSizes(options, device, calibration_for(device, gpu_name))
    around = {b for b in (fit.batch_size, fit.may_fit) if b for b in (b - 1, b, b + 1, b + 2)
              if 1 <= b <= fit.limit}
    need = {str(b): _need(sizes.measure(b)) for b in sorted(around)}
    return {"batch_size": fit.batch_size, "may_fit": fit.may_fit, "capacity": fit.capacity,
            "peak": fit.peak_at_fit, "at_limit": fit.at_limit, "line": fit.line("the GPU"),
            "tried": list(fit.searched), "need": need,
            "seconds": round(time.monotonic() - started, 2)}


def edge_point(config: Config, batch: int, gpu_name: str | None, ceiling: int) -> dict:
    """A batch size of a run at the capacity's edge, as the prediction sees it now: its
    allocated peak, and the largest margin (a fraction of `ceiling`, the allocator's ceiling
    in that run) with which the simulated allocator still holds it (-1: not even without)."""
    from anatomy.prediction import BatchSizes
    from anatomy.prediction.memory import calibration_for

    sizes = BatchSizes(config.options(), "cuda", calibration_for("cuda", gpu_name))
    measured = sizes.measure(batch)

    def holds(margin: float) -> bool:
        return not sizes.out_of_memory(batch, ceiling - round(margin * ceiling))

    if not holds(0.0):
        return {**_need(measured), "holds_with": -1.0}
    low, high = 0.0, 0.05  # a margin of 5 % is beyond any this script has seen
    if holds(high):
        return {**_need(measured), "holds_with": high}
    for _ in range(12):  # to about 0.001 %
        middle = (low + high) / 2
        low, high = (middle, high) if holds(middle) else (low, middle)
    return {**_need(measured), "holds_with": round(low, 5)}


def _need(measured) -> dict:
    return {"peak": measured.peak_allocated, "largest": measured.largest_request}


# --- the GPU side: fresh processes, NVML sampled from here ---

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

    def close(self) -> None:
        self._stop.set()


def _child(conn, name: str, args: tuple) -> None:
    import gpu_child

    try:
        conn.send(getattr(gpu_child, name)(*args))
    except BaseException as error:  # noqa: BLE001 - the parent records what went wrong
        conn.send({"status": "failed", "error": f"{type(error).__name__}: {str(error)[:300]}"})
    finally:
        conn.close()


class Fresh:
    """Runs bench/gpu_child.py's functions each in a process of its own, forked from a server
    that imported torch and transformers but never touched CUDA: a fresh CUDA context each time,
    in a fraction of a second. NVML's peak over the process's life is added (`nvml_peak`, over
    the baseline)."""

    def __init__(self, sampler: NvmlPeak | None, baseline: int):
        self.sampler, self.baseline = sampler, baseline
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["torch", "transformers", "accelerate", "peft",
                                             "gpu_child"])

    def run(self, name: str, *args, timeout: float = RUN_TIMEOUT_S) -> dict:
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_child, args=(send, name, args), daemon=True)
        if self.sampler:
            self.sampler.reset()
        started = time.monotonic()
        process.start()
        send.close()
        result = None
        if receive.poll(timeout):
            try:
                result = receive.recv()
            except EOFError:
                result = None
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()
        if result is None:
            result = {"status": "timeout" if time.monotonic() - started >= timeout else
                      "crashed", "exit_code": process.exitcode}
        if self.sampler:
            time.sleep(0.05)
            result["nvml_peak"] = self.sampler.peak - self.baseline
        result.setdefault("wall_s", round(time.monotonic() - started, 2))
        return result


# --- the session ---

class Session:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.device = args.device
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "prediction-grid.jsonl"
        self.done: dict[tuple[str, str], dict] = {}
        for resumed in args.resume or ():
            for row in _rows(Path(resumed)):
                if row.get("kind") in ("grid", "fits", "calibration", "walkthrough"):
                    self.done[(row["kind"], row.get("label", ""))] = row
        self.path.write_text("")
        self.gpu = None
        self.sampler = None
        self.baseline = 0
        self.pool = None
        self.fresh = None
        self.spent: dict[str, list[float]] = {}

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)

    def left(self) -> float:
        budget = self.args.budget_s
        return float("inf") if budget is None else budget - (time.monotonic() - self.started)

    def affordable(self, kind: str, default: float) -> bool:
        spent = self.spent.get(kind, [])
        expected = statistics.mean(spent[-5:]) if spent else default
        return self.left() > expected

    def took(self, kind: str, seconds: float) -> None:
        self.spent.setdefault(kind, []).append(seconds)

    def record(self, row: dict) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")
        (self.out / "prediction-grid.md").write_text(report(_rows(self.path)))

    def resumed(self, kind: str, label: str) -> bool:
        """A row an earlier session recorded: copied here, not run again."""
        row = self.done.get((kind, label))
        if row is not None:
            self.record(row)
        return row is not None

    def start(self) -> None:
        if self.device == "cuda":
            from anatomy.engine.devices import machine

            info = machine()
            if not info.has_gpu:
                raise SystemExit("error: no GPU here (NVML sees none); run with --device cpu")
            self.gpu = info.devices[0]
            self.sampler = NvmlPeak(self.gpu.nvml_index)
            time.sleep(0.3)
            self.baseline = self.sampler.read()  # before any process of ours touches CUDA
        self.fresh = Fresh(self.sampler, self.baseline)
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.args.jobs, mp_context=multiprocessing.get_context("spawn"),
            initializer=_no_cuda)

    @property
    def gpu_name(self) -> str | None:
        return self.gpu.name if self.gpu else None

    @property
    def nvml_index(self) -> int | None:
        return self.gpu.nvml_index if self.gpu else None

    @property
    def total(self) -> int:
        return self.gpu.total if self.gpu else self.args.cpu_total_mib * MIB

    def header(self) -> None:
        import peft
        import torch
        import transformers

        constants = device_constants.load(self.gpu_name)
        self.record({"kind": "header", "gpu": self.gpu_name or "CPU", "device": self.device,
                     "torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "python": platform.python_version(),
                     "total": self.total, "baseline": self.baseline,
                     "calibration": constants.source,
                     "calibration_set": list(constants.calibration_set),
                     "edge_fitting_set": list(constants.edge_fitting_set),
                     "edge_margin": constants.edge_margin})

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown(cancel_futures=True)
        if self.sampler:
            self.sampler.close()


def run_config(session: Session, config: Config) -> dict:
    return session.fresh.run("train", config.run_options(), session.device,
                             session.nvml_index, session.baseline)


# --- the parts ---

def calibrate(session: Session) -> DeviceCalibration:
    import torch
    import transformers

    calibration, _, _ = plan(session.device, session.args.quick)
    if session.device == "cuda":
        facts = session.fresh.run("device_facts", session.nvml_index, session.baseline)
        attention = session.fresh.run("attention_facts")
        for result in (facts, attention):
            if result.get("status") in ("failed", "crashed", "timeout"):
                raise SystemExit(f"error: the device's facts: {result}")
            result.pop("nvml_peak", None)
            result.pop("wall_s", None)
        facts.update(sdpa_backends=attention["sdpa_backends"],
                     attention_backward_bytes_per_element=attention[
                         "attention_backward_bytes_per_element"])
    else:  # the CPU has none of these: DEFAULT's, so the rest of the part runs
        d = device_constants.DEFAULT
        facts = {"context_bytes": d.context_bytes, "usable_bytes": d.usable_bytes,
                 "workspace_forward_bytes": d.workspace_forward_bytes,
                 "workspace_backward_bytes": d.workspace_backward_bytes, "sdpa_backends": {},
                 "attention_backward_bytes_per_element": {}}
    session.log(f"context {facts['context_bytes'] / MIB:.0f} MiB, usable "
                f"{facts['usable_bytes'] / MIB:,.0f} MiB, cuBLAS workspaces "
                f"{facts['workspace_forward_bytes'] / MIB:.0f} + "
                f"{facts['workspace_backward_bytes'] / MIB:.0f} MiB, attention kernels "
                f"{sorted(set(facts['sdpa_backends'].values()))}, backward scratch "
                f"{facts['attention_backward_bytes_per_element']}")
    outside = []
    for config in calibration:
        result = run_config(session, config)
        session.record({"kind": "calibration", "label": config.label, "config": asdict(config),
                        **result})
        if result["status"] == "completed" and result.get("nvml_peak") is not None:
            m = result["measured"]
            outside.append(result["nvml_peak"] - facts["context_bytes"] - m["peak_reserved"])
            session.log(f"calibration {config.label}: NVML {result['nvml_peak'] / MIB:,.0f} MiB,"
                        f" outside PyTorch {outside[-1] / MIB:,.0f} MiB, ceiling "
                        f"{result['memory']['ceiling'] / MIB:,.0f} MiB ({result['wall_s']} s)")
        else:
            session.log(f"calibration {config.label}: {result['status']}")
    known = device_constants.load(session.gpu_name)
    constants = DeviceCalibration(
        device=session.gpu_name or "CPU", total_bytes=session.total, fitted=True,
        # the most NVML held outside PyTorch in the calibration set: the safe side of it
        outside_bytes=int(max(outside)) if outside else device_constants.DEFAULT.outside_bytes,
        calibration_set=tuple(c.label for c in calibration),
        source=(f"bench/prediction_grid.py --parts calibrate, {time.strftime('%Y-%m-%d')}, "
                f"torch {torch.__version__}, transformers {transformers.__version__}"),
        # what the edge was fitted on stays until the edge part fits it again
        edge_margin=known.edge_margin,
        edge_fitting_set=known.edge_fitting_set, nccl_bytes=known.nccl_bytes, **facts)
    save(session, constants)
    return constants


def save(session: Session, constants: DeviceCalibration) -> None:
    """Where the predictions of this session read it, and in DIR for the repository."""
    if session.device == "cuda":
        session.log(f"wrote {constants.save()} and {constants.save(session.out)}")
    else:
        session.log(f"calibration on the CPU: {constants.save(session.out)} only")


def run_grid(session: Session) -> None:
    _, configs, _ = plan(session.device, session.args.quick, session.args.configs)
    todo = [c for c in configs if not session.resumed("grid", c.label)]
    predictions = {c: session.pool.submit(predict_one, c, session.gpu_name, session.device,
                                          session.total)
                   for c in todo}
    for index, config in enumerate(todo, 1):
        if not session.affordable("grid", 8.0):
            session.log(f"budget reached: {len(todo) - index + 1} grid configurations not run")
            return
        predicted = predictions[config].result()  # predicted first, then run
        if "refused" in predicted:
            session.record({"kind": "grid", "label": config.label, "config": asdict(config),
                            "status": "refused", "predicted": predicted})
            session.log(f"[{index}/{len(todo)}] {config.label}: refused: {predicted['refused']}")
            continue
        result = run_config(session, config)
        session.took("grid", result["wall_s"])
        session.record({"kind": "grid", "label": config.label, "config": asdict(config),
                        "predicted": predicted, **result})
        if result["status"] == "completed":
            m = result["measured"]
            session.log(
                f"[{index}/{len(todo)}] {config.label}: peak predicted "
                f"{_mib(predicted['components']['peak'])} / measured "
                f"{_mib(m.get('peak_allocated'))} MiB "
                f"({_pct(_error(predicted['components']['peak'], m.get('peak_allocated')))}), NVML "
                f"{(predicted.get('nvml_peak') or 0) / MIB:,.0f} / "
                f"{(result.get('nvml_peak') or 0) / MIB:,.0f} MiB ({result['wall_s']} s, "
                f"predicted in {predicted['seconds']} s)")
        else:
            session.log(f"[{index}/{len(todo)}] {config.label}: {result['status']} "
                        f"{result.get('error', '')}")


def fit_edge(session: Session) -> None:
    """The edge margin from the runs at the capacity's edge of FITTING_SET, each replayed
    through the simulated allocator as the prediction sees it now: the smallest margin (plus
    0.05 % of the capacity) with which no run that ran out of memory would be taken to fit."""
    points = edge_runs(_rows(Path(session.args.fitting_set)))
    gpu_name = session.gpu_name or "NVIDIA H200"
    futures = [(p, session.pool.submit(edge_point, Config(**p["config"]), p["batch_size"],
                                       gpu_name, p["ceiling"])) for p in points]
    failed, fitted = [], []
    for point, future in futures:
        holds_with = future.result()["holds_with"]
        (fitted if point["status"] == "completed" else failed).append(holds_with)
        session.log(f"edge {Config(**point['config']).family} b{point['batch_size']}: "
                    f"{point['status']}; the simulated allocator holds it with a margin of "
                    + ("none" if holds_with < 0 else f"{holds_with:.3%}"))
    known = device_constants.load(gpu_name)
    margin = edge_margin(failed) if failed else known.edge_margin
    constants = replace(known, edge_margin=margin,
                        edge_fitting_set=tuple(sorted({Config(**p["config"]).family
                                                       for p in points})))
    wrong = sum(1 for h in fitted if h < constants.edge_margin)
    session.log(f"edge margin: {constants.edge_margin:.2%} of the capacity ({len(failed)} out of "
                f"memory, {len(fitted)} fitted, {wrong} of which it would take for too large)")
    session.record({"kind": "edge", "edge_margin": constants.edge_margin,
                    "points": len(points), "fitting_set": list(constants.edge_fitting_set)})
    if session.device == "cuda" or session.args.write_calibration:
        session.log(f"wrote {constants.save()}")
    constants.save(session.out)


def edge_margin(failed: list[float]) -> float:
    """The margin from the out-of-memory runs' `holds_with`: the smallest with which none is
    held (a run not held even at the capacity, -1, needs none), plus 0.05 % of the capacity."""
    return round(max(0.0, *failed) + 0.0005, 4)


def edge_runs(rows: list[dict]) -> list[dict]:
    """Every run of a largest-batch check in `rows`: its configuration, batch size, outcome and
    the allocator's ceiling then (measured, or for the first sessions' records that lack it:
    what CUDA lets a process have less the context and what lived outside PyTorch then)."""
    header = next((r for r in rows if r.get("kind") == "header"), {})
    usable = device_constants.load(header.get("gpu")).usable(
        header.get("total") or device_constants.DEFAULT.total_bytes)
    completed = [r for r in rows if r.get("kind") == "grid" and r.get("status") == "completed"]

    def reading(row: dict, name: str) -> int | None:  # the first session kept them in measured
        return row.get(name, row.get("measured", {}).get(name))

    context = max((reading(r, "context") or 0 for r in completed), default=0)
    outside = max((reading(r, "nvml_peak") - reading(r, "context")
                   - r["measured"]["peak_reserved"] for r in completed
                   if reading(r, "nvml_peak") and reading(r, "context")), default=0)
    points = []
    for row in rows:
        if row.get("kind") == "batch":  # the first session: statuses only
            for batch, status in row["runs"]:
                points.append({"config": row["config"], "batch_size": batch, "status": status,
                               "ceiling": usable - context - outside})
        elif row.get("kind") == "fits":
            for run in row["runs"]:
                if run.get("memory", {}).get("ceiling"):
                    points.append({"config": row["config"], "batch_size": run["batch_size"],
                                   "status": run["status"], "ceiling": run["memory"]["ceiling"]})
    return points


def run_fits(session: Session) -> None:
    _, _, fits = plan(session.device, session.args.quick)
    todo = [c for c in fits if not session.resumed("fits", c.family)]
    predictions = {c: session.pool.submit(predict_fit, c, session.gpu_name, session.device,
                                          session.total) for c in todo}
    for index, config in enumerate(todo, 1):
        if not session.affordable("fits", 30.0):
            session.log(f"budget reached: {len(todo) - index + 1} largest-batch checks not run")
            return
        started = time.monotonic()
        predicted = predictions[config].result()
        if "refused" in predicted:
            session.record({"kind": "fits", "label": config.family, "config": asdict(config),
                            "prediction": predicted, "runs": [], "verdict": "refused"})
            session.log(f"largest batch, {config.family}: refused: {predicted['refused']}")
            continue
        runs, verdict = confirm(session, config, predicted)
        session.took("fits", time.monotonic() - started)
        session.record({"kind": "fits", "label": config.family, "config": asdict(config),
                        "prediction": predicted, "runs": runs, "verdict": verdict})
        session.log(f"[{index}/{len(todo)}] largest batch, {config.family}: predicted "
                    f"{predicted['batch_size']} (may {predicted['may_fit']}); runs "
                    f"{[(r['batch_size'], r['status']) for r in runs]}: {verdict}")


def confirm(session: Session, config: Config, predicted: dict) -> tuple[list[dict], str]:
    """Runs at the predicted size and around it, in fresh processes: equal (it fits, the next
    does not), one below, below, above (it does not fit; the size before is run too), or at the
    option's limit (it fits)."""
    size = predicted["batch_size"]
    runs: list[dict] = []

    def run(batch: int) -> str:
        result = run_config(session, replace(config, batch_size=batch))
        need = predicted["need"].get(str(batch))
        runs.append({"batch_size": batch, "need": need, **result})
        return result["status"]

    if size is None:
        return runs, "above" if run(1) == "completed" else "equal"
    if run(size) != "completed":
        if size > 1:
            run(size - 1)
        return runs, "above"
    if predicted["at_limit"]:
        return runs, "limit"
    if run(size + 1) != "completed":
        return runs, "equal"
    return runs, "one below" if run(size + 2) != "completed" else "below"


def walkthrough(session: Session) -> None:
    """The walkthrough's run as anatomy records it, and its own procedure in a plain script."""
    if session.resumed("walkthrough", "walkthrough"):
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    store = session.out / "walkthrough.sqlite"
    cpu = session.device == "cpu"
    run = [sys.executable, "-m", "anatomy", "run", "--store", str(store)]
    run += ["--preset", "tiny", "--max-steps", "3"] if cpu else []
    started = time.monotonic()
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    session.log(f"anatomy run: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    shown = subprocess.run([sys.executable, "-m", "anatomy", "show", "1", "--json", "--store",
                            str(store)], cwd=ROOT, env=env, capture_output=True, text=True)
    phases = {}
    if shown.returncode == 0:
        phases = {p["name"]: p["memory_bytes"] for p in json.loads(shown.stdout)["phases"]}
    script = [sys.executable, str(HERE / "walkthrough_script.py")]
    script += ["--config", str(ROOT / "anatomy/analysis/configs/tiny.json"), "--max-steps", "3",
               "--device", "cpu"] if cpu else []
    started = time.monotonic()
    own = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=400)
    session.log(f"the walkthrough's script: exit {own.returncode} in "
                f"{time.monotonic() - started:.1f} s")
    figures = json.loads(own.stdout.strip().splitlines()[-1]) if own.returncode == 0 else {}
    session.record({"kind": "walkthrough", "label": "walkthrough", "anatomy": phases,
                    "anatomy_exit": done.returncode, "anatomy_output": done.stdout[-3000:],
                    "anatomy_error": done.stderr[-2000:], "script": figures,
                    "script_exit": own.returncode, "script_error": own.stderr[-2000:]})


# --- the tables ---

def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _error(predicted, measured) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured * 100


def _mib(value) -> str:
    return "" if value is None else f"{value / MIB:,.0f}"


def _pct(value) -> str:
    return "" if value is None else f"{value:+.2f}%"


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def report(rows: list[dict]) -> str:
    """The markdown for docs/PREDICTION.md from the recorded rows (a partial session included)."""
    header = next((r for r in rows if r.get("kind") == "header"), {})
    lines = [f"GPU: {header.get('gpu', '?')}; torch {header.get('torch', '?')}, transformers "
             f"{header.get('transformers', '?')}, peft {header.get('peft', '?')}; constants: "
             f"{header.get('calibration', '?')}; "
             + (f"edge margin {header['edge_margin']}." if "edge_margin" in header else
                f"fragmentation allowance {header.get('fragmentation_allowance', '?')} (least "
                f"{header.get('fragmentation_allowance_least', '?')})."), ""]
    lines += _grid_table([r for r in rows if r.get("kind") == "grid"])
    lines += _fits_table([r for r in rows if r.get("kind") == "fits"])
    lines += _walkthrough_table(next((r for r in rows if r.get("kind") == "walkthrough"), None))
    return "\n".join(lines) + "\n"


def _grid_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["| configuration | weights | gradients | states | activations | peak predicted / "
             "measured (MiB) | error | reserved pred. / meas. | NVML pred. / meas. (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors, nvml_ok, nvml_rows, under = [], 0, 0, []
    for row in rows:
        config, p, m = Config(**row["config"]), row.get("predicted", {}), row.get("measured")
        if row["status"] != "completed" or not m:
            why = p.get("refused") or row.get("error", "")
            lines.append(f"| {config.label} | | | | | {row['status']} {why[:80]} | | | |")
            continue
        c = p["components"]

        def cell(name: str, measured_value, c=c) -> str:
            exact = "=" if c[name] == measured_value else _mib(measured_value)
            return f"{_mib(c[name])} / {exact}"

        error = _error(c["peak"], m.get("peak_allocated"))  # None on the CPU: no allocator
        if error is not None:
            errors.append(error)
            if error < 0:
                under.append((error, config.label))
        nvml = row.get("nvml_peak")
        nvml_error = None if nvml is None or p.get("nvml_peak") is None else p["nvml_peak"] - nvml
        if nvml_error is not None:
            nvml_rows += 1
            nvml_ok += abs(nvml_error) <= max(0.03 * nvml, 300 * MIB)
        lines.append(
            f"| {config.label} | {cell('weights', m.get('weights'))} | "
            f"{cell('gradients', m.get('gradients'))} | "
            f"{cell('optimizer_states', m.get('optimizer_states'))} | "
            f"{_mib(c['activations'])} / {_mib(m.get('activations'))} | "
            f"{_mib(c['peak'])} / {_mib(m.get('peak_allocated'))} | {_pct(error)} | "
            f"{_mib(p.get('peak_reserved'))} / {_mib(m.get('peak_reserved'))} | "
            f"{_mib(p.get('nvml_peak'))} / {_mib(nvml)}"
            + ("" if nvml_error is None else f" ({nvml_error / MIB:+,.0f})") + " |")
    if errors:
        absolute = sorted(abs(e) for e in errors)
        worst = min(under) if under else None
        lines += ["", f"{len(errors)} configurations completed of {len(rows)}. Allocator peak: "
                  f"median |error| {statistics.median(absolute):.2f}% (target ≤ 0.5%), 95th "
                  f"percentile {_percentile(absolute, 0.95):.2f}% (≤ 2%), largest "
                  f"{absolute[-1]:.2f}% (≤ 3%), above 3%: {sum(e > 3 for e in absolute)}; "
                  "worst under-prediction "
                  + (f"{worst[0]:+.2f}% ({worst[1]})" if worst else "none")
                  + f". NVML peak within 3% or 300 MiB: {nvml_ok} of {nvml_rows} (target ≥ 95%)."]
    return lines + [""]


def _fits_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["| configuration | predicted (may) | runs: status, allocator ceiling (MiB) | "
             "verdict |", "|---|---|---|---|"]
    verdicts = []
    for row in rows:
        p = row["prediction"]
        runs = "; ".join(
            f"{r['batch_size']}: {r['status']}"
            + (f", {_mib(r['memory']['ceiling'])}" if r.get("memory", {}).get("ceiling") else "")
            for r in row["runs"])
        size = p.get("batch_size")
        shown = p.get("refused", "")[:60] if "refused" in p else (
            f"{'≥ ' if p.get('at_limit') else ''}{size} ({p.get('may_fit')})")
        verdicts.append(row["verdict"])
        lines.append(f"| {row['label']} | {shown} | {runs} | {row['verdict']} |")
    judged = [v for v in verdicts if v not in ("refused", "not run")]
    good = sum(v in ("equal", "one below", "limit") for v in judged)
    unrun = sum(v == "not run" for v in verdicts)
    lines += ["", f"Predicted largest batch size equal to the largest that ran, or one below: "
              f"{good} of {len(judged)} (target ≥ 95%); above: "
              f"{sum(v == 'above' for v in judged)} (target 0); below by more than one: "
              f"{sum(v == 'below' for v in judged)}; refused: "
              f"{sum(v == 'refused' for v in verdicts)}"
              + (f"; predicted at a size no run settles: {unrun}" if unrun else "") + ".", ""]
    return lines


def _walkthrough_table(row: dict | None) -> list[str]:
    if not row:
        return []
    ours, script = row["anatomy"], row["script"]
    lines = ["| phase | anatomy run (MB) | the walkthrough's script (MB) | difference |",
             "|---|---|---|---|"]
    for phase in ("baseline", "kernel", "weights", "training"):
        a = ours.get(phase)
        s = (script.get(phase) or {}).get("used")
        base = (script.get("baseline") or {}).get("used", 0)
        s = None if s is None else s - base
        diff = "" if a is None or s is None else f"{(a - s) // MIB:+,} MB" + (
            f" ({(a - s) / s:+.2%})" if s else "")
        lines.append(f"| {phase} | {'' if a is None else f'{a // MIB:,}'} | "
                     f"{'' if s is None else f'{s // MIB:,}'} | {diff} |")
    return lines + [""]


# --- the plan ---

def estimate(parts: set[str], device: str, quick: bool, labels: list[str] | None = None
             ) -> float:
    """Seconds on an H200, roughly: a fresh process builds and runs STEPS steps in 4-8 s; a
    largest-batch check runs two or three near the memory's limit."""
    calibration, configs, fits = plan(device, quick, labels)
    seconds = 10.0
    seconds += (40 + 8 * len(calibration)) if "calibrate" in parts else 0
    seconds += 6.0 * len(configs) if "grid" in parts else 0
    seconds += 40 if "edge" in parts else 0
    seconds += 25.0 * len(fits) if "fits" in parts else 0
    seconds += 70 if "walkthrough" in parts else 0
    return seconds


PARTS = ("calibrate", "grid", "edge", "fits", "walkthrough")


def repredict(path: Path, out: Path, jobs: int, others: list[Path] = ()) -> int:
    """Every grid row of `path` with its prediction made again by the code as it is now, for
    the GPU that run was on, next to the same measurements: what a change to the prediction
    does to a grid already run, without the GPU. The earlier prediction is kept beside it.
    Its largest-batch rows likewise: predicted again, and judged by every run of that
    configuration that `path` and `others` recorded (a size none of them ran: "not run")."""
    rows = _rows(path)
    header = next((r for r in rows if r.get("kind") == "header"), {})
    gpu = header.get("gpu")
    grid_rows = [r for r in rows if r.get("kind") == "grid"]
    fit_rows = [r for r in rows if r.get("kind") == "fits" and "refused" not in r["prediction"]]
    outcomes: dict[str, dict[int, str]] = {}
    for row in rows + [r for other in others for r in _rows(other)]:
        if row.get("kind") == "fits":
            for run in row["runs"]:
                outcomes.setdefault(row["label"], {})[run["batch_size"]] = run["status"]
    out.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
            initializer=_no_cuda) as pool:
        futures = [pool.submit(predict_one, Config(**r["config"]), gpu, "cuda")
                   for r in grid_rows]
        fits = [pool.submit(predict_fit, Config(**r["config"]), gpu, "cuda", header["total"])
                for r in fit_rows]
        for row, future in zip(grid_rows, futures):
            row["predicted_before"] = row.get("predicted")
            row["predicted"] = future.result()
            before = (row["predicted_before"] or {}).get("components", {}).get("peak")
            now = row["predicted"].get("components", {}).get("peak")
            print(f"{row['label']}: peak predicted {_mib(before)} -> {_mib(now)} MiB, "
                  f"measured {_mib(row.get('measured', {}).get('peak_allocated'))}", flush=True)
        for row, future in zip(fit_rows, fits):
            row["prediction_before"], row["verdict_before"] = row["prediction"], row["verdict"]
            row["prediction"] = future.result()
            known = outcomes.get(row["label"], {})
            row["verdict"] = judge(row["prediction"], known)
            row["runs"] = [{"batch_size": b, "status": known[b]} for b in sorted(known)]
            print(f"largest batch, {row['label']}: predicted {row['prediction_before'].get('batch_size')}"
                  f" -> {row['prediction'].get('batch_size')}; {row['verdict_before']} -> "
                  f"{row['verdict']}", flush=True)
    target = out / "prediction-grid.jsonl"
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "prediction-grid.md").write_text(report(rows))
    print((out / "prediction-grid.md").read_text())
    return 0


def judge(predicted: dict, known: dict[int, str]) -> str:
    """A predicted largest batch size against the sizes that ran: above (a size at or below it
    did not run through), equal / one below / below (the largest that ran, L, is known: L
    completed and L + 1 did not), below (a size two or more above it completed), or not run."""
    if "refused" in predicted:
        return "refused"
    size = predicted.get("batch_size") or 0
    done = {b for b, status in known.items() if status == "completed"}
    if any(b <= size for b, status in known.items() if status != "completed"):
        return "above"
    largest = next((b for b in sorted(done, reverse=True) if known.get(b + 1) not in
                    (None, "completed")), None)
    if largest is not None:
        return {0: "equal", 1: "one below"}.get(largest - size, "below")
    if predicted.get("at_limit") and size in done:
        return "limit"
    return "below" if any(b >= size + 2 for b in done) else "not run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="calibrate,grid,walkthrough",
                        help=f"comma-separated, in this order: {','.join(PARTS)}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer configurations")
    parser.add_argument("--configs", nargs="+", metavar="LABEL",
                        help="grid: these configurations instead of GRID's, as the grid labels "
                             "them ('smollm2-360m fp32 b4 s512 sgd ckpt')")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start nothing that would end after this many seconds")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "docs" / "data"),
                        help="folder for prediction-grid.jsonl, .md and the calibration")
    parser.add_argument("--resume", nargs="*", metavar="JSONL",
                        help="rows of earlier sessions: what they recorded is not run again "
                             "(with --repredict: their runs judge the largest batch sizes too)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="CPU processes for the predictions")
    parser.add_argument("--cpu-total-mib", type=int, default=3072,
                        help="--device cpu: the memory the largest batch sizes are judged on")
    parser.add_argument("--fitting-set", default=str(FITTING_SET),
                        help="edge: the recorded runs at the capacity's edge it is fitted on")
    parser.add_argument("--write-calibration", action="store_true",
                        help="edge on the CPU: write the repository's calibration file too")
    parser.add_argument("--report", metavar="JSONL", help="only write the tables from a run")
    parser.add_argument("--repredict", metavar="JSONL",
                        help="the grid rows of a run, predicted again by this code (on this "
                             "machine's CPU) and held against what that run measured")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args(argv)
    if args.report:
        path = Path(args.report)
        (path.parent / "prediction-grid.md").write_text(report(_rows(path)))
        print((path.parent / "prediction-grid.md").read_text())
        return 0
    if args.repredict:
        return repredict(Path(args.repredict), Path(args.out), args.jobs,
                         [Path(p) for p in args.resume or ()])
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))} (known: {', '.join(PARTS)})")
    calibration, configs, fits = plan(args.device, args.quick, args.configs)
    print(f"plan: {', '.join(parts)} on {args.device}: calibration {len(calibration)} runs, "
          f"grid {len(configs)}, largest batch sizes {len(fits)}; about "
          f"{estimate(set(parts), args.device, args.quick, args.configs):.0f} s on an H200",
          flush=True)
    if args.dry_run:
        for config in (configs if "grid" in parts else []):
            print("   grid", config.label)
        for config in (fits if "fits" in parts else []):
            print("   fits", config.family)
        return 0
    session = Session(args)
    try:
        session.start()
        if "calibrate" in parts:
            calibrate(session)
        session.header()
        if "edge" in parts:
            fit_edge(session)
        if "grid" in parts:
            run_grid(session)
        if "fits" in parts:
            run_fits(session)
        if "walkthrough" in parts:
            walkthrough(session)
    finally:
        session.close()
    session.log(f"done: {session.out / 'prediction-grid.md'}")
    print((session.out / "prediction-grid.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
