"""`python -m anatomy`: the documented interface, run as a user would."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anatomy.engine.devices import machine
from tests.conftest import PROJECT, TINY, flags
from tests.helpers import resnet_config

ON_GPU = machine().backend == "nvml"  # the same tests pass on a GPU machine, measuring NVML


def anatomy(*args: str, store) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", *args, "--store", str(store)],
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One real tiny run through the CLI, shared by the read-only commands below."""
    store = tmp_path_factory.mktemp("cli") / "runs.sqlite"
    result = anatomy("run", *flags(TINY), store=store)
    return store, result


def test_run_prints_each_phase_and_the_summary(recorded):
    _, result = recorded
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    what = "GPU memory occupied:" if ON_GPU else "CPU memory (RSS) occupied:"
    occupied = [line for line in lines if line.startswith(what)]
    # the kernel phase as every page names it: on a CPU there is no kernel, torch is loaded
    assert [line.split("(")[-1].rstrip(")") for line in occupied] == \
        ["baseline", "CUDA kernels" if ON_GPU else "torch loaded", "weights", "training"]
    assert any(line.startswith("Time: ") for line in lines)
    assert any(line.startswith("Samples/second: ") for line in lines)
    assert ("NVML" if ON_GPU else "CPU resident memory (RSS)") in result.stdout  # what it measures
    assert "store: " in result.stdout  # where the run goes, said as it starts
    # No warning the user did not cause: every run said "eval_strategy 'steps' needs an
    # evaluation dataset…" (the walkthrough's arguments, which transformers now refuses).
    assert "warning" not in result.stderr and "eval_strategy" not in result.stderr, result.stderr
    assert any(line.startswith("Time: ") and line.endswith(" s") for line in lines)  # its unit


def test_a_lora_runs_first_line_says_its_lora(tmp_path):
    """`anatomy run --lora-rank 4` said "run 1: tiny, batch size 4, fp32, CPU", as a run that
    trains every weight: the Live page and `show` name its LoRA."""
    from dataclasses import replace

    result = anatomy("run", *flags(replace(TINY, lora_rank=4, max_steps=1)),
                     store=tmp_path / "runs.sqlite")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("run 1: tiny, batch size") and ", LoRA rank 4, " in first, \
        result.stdout


def test_runs_and_show_as_json(recorded):
    store, _ = recorded
    runs = json.loads(anatomy("runs", "--json", store=store).stdout)
    assert runs[0]["status"] == "completed" and runs[0]["preset"] == "tiny"
    shown = json.loads(anatomy("show", str(runs[0]["id"]), "--json", store=store).stdout)
    assert shown["backend"] == ("nvml" if ON_GPU else "cpu-rss")
    assert [p["name"] for p in shown["phases"]] == ["baseline", "kernel", "weights", "training"]
    assert all(isinstance(p["memory_mb"], int) and "start_s" in p for p in shown["phases"])
    assert shown["samples"] > 0
    assert set(shown["summary"]) >= {"time_s", "samples_per_second", "peak_mb"}
    assert shown["options"]["seq_len"] == TINY.seq_len


def test_export_json_and_csv(recorded, tmp_path):
    store, _ = recorded
    out = tmp_path / "run.json"
    assert anatomy("export", "1", "--format", "json", "--output", str(out), store=store).returncode == 0
    exported = json.loads(out.read_text())
    assert exported["version"] == 1 and len(exported["runs"]) == 1
    text = anatomy("export", "1", "--format", "csv", store=store).stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    shown = json.loads(anatomy("show", "1", "--json", store=store).stdout)
    assert len(rows) == shown["samples"] == len(exported["runs"][0]["samples"])


