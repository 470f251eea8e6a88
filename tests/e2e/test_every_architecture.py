"""A tiny version of every architecture, end to end through the real worker on this CPU: built
from its config, trained with its task's head and dummy data, measured by the probe; the
measured weights, gradients and optimizer states are the prediction's."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from anatomy.analysis.models import PRESETS
from anatomy.analysis.report import report
from anatomy.engine.manager import machine
from anatomy.prediction import predict
from tests.conftest import TINY, flags

ON_GPU = machine().has_gpu
RUNS = [
    dict(model="tiny"),
    dict(model="tiny-gpt2"),
    dict(model="tiny-llama", lora_rank=4),
    dict(model="tiny-qwen2", precision="bf16", gradient_checkpointing=True),
    dict(model="tiny-vit", lora_rank=4, optim="sgd"),
]


@pytest.mark.parametrize("changes", RUNS, ids=lambda c: c["model"])
def test_every_architecture_trains_and_matches_its_prediction(recorded, changes):
    options = replace(TINY, **changes)  # the tiny BERT's is the run test_worker.py reads too
    store, run_id = recorded(options)
    rep = report(store, run_id)
    assert rep.status == "completed", rep.error
    predicted = predict(options, device="cuda" if ON_GPU else "cpu",
                        gpu_name=rep.environment.gpu_name)
    assert rep.preset == options.model
    assert rep.environment.parameters == predicted.parameters
    assert rep.environment.trainable_parameters == predicted.trainable_parameters
    parts = rep.components
    assert parts.weights == predicted.weights
    assert parts.gradients == predicted.gradients
    assert parts.optimizer_states == predicted.optimizer_states
    if options.lora:
        assert predicted.trainable_parameters < predicted.parameters / 10


def test_a_config_file_runs_and_is_listed_by_its_folder(tmp_path, store, tiny):
    folder = tmp_path / "my-gpt"
    folder.mkdir()
    (folder / "config.json").write_text(PRESETS["tiny-gpt2"].config_path.read_text())
    result = subprocess.run(
        [sys.executable, "-m", "anatomy", "run", *flags(replace(tiny, model=str(folder), max_steps=2)),
         "--store", str(store.path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"run 1: my-gpt, batch size {tiny.batch_size}")
    runs = json.loads(subprocess.run([sys.executable, "-m", "anatomy", "runs", "--json",
                                      "--store", str(store.path)], capture_output=True,
                                     text=True, timeout=60).stdout)
    assert runs[0]["preset"] == "my-gpt"
