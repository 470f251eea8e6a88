"""The training bench/overhead.py times: the walkthrough's Trainer run (bert-large on a GPU, a
tiny BERT on a CPU), repeated in one process with and without anatomy, variants interleaved.

Each variant trains the same model for --steps steps on the walkthrough's dummy data; a clock
callback (in every variant alike) synchronises the GPU once after --warmup steps and once at
the end, so `steady_samples_per_second` is the throughput of the steps in between, and keeps
every step's end on the host clock for the step-time distribution. Writes one JSON line per
variant and repeat to --output.

Variants (comma-separated, --variants):
  walkthrough      the anatomy worker's TrainingArguments (logging every step, no tqdm, no
                   checkpoints, adamw_torch), no anatomy
  callback200      the same with AnatomyCallback at 200 Hz (its own sampler process)
  callback1000     the same at 1 kHz
  callback200-nopredict  callback200 without the predicted peak's child interpreter
                   (AnatomyCallback(predict=False)): what that child costs the training
  defaults         the Trainer's own defaults (logging every 500 steps, tqdm, its default
                   optimizer), no anatomy
  defaults-log1    defaults but logging every step
  defaults-adamw   defaults but optim adamw_torch
Under `anatomy watch` the callback joins the watch's run instead of starting a sampler: then
"walkthrough" measures the watch alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_callback import PrinterCallback

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "anatomy", "analysis", "configs")


class StepClock(TrainerCallback):
    """Every step's end on the host clock; the GPU synchronised at the warm-up's end and at the
    end of training, so the steady throughput is exact."""

    def __init__(self, warmup: int):
        self.warmup, self.ends, self.steady = warmup, [], None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.steady = time.perf_counter()
        self.ends.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ended = time.perf_counter()


def arguments(variant: str, steps: int, batch_size: int, output_dir: str) -> TrainingArguments:
    common = dict(output_dir=output_dir, per_device_train_batch_size=batch_size, max_steps=steps,
                  report_to="none", use_cpu=not torch.cuda.is_available())
    if variant.startswith("defaults"):
        extra = {}
        if variant == "defaults-log1":
            extra["logging_steps"] = 1
        if variant == "defaults-adamw":
            extra["optim"] = "adamw_torch"
        return TrainingArguments(**common, **extra)
    return TrainingArguments(**common, logging_steps=1, disable_tqdm=True, save_strategy="no",
                             optim="adamw_torch", log_level="error")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="walkthrough,callback200,callback1000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--output", required=True)
    parser.add_argument("--label", default="")
    args = parser.parse_args()

    on_gpu = torch.cuda.is_available()
    preset = "bert-large-uncased" if on_gpu else "tiny"
    seq_len = args.seq_len or (512 if on_gpu else 64)
    with open(os.path.join(CONFIGS, f"{preset}.json")) as file:
        config = BertConfig.from_dict({**json.load(file), "num_labels": 2})
    device = "cuda" if on_gpu else "cpu"
    with torch.device(device):
        model = AutoModelForSequenceClassification.from_config(config)
    rng = np.random.default_rng(42)
    size = args.steps * args.batch_size
    dataset = Dataset.from_dict({"input_ids": rng.integers(100, 30000, (size, seq_len)),
                                 "labels": rng.integers(0, 2, (size,))})
    dataset.set_format("pt")
    device_name = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    variants = args.variants.split(",")
    with open(args.output, "a") as out:
        for repeat in range(args.repeats):
            for variant in variants:
                callbacks: list[TrainerCallback] = [StepClock(args.warmup)]
                if variant.startswith("callback"):
                    import anatomy

                    rate, _, without = variant.removeprefix("callback").partition("-")
                    callbacks.append(anatomy.AnatomyCallback(
                        f"overhead {variant}", sample_rate=int(rate),
                        predict=without != "nopredict"))
                trainer = Trainer(model=model, args=arguments(variant, args.steps, args.batch_size,
                                                              f"/tmp/anatomy-overhead-{variant}"),
                                  train_dataset=dataset, callbacks=callbacks)
                trainer.remove_callback(PrinterCallback)
                result = trainer.train()
                clock = callbacks[0]
                steady = (args.steps - args.warmup) * args.batch_size / (clock.ended - clock.steady)
                intervals = np.diff(clock.ends[args.warmup:]) * 1000
                record = {
                    "label": args.label, "variant": variant, "repeat": repeat,
                    "device": device_name, "model": preset, "batch_size": args.batch_size,
                    "seq_len": seq_len, "steps": args.steps, "warmup": args.warmup,
                    "steady_samples_per_second": steady,
                    "trainer_samples_per_second": result.metrics["train_samples_per_second"],
                    "step_ms_p50": float(np.percentile(intervals, 50)),
                    "step_ms_p95": float(np.percentile(intervals, 95)),
                    "step_ms_max": float(intervals.max()),
                    "watched": bool(os.environ.get("ANATOMY_WATCH")),
                }
                out.write(json.dumps(record) + "\n")
                out.flush()
                print(f"{args.label or 'plain'} {variant} #{repeat}: {steady:.2f} samples/s",
                      file=sys.stderr, flush=True)
                del trainer
                if on_gpu:
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