def test_a_run_carries_its_relatively_named_model_past_the_folders_deletion(tmp_path,
                                                                           monkeypatch):
    """`anatomy run --model my-bert` in a project folder (a folder as save_pretrained writes
    one), the folder deleted since: read from another folder, and imported into another store,
    the run said "No prediction: model: 'my-bert' is not a preset …"."""
    import dataclasses
    import shutil

    from transformers import BertConfig, BertForSequenceClassification

    from anatomy.analysis.report import report
    from anatomy.prediction import Prediction, breakdown
    from anatomy.store import Store

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The user's checkpoint, weights and all, as save_pretrained writes it
    BertForSequenceClassification(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=1000, max_position_embeddings=64)).save_pretrained(project / "my-bert")
    store, other = tmp_path / "runs.sqlite", tmp_path / "other.sqlite"
    run = subprocess.run([sys.executable, "-m", "anatomy", "run", "--store", str(store),
                          *flags(dataclasses.replace(TINY, model="my-bert"))],
                         cwd=project, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    # Its weights are not what the run trains: said (a run said nothing of them)
    assert "info: my-bert holds weights (model.safetensors): anatomy trains random weights of " \
           "its config" in run.stderr
    shutil.rmtree(project / "my-bert")
    monkeypatch.chdir(elsewhere)
    predicted = breakdown.predicted(report(Store(store), 1))
    assert isinstance(predicted, Prediction), predicted
    assert predicted.parameters == 139_586  # the folder's BERT, its classifier of 2 labels
    shown = anatomy("show", "1", store=store).stdout
    assert f"model: my-bert from model folder {project / 'my-bert'} (its config kept in the " \
        "run)" in shown.splitlines()
    exported = tmp_path / "run.json"
    assert anatomy("export", "1", "--format", "json", "--output", str(exported),
                   store=store).returncode == 0
    assert anatomy("import", str(exported), store=other).returncode == 0
    assert breakdown.predicted(report(Store(other), 1)) == predicted


def test_bad_option_is_refused_with_its_range_and_starts_nothing(tmp_path):
    store = tmp_path / "s.sqlite"
    result = anatomy("run", "--batch-size", "0", "--seq-len", "9999", store=store)
    assert result.returncode == 2
    assert "batch_size: 0 is out of range: 1 to 4096" in result.stderr
    assert "seq_len" in result.stderr
    assert json.loads(anatomy("runs", "--json", store=store).stdout) == []


def test_unknown_run_is_a_message(tmp_path):
    result = anatomy("show", "42", store=tmp_path / "s.sqlite")
    assert result.returncode == 1 and "run 42 is not in" in result.stderr


def predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", "predict", *args],
                          capture_output=True, text=True, timeout=180)


