"""The walkthrough's own procedure ("Model training anatomy", transformers' documentation), with
nothing of anatomy: plain torch, transformers and NVML. Prints its four readings as JSON.

    python bench/walkthrough_script.py [--config anatomy/analysis/configs/bert-large-uncased.json]
                                       [--batch-size 4] [--max-steps N] [--device cuda|cpu]

As the walkthrough: NVML's used memory on the empty GPU; after `torch.ones((1, 1)).to("cuda")`;
after the model (here from its config, random weights, built on the host) is moved to the GPU
with `.to("cuda")`; after `Trainer.train()` on 512 random sequences of 512 tokens with binary
labels, batch size 4, one epoch, `eval_strategy` "no" (today's transformers refuses "steps"
without an evaluation set), `log_level="error"`, `report_to="none"`. MB as the walkthrough
computes it (`used // 1024**2`), NVML v2's used (the driver's reservation apart, as anatomy
reads it) and v1's beside it. The Hugging Face `datasets` package is replaced by a list of
dicts, which the Trainer's collator takes the same way.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH_CONFIG = ROOT / "anatomy" / "analysis" / "configs" / "bert-large-uncased.json"


def reading(index: int = 0) -> dict:
    """NVML's used memory of GPU `index`, v2 and v1, in bytes; {} without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used
        return {"used": int(v2), "used_v1": int(v1)}
    except Exception:  # noqa: BLE001 - no NVML (the CPU): the procedure still runs
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(WALKTHROUGH_CONFIG))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--dataset-size", type=int, default=512)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    out: dict = {"baseline": reading()}
    started = time.monotonic()

    import torch
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        Trainer,
        TrainingArguments,
        logging,
    )

    logging.set_verbosity_error()
    values = json.loads(Path(args.config).read_text())
    model_type = values.pop("model_type")
    for key in ("transformers_version", "torch_dtype", "dtype", "architectures"):
        values.pop(key, None)
    config = AutoConfig.for_model(model_type, **values, num_labels=2)
    data = {"input_ids": np.random.randint(100, 30000, (args.dataset_size, args.seq_len)),
            "labels": np.random.randint(0, 2, (args.dataset_size,))}
    dataset = [{"input_ids": data["input_ids"][i], "labels": data["labels"][i]}
               for i in range(args.dataset_size)]

    torch.ones((1, 1)).to(args.device)
    out["kernel"] = reading()
    model = AutoModelForSequenceClassification.from_config(config).to(args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
    out["weights"] = reading()
    out["weights_s"] = round(time.monotonic() - started, 2)
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = TrainingArguments(
            output_dir=output_dir, eval_strategy="no", num_train_epochs=1, log_level="error",
            report_to="none", per_device_train_batch_size=args.batch_size,
            max_steps=args.max_steps, use_cpu=args.device == "cpu")
        result = Trainer(model=model, args=arguments, train_dataset=dataset).train()
    if args.device == "cuda":
        torch.cuda.synchronize()
    out["training"] = reading()
    out["time_s"] = round(result.metrics["train_runtime"], 2)
    out["samples_per_second"] = round(result.metrics["train_samples_per_second"], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
