"""A Hugging Face Trainer fine-tune, recorded with anatomy's Trainer callback.

    python examples/trainer_script.py                    # records a run into the store
    anatomy watch -- python examples/trainer_script.py   # the same, under `anatomy watch`

`anatomy.start()` at the top sees the baseline and the CUDA context; `AnatomyCallback.attach`
marks the weights (the Trainer built) and the training phase, reports every step and measures the
components of the first steps; its figures join the Trainer's logs, so `--report-to tensorboard`
(or mlflow, wandb) logs them beside the loss. The model is a tiny BERT built from its config (random weights)
on random data: small enough for a CPU (--layers changes its depth).
"""

import argparse

import anatomy

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--report-to", default="none",
                    help="the Trainer's report_to (tensorboard, mlflow, wandb…): anatomy's figures "
                         "join its logs")
parser.add_argument("--output-dir", default="/tmp/anatomy-example")
args = parser.parse_args()

anatomy.start(name="Trainer: tiny BERT")  # before the model: baseline, then the CUDA context

import numpy as np  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

config = BertConfig(hidden_size=128, num_hidden_layers=args.layers, num_attention_heads=2,
                    intermediate_size=512, vocab_size=30522, max_position_embeddings=512)
model = BertForSequenceClassification(config)
rng = np.random.default_rng(0)
size = args.steps * args.batch_size
dataset = Dataset.from_dict({"input_ids": rng.integers(100, 30000, (size, args.seq_len)),
                             "labels": rng.integers(0, 2, (size,))})
dataset.set_format("pt")
training = TrainingArguments(output_dir=args.output_dir, per_device_train_batch_size=
                             args.batch_size, max_steps=args.steps, logging_steps=1,
                             report_to=args.report_to.split(","), save_strategy="no",
                             disable_tqdm=True)
trainer = Trainer(model=model, args=training, train_dataset=dataset)
anatomy.AnatomyCallback.attach(trainer)  # ahead of report_to's integrations: they log its figures
trainer.train()
print(f"recorded run {anatomy.current().id if anatomy.current() else '(ended)'}")