def test_predict_any_model_for_a_gpu_from_this_machine():
    result = predict("--model", "tiny-vit", "--device", "cuda", "--gpu-model", "NVIDIA H200",
                     "--lora-rank", "4", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device"] == "cuda" and data["gpu"] == "NVIDIA H200"
    assert data["trainable_parameters"] < data["parameters"]
    assert data["nvml_peak"] == data["context"] + data["peak_reserved"] + data["outside"]
    assert data["components"]["peak"] <= data["peak_reserved"]
    assert data["fit"]["fits"] and data["fit"]["limit"] is None  # a tiny ViT on an H200
    assert data["nvml_high"] is None or data["nvml_high"] > data["nvml_peak"]


def test_predict_the_largest_batch_size():
    result = predict("--model", "tiny-gpt2", "--seq-len", "16", "--device", "cuda",
                     "--max-batch-size", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # a tiny model fills no GPU: the search stops at the option's limit, and says so
    assert data["max_batch_size"] == data["limit"] == 4096 and data["at_limit"]
    assert data["peak"] <= data["capacity"]
    assert data["decided_by"] is None  # no limit met below the option's
    words = predict("--model", "tiny-gpt2", "--seq-len", "16", "--device", "cuda",
                    "--max-batch-size")
    assert words.stdout.startswith("largest batch size predicted to fit NVIDIA H200")
    assert ": ≥ 4096 (peak" in words.stdout


def test_predict_a_token_classifier_prints_its_task_and_its_per_token_labels(token_classifier):
    """A published NER model (shrunk: tests/conftest.py) was refused as a head anatomy did not
    train. (Its prediction is the CPU run's: tests/e2e/test_families.py.)"""
    result = predict("--model", token_classifier, "--seq-len", "32", "--batch-size", "2",
                     "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "bert-ner (166,089 parameters, token classification), batch size 2, sequence length 32, "
        "one of 9 labels per token, fp32, adamw_torch\n")
    need, fit = result.stdout.splitlines()[-2:]
    assert "this run should need about" in need and fit.startswith("fits this machine's RAM")


def test_a_bad_model_is_one_line_and_starts_nothing(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 66, "num_attention_heads": 4}')
    for result in (anatomy("run", "--model", str(tmp_path), store=tmp_path / "s.sqlite"),
                   predict("--model", str(tmp_path))):
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"error: model: {tmp_path.name}: hidden size 66 is not divisible by the 4 attention "
            "heads"]
    assert json.loads(anatomy("runs", "--json", store=tmp_path / "s.sqlite").stdout) == []


def test_a_config_its_config_class_refuses_is_one_line_and_starts_nothing(tmp_path):
    """What only transformers' config class knows (a field's type): refused by `run` before a run
    is stored, as `predict` refuses it."""
    config = json.loads((PROJECT / "anatomy/analysis/configs/tiny-llama.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rms_norm_eps": "x"}))
    refusal = (f"model: {tmp_path.name}: transformers refuses the config: Validation error "
               "for field 'rms_norm_eps': TypeError: Field 'rms_norm_eps' expected float, got str "
               "(value: 'x')")
    for result in (anatomy("run", "--model", str(tmp_path), store=tmp_path / "s.sqlite"),
                   predict("--model", str(tmp_path))):
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"error: {refusal}"]
    # `run` had a child interpreter judge it (the CLI loads no torch), and kept its verdict in
    # the cache folder: the next `run` of the same config reads it, with no child of ~4 CPU s.
    kept = json.loads((Path(os.environ["ANATOMY_CACHE"]) / "config-checks.json").read_text())
    assert refusal in kept.values()
    again = anatomy("run", "--model", str(tmp_path), store=tmp_path / "s.sqlite")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [f"error: {refusal}"]
    assert json.loads(anatomy("runs", "--json", store=tmp_path / "s.sqlite").stdout) == []


def test_a_sweep_from_the_prediction_runs_that_size_and_the_next():
    from anatomy.analysis.machine import Machine
    from anatomy.analysis.options import RunOptions
    from anatomy.cli.sweep import _predicted_ladder
    from anatomy.prediction import CPU_PROCESS

    ram = CPU_PROCESS.share(64 * 2**20) + 64 * 2**20  # 64 MiB of tensors beside the process
    small = Machine(backend="cpu-rss", memory_api="rss", devices=(), driver=None,
                    cuda_driver=None, ram_total=ram, why_no_gpu="x")
    vary, said = _predicted_ladder(RunOptions(model="tiny-gpt2", seq_len=64), small)
    first, second = vary["batch_size"]
    assert second == first + 1 and first >= 2
    assert said == f"predicted to fit: batch size {first}; confirming with {first} and {second}"


