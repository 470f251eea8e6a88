"""On a real GPU (the GPU machine): the walkthrough's run, a real out-of-memory in the first step
and in a later one, stop, and kill -9 of a run mid-step.

Skipped without CUDA. Run there with `python -m pytest -m gpu`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.engine import nvml
from anatomy.engine.devices import machine
from anatomy.engine.manager import DeviceLock, RunManager, device_key
from anatomy.store import PHASES, Store
from anatomy.units import MIB
from tests.conftest import PROJECT, make_text_data
from tests.e2e.conftest import HANG_SECONDS
from tests.helpers import alive, resnet_config, wait_until, within

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BERT_LARGE_PARAMETERS = 335_143_938  # BertForSequenceClassification, 2 labels


# The walkthrough's own procedure, nothing of anatomy: NVML (v2, as anatomy reads it) on the
# empty GPU, after the first tensor, after the model (random, from the shipped config, built on
# the host) is copied to the GPU. Its own process: its own CUDA context.
WALKTHROUGH_PROCEDURE = """
import json, sys
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[2]))
used = lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used
baseline = used()
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification
values = json.load(open(sys.argv[1]))
model_type = values.pop("model_type")
for key in ("transformers_version", "torch_dtype", "architectures"):
    values.pop(key, None)
config = AutoConfig.for_model(model_type, **values, num_labels=2)
torch.ones((1, 1)).to("cuda")
kernel = used()
model = AutoModelForSequenceClassification.from_config(config).to("cuda")
torch.cuda.synchronize()
print(json.dumps({"kernel": kernel - baseline, "weights": used() - baseline}))
"""


def walkthrough_procedure(config: str) -> dict[str, int]:
    gpu = machine().devices[0].nvml_index
    done = subprocess.run([sys.executable, "-c", WALKTHROUGH_PROCEDURE, config, str(gpu)],
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_walkthrough_run_records_four_phases_as_the_walkthrough_reads_them(manager, store):
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=4))
    assert manager.wait(run_id, timeout=900) == "completed"
    rep = report(store, run_id)
    assert rep.backend == "nvml"
    assert [p.name for p in rep.phases] == list(PHASES)
    baseline, kernel, weights, training = (p.memory_bytes for p in rep.phases)
    # the kernel phase is torch's CUDA context only, the weights phase the weights copied there
    # and nothing else: what the walkthrough's own procedure reads on the same GPU, to the MiB
    own = walkthrough_procedure(str(PROJECT / "anatomy/analysis/configs/bert-large-uncased.json"))
    assert abs((kernel - baseline) - own["kernel"]) <= 2 * MIB, (kernel - baseline, own)
    assert abs((weights - baseline) - own["weights"]) <= 2 * MIB, (weights - baseline, own)
    weights_bytes = weights - kernel
    assert abs(weights_bytes - 4 * BERT_LARGE_PARAMETERS) < 0.05 * 4 * BERT_LARGE_PARAMETERS
    assert training > weights
    assert rep.summary.samples_per_second > 0
    assert rep.samples == rep.samples_sent
    steps = store.steps(run_id)
    assert len(steps) == 128 and all(s.allocated and s.reserved for s in steps)


def test_a_1b_models_weights_are_allocated_on_the_device_once(manager, store):
    """Its weights are allocated on the device, read, then initialised there: no copy through
    the host, no second copy on the device. How soon it reaches training is a timing, measured
    by bench/startup.py (docs/BENCHMARKS.md, "Start-up"), not asserted here: it depends on the
    image (13-16 s on the H200 image, whose torch has no bytecode and PYTHONDONTWRITEBYTECODE=1;
    6-7 s with bytecode cached)."""
    run_id = manager.start(RunOptions(preset="tinyllama-1.1b", batch_size=1, seq_len=128,
                                      max_steps=2))
    assert manager.wait(run_id, timeout=600) == "completed"
    rep = report(store, run_id)
    starts = [rep.phase(name).start_s for name in PHASES]
    assert starts == sorted(starts), starts
    weights = rep.phase("weights").memory_bytes - rep.phase("kernel").memory_bytes
    # NVML's figure, within 1 %: the kernel phase's own small block is counted on either side
    assert abs(weights - 4 * 1_100_048_384) < 0.01 * 4 * 1_100_048_384
    assert rep.components.weights == 4 * 1_100_048_384  # the allocator's, exact


def test_real_out_of_memory_in_the_first_step_then_the_next_run_works(manager, store):
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=2048, max_steps=2))
    assert manager.wait(run_id, timeout=600) == "oom"
    rep = report(store, run_id)
    assert "out of memory" in rep.error.lower()
    assert store.steps(run_id) == []  # the first step never ended
    assert rep.samples == rep.samples_sent
    assert rep.training.done and rep.training.memory_bytes > rep.phase("weights").memory_bytes
    total = store.samples(run_id)[-1].total
    assert rep.summary.peak_bytes > 0.5 * total
    next_run = manager.start(RunOptions(preset="bert-base-uncased", batch_size=4, max_steps=5))
    assert manager.wait(next_run, timeout=600) == "completed"


def _training_steps(store, run_id: int, steps: int, timeout: float = 600) -> None:
    def stepped() -> bool:
        if store.step_count(run_id) >= steps:
            return True
        assert store.run(run_id).status == "running", store.run(run_id).error
        return False

    wait_until(stepped, timeout, f"run {run_id}'s step {steps}", every=0.2)


def test_real_out_of_memory_in_a_later_step(manager, store, monkeypatch):
    """The device fills while the run trains (another process takes what is free): the next
    allocation of a step fails for real. Without its cache, the allocator asks CUDA every step."""
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # inherited by the worker
    run_id = manager.start(RunOptions(preset="bert-base-uncased", batch_size=8, seq_len=128,
                                      max_steps=100_000))
    _training_steps(store, run_id, 3)
    uuid = machine().devices[0].uuid
    index = next((i for i in range(torch.cuda.device_count())
                  if uuid and f"GPU-{torch.cuda.get_device_properties(i).uuid}" == uuid), 0)
    with torch.cuda.device(index):
        hog = None
        for _ in range(20):  # the worker's own use moves between and within steps: try again
            free, _ = torch.cuda.mem_get_info()
            try:
                hog = torch.empty(free - 32 * MIB, dtype=torch.uint8, device="cuda")
                break
            except torch.cuda.OutOfMemoryError:
                time.sleep(0.05)
        assert hog is not None, "could not take the GPU's free memory"
        try:
            assert manager.wait(run_id, timeout=300) == "oom"
        finally:
            del hog
            torch.cuda.empty_cache()
    rep = report(store, run_id)
    assert "out of memory" in rep.error.lower()
    assert rep.steps >= 3  # a later step, not the first
    assert rep.samples == rep.samples_sent
    assert rep.training.done


def test_kill_9_of_a_run_mid_step_frees_the_gpu(tmp_path):
    """`python -m anatomy run` killed with -9 while it trains: its worker dies with it, the GPU's
    memory is given back, the device is free, and the next start closes the run."""
    gpu = machine().devices[0].nvml_index
    before = nvml.memory(gpu).used
    path = tmp_path / "killed.sqlite"
    cli = subprocess.Popen([sys.executable, "-m", "anatomy", "run", "--preset",
                            "bert-large-uncased", "--batch-size", "4", "--max-steps", "100000",
                            "--store", str(path)], cwd=PROJECT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        wait_until(lambda: path.exists() and Store(path).step_count(1) >= 3, 600,
                   "the run's step 3", every=0.2, process=cli)
        assert nvml.memory(gpu).used > before + 1024 * MIB
        tree = psutil.Process(cli.pid).children(recursive=True)
        cli.send_signal(signal.SIGKILL)
        cli.wait(30)
        within(HANG_SECONDS, lambda: nvml.memory(gpu).used <= before + 64 * MIB, every=0.1)
        assert nvml.memory(gpu).used <= before + 64 * MIB, "the GPU's memory is still held"
        _, still = psutil.wait_procs(tree, timeout=10)
        assert [p for p in still if alive(p)] == []
    finally:
        cli.kill()
    lock = DeviceLock(device_key(RunOptions(), machine()))
    assert lock.acquire("test")
    lock.release()
    store = Store(path)
    RunManager(store)
    rep = report(store, 1)
    assert rep.status == "failed" and rep.training.done and rep.steps >= 3
    # Its training phase ends at the sampler's last tick before the worker began to exit: the
    # memory it held, not what the device showed once the memory was given back.
    assert rep.training.memory_bytes > rep.phase("weights").memory_bytes


def test_stop_frees_the_gpu(manager, store):
    gpu = machine().devices[0].nvml_index  # NVML's index of torch's GPU 0
    before = nvml.memory(gpu).used
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=4, max_steps=100_000))
    wait_until(lambda: any(p.name == "training" for p in store.phases(run_id)), 300,
               f"run {run_id}'s training", every=0.1)
    wait_until(lambda: nvml.memory(gpu).used > before + 1024 * MIB, 60,
               "the training to hold more than 1 GiB of the GPU", every=0.1)
    started = time.monotonic()
    manager.stop(run_id)
    assert time.monotonic() - started < HANG_SECONDS  # it returns: a hang, not a speed
    assert store.run(run_id).status == "stopped"
    within(HANG_SECONDS, lambda: nvml.memory(gpu).used <= before + 64 * MIB, every=0.1)
    assert nvml.memory(gpu).used <= before + 64 * MIB  # no GPU memory stays held


def test_the_device_panel_reads_the_gpu_as_nvitop_does(manager, store):
    """Real NVML: utilisation, power and temperature while training, and the run's own process
    among every process on the GPU, with the memory the driver charges to it; and a profiled
    run's peak that leaves the profiler's steps out."""
    run_id = manager.start(RunOptions(preset="bert-large-uncased", batch_size=4, max_steps=40,
                                      profile_steps=3))
    assert manager.wait(run_id, timeout=900) == "completed"
    rep = report(store, run_id)
    gpu = rep.gpu
    training = [s for s in store.gpu_status(run_id)
                if s.gpu == gpu and rep.training.start_s <= s.t <= rep.training.end_s]
    assert training, "no device reading during training"
    assert max(s.util for s in training) > 50  # the GPU was busy
    assert all(s.power_w > 0 and s.power_limit_w >= s.power_w for s in training)
    assert all(0 < s.temperature_c < 110 for s in training)
    listed = [p for p in store.gpu_processes(run_id, at=rep.training.end_s) if p.gpu == gpu]
    assert listed and max(p.used or 0 for p in listed) > 1024 * MIB
    if any(p.name is not None for p in listed):  # NVML's pids are this namespace's (no container)
        assert store.run(run_id).worker_pid in {p.pid for p in listed}
    hosts = store.host_status(run_id)
    assert hosts and all(0 < h.ram_used < h.ram_total for h in hosts)
    # torch.profiler after training: marked, and not in the peak.
    assert rep.profiling.done and rep.profiling.start_s >= rep.training.end_s
    before = [s.used for s in store.samples(run_id, gpu) if s.t < rep.profiling.start_s]
    assert rep.summary.peak_bytes == max(before)


@pytest.mark.parametrize("model", ["gpt2", "vit-base-patch16-224"])
def test_measured_next_to_predicted_on_the_gpu(manager, store, model):
    """The run's measured components next to the traced prediction with this GPU's constants:
    weights, gradients and states exact, the allocator's peak within 3%."""
    from anatomy.prediction import predict

    options = RunOptions(model=model, batch_size=8, seq_len=256, precision="bf16", max_steps=3)
    run_id = manager.start(options)
    assert manager.wait(run_id, timeout=600) == "completed"
    rep = report(store, run_id)
    predicted = predict(options, device="cuda", gpu_name=rep.environment.gpu_name)
    parts = rep.components
    assert (parts.weights, parts.gradients, parts.optimizer_states) == \
        (predicted.weights, predicted.gradients, predicted.optimizer_states)
    assert predicted.peak == pytest.approx(parts.peak_allocated, rel=0.03)


