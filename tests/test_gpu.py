"""On a real GPU (the GPU machine): the walkthrough's run, a real out-of-memory, and stop.

Skipped without CUDA. Run there with `python -m pytest -m gpu`.
"""

from __future__ import annotations

import time

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.engine import nvml
from anatomy.engine.devices import machine
from anatomy.store import PHASES
from anatomy.units import MIB

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BERT_LARGE_PARAMETERS = 335_143_938  # BertForSequenceClassification, 2 labels


def test_walkthrough_run_records_four_phases(manager, store):
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=4))
    assert manager.wait(run_id, timeout=900) == "completed"
    rep = report(store, run_id)
    assert rep.backend == "nvml"
    assert [p.name for p in rep.phases] == list(PHASES)
    baseline, kernel, weights, training = (p.memory_bytes for p in rep.phases)
    assert kernel - baseline > 100 * MIB  # the CUDA context
    weights_bytes = weights - kernel
    assert abs(weights_bytes - 4 * BERT_LARGE_PARAMETERS) < 0.05 * 4 * BERT_LARGE_PARAMETERS
    assert training > weights
    assert rep.summary.samples_per_second > 0
    assert rep.samples == rep.samples_sent
    steps = store.steps(run_id)
    assert len(steps) == 128 and all(s.allocated and s.reserved for s in steps)


def test_real_out_of_memory_then_the_next_run_works(manager, store):
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=2048, max_steps=2))
    assert manager.wait(run_id, timeout=600) == "oom"
    rep = report(store, run_id)
    assert "out of memory" in rep.error.lower()
    total = store.samples(run_id)[-1].total
    assert rep.summary.peak_bytes > 0.5 * total
    next_run = manager.start(RunOptions(preset="bert-base-uncased", batch_size=4, max_steps=5))
    assert manager.wait(next_run, timeout=600) == "completed"


def test_stop_frees_the_gpu(manager, store):
    gpu = machine().devices[0].nvml_index  # NVML's index of torch's GPU 0
    before = nvml.memory(gpu).used
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=4, max_steps=100_000))
    deadline = time.monotonic() + 300
    while not any(p.name == "training" for p in store.phases(run_id)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(2)
    assert nvml.memory(gpu).used > before + 1024 * MIB
    started = time.monotonic()
    manager.stop(run_id)
    assert time.monotonic() - started < 5
    assert store.run(run_id).status == "stopped"
    deadline = time.monotonic() + 5
    while nvml.memory(gpu).used > before + 64 * MIB and time.monotonic() < deadline:
        time.sleep(0.1)
    assert nvml.memory(gpu).used <= before + 64 * MIB  # no GPU memory stays held


TINYLLAMA_PARAMETERS = 1_100_048_384


def test_a_1b_model_is_on_the_gpu_within_15_seconds(manager, store):
    """Random weights made on the device: the weights phase of TinyLlama 1.1B in seconds, holding
    what the weights take (4 bytes a parameter, and the allocator's rounding)."""
    run_id = manager.start(RunOptions(model="tinyllama-1.1b", batch_size=1, seq_len=128,
                                      max_steps=1))
    assert manager.wait(run_id, timeout=600) == "completed"
    rep = report(store, run_id)
    kernel, weights = rep.phase("kernel"), rep.phase("weights")
    assert weights.start_s - kernel.end_s < 15  # building the model on the GPU
    held = weights.memory_bytes - kernel.memory_bytes
    assert 4 * TINYLLAMA_PARAMETERS <= held < 4 * TINYLLAMA_PARAMETERS + 256 * MIB
    assert rep.components.weights == 4 * TINYLLAMA_PARAMETERS


@pytest.mark.parametrize("model", ["gpt2", "vit-base-patch16-224"])
def test_measured_next_to_predicted_on_the_gpu(manager, store, model):
    """The run's measured components next to the traced prediction with this GPU's constants:
    weights, gradients and states exact, the allocator's peak within 3%."""
    from anatomy.analysis.prediction import predict

    options = RunOptions(model=model, batch_size=8, seq_len=256, precision="bf16", max_steps=3)
    run_id = manager.start(options)
    assert manager.wait(run_id, timeout=600) == "completed"
    rep = report(store, run_id)
    predicted = predict(options, device="cuda", gpu_name=rep.environment["gpu_name"])
    parts = rep.components
    assert (parts.weights, parts.gradients, parts.optimizer_states) == \
        (predicted.weights, predicted.gradients, predicted.optimizer_states)
    assert predicted.peak == pytest.approx(parts.peak_allocated, rel=0.03)