def test_predict_refuses_a_gpu_model_without_constants_naming_those_calibrated():
    result = subprocess.run([sys.executable, "-m", "anatomy", "predict", "--gpu-model", "nope"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "'nope'" in result.stderr
    assert "'NVIDIA H200'" in result.stderr  # the calibrated models, by name


def test_measuring_without_a_gpu_is_one_line():
    """The measurement's child on a machine without CUDA: WorkspaceError in one line, no
    traceback of the child's."""
    import psutil

    from anatomy.prediction.workspaces import WorkspaceError, layer_key, measure

    key = layer_key((0, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "float32")
    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(WorkspaceError) as raised:
        measure([key], [2, 3])
    assert str(raised.value) == \
        "measuring the convolutions on the GPU failed: no CUDA GPU here"
    # the child gone, none left behind (other tests' in this worker may still be ending)
    assert set(psutil.Process().children(recursive=True)) <= before


@pytest.mark.parametrize("request_text", ["", "[]", '{"keys": 5, "batches": [2]}'])
def test_the_measuring_child_run_by_hand_refuses_a_bad_request_in_a_line(request_text):
    """`python -m anatomy.prediction.workspaces` is the measurement's child; run by
    hand with what it cannot read, it says what it expects, no traceback."""
    done = subprocess.run([sys.executable, "-m", "anatomy.prediction.workspaces"],
                          input=request_text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "expects on standard input" in done.stderr


def test_from_prediction_where_the_workspaces_cannot_be_measured_keeps_the_margins_answer(
        fresh_nvml, tmp_path, capsys):
    """`sweep --from-prediction` on a GPU measures a run's convolutions' cuDNN workspaces on it
    first; where they cannot be (here NVML says an H200, CUDA has none), it says why in a line
    and confirms the margin's answer instead, as `predict --max-batch-size` gives it."""
    from anatomy.analysis.options import RunOptions
    from anatomy.cli.sweep import _predicted_ladder
    from anatomy.engine import nvml
    from anatomy.prediction import max_batch_size
    from tests.fake_nvml import FakePynvml

    nvml._lib = FakePynvml(gpus=1)
    info = machine()
    path = resnet_config(tmp_path, width=32, image_size=512)
    base = RunOptions(model=str(path), gpu=0)
    vary, said = _predicted_ladder(base, info)
    err = capsys.readouterr().err
    assert "measuring" in err and "convolution workspaces not measured (measuring the " \
        "convolutions on the GPU failed: no CUDA GPU here): the margin's answer" in err
    gpu = info.devices[0]
    margin = max_batch_size(base, device="cuda", total=gpu.total, gpu_name=gpu.name)
    assert 2 < margin.batch_size < 4096  # neither end of the search
    assert vary == {"batch_size": [margin.batch_size, margin.batch_size + 1]}
    assert "measured" not in said and str(margin.batch_size) in said


def test_from_prediction_at_the_batch_size_limit_confirms_that_one_alone():
    """A model so small that the search reaches the option's limit: `--from-prediction` runs
    that size alone and says so, not "and" a size the option refuses."""
    from anatomy.analysis.options import RunOptions
    from anatomy.cli.sweep import _predicted_ladder

    vary, said = _predicted_ladder(RunOptions(preset="tiny", seq_len=8, max_steps=1), machine())
    assert vary == {"batch_size": [4096]}
    assert said == "predicted to fit: batch size ≥ 4096 (the option's limit); confirming 4096"


def test_from_prediction_does_not_measure_on_a_gpu_a_run_holds(fresh_nvml, tmp_path, capsys):
    """The measurement takes GPUs of memory: while a run holds the GPU's device lock it is
    refused in a line (the margin's answer confirmed instead) and no measuring child starts."""
    import psutil

    from anatomy.analysis.options import RunOptions
    from anatomy.cli.sweep import _predicted_ladder
    from anatomy.engine import nvml
    from anatomy.engine.locks import DeviceLock
    from tests.fake_nvml import FakePynvml

    nvml._lib = FakePynvml(gpus=1)
    path = resnet_config(tmp_path, image_size=64)
    held = DeviceLock("gpu0")
    assert held.acquire("run 7 by pid 4242")
    before = set(psutil.Process().children(recursive=True))
    try:
        vary, said = _predicted_ladder(RunOptions(model=str(path), gpu=0), machine())
        assert set(psutil.Process().children(recursive=True)) <= before  # no child started
    finally:
        held.release()
    err = capsys.readouterr().err
    assert "convolution workspaces not measured (GPU 0 is busy: run 7 by pid 4242): the " \
        "margin's answer" in err
    assert "measuring" not in err and vary["batch_size"]


def test_a_run_started_with_its_standard_error_closed_completes(tmp_path):
    """`anatomy run 2>&-` (a daemon's closed descriptor: Python's sys.stderr is None) stopped
    the run as it began, exit status 1, and said nothing: the progress asked None isatty()."""
    store = tmp_path / "runs.sqlite"
    result = subprocess.run(["sh", "-c", 'exec "$0" -m anatomy "$@" 2>&-', sys.executable, "run",
                             *flags(TINY), "--store", str(store)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout
    assert "status: completed" in result.stdout.splitlines()[-1]