@pytest.mark.parametrize("model, lora", [
    ("tinyllama-1.1b", dict(lora_rank=16, lora_dropout=0.05)),
    ("qwen2-0.5b", {}), ("gpt2", dict(label_smoothing=0.1))])
def test_bf16_weights_lora_dropout_and_label_smoothing_measured_next_to_predicted(
        manager, store, model, lora):
    """A model built in bf16 (most LLM fine-tunes load it so), alone, as the base of a LoRA with
    peft's dropout, or under the Trainer's label smoothing: two bytes a weight, the dropout's
    masks and the smoother's log-probabilities in the activations; measured as predicted
    (components exact, the allocator's peak within 3 %)."""
    from anatomy.prediction import predict

    options = RunOptions(model=model, batch_size=8, seq_len=256, precision="bf16",
                         weights="bf16", max_steps=3, **lora)
    run_id = manager.start(options)
    assert manager.wait(run_id, timeout=600) == "completed", report(store, run_id).error
    rep = report(store, run_id)
    predicted = predict(options, device="cuda", gpu_name=rep.environment.gpu_name)
    parts = rep.components
    # two bytes a base weight; peft keeps its adapters in fp32 over a bf16 base
    assert parts.weights == 2 * rep.environment.parameters or "lora_rank" in lora
    assert (parts.weights, parts.gradients, parts.optimizer_states) == \
        (predicted.weights, predicted.gradients, predicted.optimizer_states)
    assert predicted.peak == pytest.approx(parts.peak_allocated, rel=0.03)


USERS_BF16_LORA_SCRIPT = """
import anatomy
anatomy.start(name="Trainer: bf16 Llama, LoRA")
import numpy as np, torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
config = LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, intermediate_size=2816, vocab_size=32000)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                         task_type="CAUSAL_LM"))
ids = np.random.default_rng(0).integers(100, 31000, (48, 256))
dataset = Dataset.from_dict({"input_ids": ids, "labels": ids})
dataset.set_format("pt")
training = TrainingArguments(output_dir="out", per_device_train_batch_size=8, max_steps=6,
                             bf16=True, logging_steps=1, report_to=[], save_strategy="no",
                             disable_tqdm=True, eval_strategy="steps", eval_steps=2,
                             per_device_eval_batch_size=32)
trainer = Trainer(model=model, args=training, train_dataset=dataset, eval_dataset=dataset)
anatomy.AnatomyCallback.attach(trainer)
trainer.train()
"""


def test_a_users_bf16_lora_trainer_with_dropout_under_watch_on_the_gpu(tmp_path):
    """A user's Trainer over a model loaded in bf16 with peft's LoRA and dropout, as most LLM
    fine-tunes are written, evaluating every two steps at four times its batch: the callback
    records the weights' type and the dropout, and the prediction made from them lands on what
    the GPU measured in the training steps before the first evaluation (the evaluation's logits
    are no training step's)."""
    from anatomy.prediction.breakdown import NoPrediction, predicted

    (tmp_path / "train.py").write_text(USERS_BF16_LORA_SCRIPT)
    path = tmp_path / "user.sqlite"
    env = {**os.environ, "ANATOMY_STORE": str(path), "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--", sys.executable,
                             "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    store = Store(path)
    rep = report(store, store.runs()[0].id)
    assert rep.status == "completed" and rep.on_gpu
    assert (rep.options.weights, rep.options.lora_rank, rep.options.lora_dropout) == \
        ("bf16", 16, 0.05)
    assert rep.evaluated_from is not None and rep.environment.eval_batch_size == 32
    parts = rep.components
    prediction = predicted(rep)
    assert not isinstance(prediction, NoPrediction), prediction
    assert (prediction.weights, prediction.gradients, prediction.optimizer_states) == \
        (parts.weights, parts.gradients, parts.optimizer_states)
    assert prediction.peak == pytest.approx(parts.peak_allocated, rel=0.03)


def _vision_language_config(folder, kind: str) -> str:
    """A vision-language model's config as transformers saves it: LLaVA-1.5's CLIP ViT-L/14-336
    tower before a small Llama, or Qwen2.5-VL's own tower and text (its rotary sections)."""
    import transformers

    text = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=4096)
    if kind == "llava":
        config = transformers.LlavaConfig(
            text_config=dict(model_type="llama", vocab_size=32064, **text),
            vision_config=dict(model_type="clip_vision_model", hidden_size=1024,
                               num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096, image_size=336, patch_size=14),
            image_token_index=32000)
        config.architectures = ["LlavaForConditionalGeneration"]
    else:
        config = transformers.Qwen2_5_VLConfig(
            text_config=dict(text, vocab_size=151936, rope_scaling={
                "type": "mrope", "mrope_section": [16, 24, 24]}),
            vision_config=dict(depth=8, hidden_size=640, num_heads=10, intermediate_size=1280,
                               out_hidden_size=1024),
            image_token_id=151655, video_token_id=151656, vision_start_token_id=151652)
        config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    config.save_pretrained(folder / kind)
    return str(folder / kind)


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_a_vision_language_model_on_its_text_measured_next_to_predicted(manager, store, tmp_path,
                                                                        kind):
    """A vision-language model trains on its text alone: its vision tower's weights on the GPU,
    no gradient or optimizer state for them; measured as predicted (components exact, the
    allocator's peak within 3 %)."""
    from anatomy.prediction import predict

    options = RunOptions(model=_vision_language_config(tmp_path, kind), batch_size=8,
                         seq_len=256, precision="bf16", max_steps=3)
    run_id = manager.start(options)
    assert manager.wait(run_id, timeout=600) == "completed", report(store, run_id).error
    rep = report(store, run_id)
    predicted = predict(options, device="cuda", gpu_name=rep.environment.gpu_name)
    parts = rep.components
    assert (parts.weights, parts.gradients, parts.optimizer_states) == \
        (predicted.weights, predicted.gradients, predicted.optimizer_states)
    assert parts.gradients < parts.weights  # the vision tower takes none
    assert predicted.peak == pytest.approx(parts.peak_allocated, rel=0.03)


def test_a_users_trainer_script_under_watch_on_the_gpu(tmp_path):
    """The path a user walks: their Trainer script with the callback, under `anatomy watch`, on
    the GPU: the four phases, its steps, the components measured, and the prediction made from
    the config the callback recorded lands on the allocator's peak."""
    from anatomy.prediction.breakdown import NoPrediction, predicted

    path = tmp_path / "user.sqlite"
    env = {**os.environ, "ANATOMY_STORE": str(path), "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--", sys.executable,
                             str(PROJECT / "examples" / "trainer_script.py"), "--steps", "6",
                             "--batch-size", "16", "--seq-len", "256", "--layers", "4"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    store = Store(path)
    rep = report(store, store.runs()[0].id)
    assert rep.status == "completed" and rep.on_gpu
    assert [p.name for p in rep.phases] == list(PHASES)
    assert rep.steps == 6 and rep.name == "Trainer: tiny BERT"
    parts = rep.components
    assert parts.weights == parts.gradients == 4 * rep.environment.parameters
    prediction = predicted(rep)
    assert not isinstance(prediction, NoPrediction), prediction
    assert (prediction.weights, prediction.gradients, prediction.optimizer_states) == \
        (parts.weights, parts.gradients, parts.optimizer_states)
    # a small model: the allocator's peak within 3 % or 8 MiB (its rounding is that coarse)
    assert abs(prediction.peak - parts.peak_allocated) <= max(0.03 * parts.peak_allocated,
                                                               8 * MIB)


def test_a_users_saved_qwen3_on_their_json_lines_measured_next_to_predicted(tmp_path):
    """The files a user brings, by relative paths from their own folder: a Qwen3 config as
    transformers saves it, JSON lines of texts of many lengths and a tokenizer saved with
    save_pretrained; bf16 weights under a LoRA. On the GPU the run's own prediction (at the
    micro-batch it measured) holds its components exactly and its allocator peak within 3 %,
    and `predict` at the data's longest batch is no lower than what the run measured."""
    from anatomy.prediction.breakdown import NoPrediction, predicted

    (tmp_path / "my-qwen3").mkdir()
    (tmp_path / "my-qwen3" / "config.json").write_text(
        (PROJECT / "bench" / "models" / "qwen3-0.6b-saved.json").read_text())
    make_text_data(tmp_path / "data", tuple(range(20, 420, 10)))  # 40 texts, 20 to 410 tokens
    flags = ["--model", "my-qwen3", "--dataset", "data/texts.jsonl", "--tokenizer",
             "data/tokenizer", "--batch-size", "8", "--precision", "bf16", "--weights", "bf16",
             "--lora-rank", "16", "--max-steps", "5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    run = subprocess.run([sys.executable, "-m", "anatomy", "run", *flags, "--store", "u.sqlite"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "40 texts" in run.stdout and "LoRA rank 16" in run.stdout
    store = Store(tmp_path / "u.sqlite")
    rep = report(store, 1)
    assert rep.status == "completed" and rep.on_gpu and rep.steps == 5
    prediction = predicted(rep)
    assert not isinstance(prediction, NoPrediction), prediction
    parts = rep.components
    assert (prediction.weights, prediction.gradients, prediction.optimizer_states) == \
        (parts.weights, parts.gradients, parts.optimizer_states)
    assert prediction.peak == pytest.approx(parts.peak_allocated, rel=0.03)
    said = subprocess.run([sys.executable, "-m", "anatomy", "predict", *flags, "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert said.returncode == 0, said.stderr
    longest = json.loads(said.stdout)
    assert longest["dataset"]["longest_padded_to"] == 410
    assert longest["components"]["peak"] >= parts.peak_allocated


def test_watch_is_refused_while_a_run_holds_the_gpu(manager, store, tmp_path):
    """Two recordings of one GPU would mix their figures: `watch` takes the device lock that
    `anatomy run` holds, and says so in one line, starting nothing."""
    run_id = manager.start(RunOptions(preset="bert-base-uncased", batch_size=8,
                                      max_steps=100_000))
    wait_until(lambda: any(p.name == "training" for p in store.phases(run_id)), 300,
               f"run {run_id}'s training", every=0.1)
    marker = tmp_path / "ran"
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--store",
                             str(tmp_path / "other.sqlite"), "--", sys.executable, "-c",
                             f"open({str(marker)!r}, 'w')"], cwd=PROJECT, capture_output=True,
                            text=True, timeout=120)
    manager.stop(run_id)
    assert result.returncode == 2, result.stderr
    assert "busy" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()  # nothing started


def test_convolution_workspaces_measured_on_the_gpu(tmp_path):
    """`predict --max-batch-size --measure-convolutions` on a small ResNet: each distinct
    convolution's cuDNN workspaces measured in a child process on this GPU, the answer says so,
    and nothing of the measurement stays on the device."""
    path = resnet_config(tmp_path, width=16, image_size=64)
    gpu = machine().devices[0]
    before = nvml.memory(gpu.nvml_index).used
    done = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--model", str(path),
                           "--max-batch-size", "--measure-convolutions", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    assert fit["workspaces_measured"] and not fit["convolutions"] and fit["max_batch_size"]
    assert "convolutions' cuDNN workspaces on GPU 0" in done.stderr
    assert nvml.memory(gpu.nvml_index).used - before < 64 * MIB  # the child's context gone
    one = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--model", str(path),
                          "--batch-size", "64", "--measure-convolutions", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stderr
    predicted = json.loads(one.stdout)  # at one batch size: traced in place of NVML's band
    assert predicted["workspaces_measured"] and predicted["nvml_high"] is None
    assert "at batch size 64" in one.stderr


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA GPUs")
def test_two_gpus_through_accelerate_ddp(manager, store, monkeypatch):
    """Issue 12: bert-base on GPUs 0 and 1, DDP through accelerate; each rank's phases on its
    own GPU, each GPU's memory sampled, nothing left running."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (the GPU machine's notes)
    run_id = manager.start(RunOptions(preset="bert-base-uncased", batch_size=4, max_steps=10,
                                      gpus="0,1", strategy="ddp"))
    assert manager.wait(run_id, timeout=600) == "completed", store.run(run_id).error
    rep = report(store, run_id)
    assert rep.world_size == 2 and rep.strategy == "ddp" and len(set(rep.gpus)) == 2
    assert [r.rank for r in rep.ranks] == [0, 1]
    params = rep.parameters
    for r in rep.ranks:
        kernel, weights = r.phase("kernel").memory_bytes, r.phase("weights").memory_bytes
        assert kernel > 100 * MIB  # its own CUDA context, on its own GPU
        assert abs((weights - kernel) - 4 * params) < 0.1 * 4 * params
        assert r.peak_bytes > weights and r.components is not None
        assert [s.step for s in store.steps(run_id, r.rank)] == list(range(1, 11))
    assert set(rep.gpu_peaks()) == set(rep.gpus)
    assert rep.summary.samples_per_second > 0
    assert rep.samples == rep.samples_sent
    left = [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]
    assert [p for p in left if alive(p)] == []
