"""The typed spine: `show --json` is unchanged, a sweep holds its device, and one parser of
CUDA_VISIBLE_DEVICES decides which GPUs a run may use — before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from anatomy.analysis.options import InvalidOptions, RunOptions
from anatomy.cli import main
from anatomy.engine import nvml
from anatomy.engine.devices import machine, visible_indices
from anatomy.engine.manager import RunManager
from anatomy.engine.sweep import Sweep
from anatomy.store import Message, PhaseMark, Sample, Step, Store
from tests.fake_nvml import FakePynvml

PROJECT = Path(__file__).resolve().parent.parent
SHOWN = sorted(p for p in (PROJECT / "docs" / "data").glob("h200-*.json") if "sweep" not in p.name)
DERIVED = ("context", "non_torch", "peak")  # computed from the samples when a run is read


def _store_as_shown(store: Store, shown: dict) -> int:
    """A store holding the run `shown` describes: its options, environment, phases, messages and
    stored summary, with samples that give each phase's memory and the peak it shows."""
    run_id = store.create_run(shown["options"], shown["backend"], shown["memory_api"],
                              shown["gpu"], shown["environment"], name=shown["name"],
                              sweep=shown["sweep"])
    summary = {k: v for k, v in shown["summary"].items()
               if k not in ("peak_mb", "peak_bytes", "memory_mb")}
    if shown["components"] is not None:
        summary["components"] = {k: v for k, v in shown["components"].items()
                                 if k not in DERIVED}
    if shown["operations"] is not None:
        summary["operations"] = shown["operations"]
    store.update_run(run_id, created_at=shown["created_at"], ended_at=shown["ended_at"],
                     status=shown["status"], error=shown["error"], summary=summary,
                     samples_sent=shown["samples_sent"])
    store.set_tags(run_id, shown["tags"])
    gpu, phases = shown["gpu"], shown["phases"]
    marks, samples = [], []
    for phase in phases:
        marks.append(PhaseMark("start", phase["name"], phase["start_s"]))
        marks.append(PhaseMark("end", phase["name"], phase["end_s"]))
        samples.append(Sample(phase["end_s"], gpu, phase["memory_bytes"], None, None, None))
    last = phases[-1]["end_s"]
    samples.append(Sample(last + 0.5, gpu, shown["summary"]["peak_bytes"], None, None, None))
    samples += [Sample(last + 1 + i / 1e4, gpu, 0, None, None, None)
                for i in range(shown["samples"] - len(samples))]
    steps = [Step(last, k, shown["steps"], None, None, None) for k in range(shown["steps"])]
    messages = [Message(m["t"], m["level"], m["text"]) for m in shown["messages"]]
    store.write(run_id, samples=samples, phases=marks, steps=steps, messages=messages)
    return run_id


@pytest.mark.parametrize("path", SHOWN, ids=lambda p: p.name)
def test_show_json_prints_the_h200_runs_byte_for_byte_as_before(path, store, capsys):
    expected = path.read_text()
    shown = json.loads(expected)
    run_id = _store_as_shown(store, shown)
    assert main(["show", str(run_id), "--json", "--store", str(store.path)]) == 0
    printed = capsys.readouterr().out
    assert printed.replace(f'"id": {run_id},', f'"id": {shown["id"]},', 1) == expected


# --- CUDA_VISIBLE_DEVICES: one parser ---

UUIDS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222", "GPU-dddd-3333"]


@pytest.mark.parametrize("value, expected", [
    (None, [0, 1, 2, 3]),          # unset: every GPU
    ("", []),                      # empty: none
    ("0,1", [0, 1]),
    ("2, 0", [2, 0]),              # torch's cuda:0 is NVML's 2
    ("1,7,2", [1]),                # CUDA stops at the first entry that names no GPU
    ("1,1", [1]),                  # ... and at a GPU named twice
    ("GPU-cccc-2222,0", [2, 0]),   # by UUID
    ("dddd", [3]),                 # by a unique prefix, without "GPU-"
    ("GPU-", []),                  # a prefix of every UUID names none
])
def test_visible_devices_are_read_as_cuda_reads_them(value, expected):
    assert visible_indices(value, UUIDS) == expected


def test_a_gpu_hidden_by_cuda_visible_devices_is_refused_before_anything_starts(
        store, fresh_nvml, monkeypatch, capsys):
    nvml._lib = FakePynvml(gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [d.nvml_index for d in machine().devices] == [0, 1]
    before = psutil.Process().children(recursive=True)
    with pytest.raises(InvalidOptions, match="gpu: 3 is out of range: 0 to 1"):
        RunManager(store).start(RunOptions(preset="tiny", gpu=3))
    assert main(["run", "--gpu", "3", "--store", str(store.path)]) == 2
    assert "gpu: 3 is out of range: 0 to 1" in capsys.readouterr().err
    assert store.runs() == []  # nothing recorded
    assert psutil.Process().children(recursive=True) == before  # and no sampler, no worker


def test_a_run_on_a_visible_gpu_trains_on_that_gpu_by_its_uuid(fresh_nvml, monkeypatch):
    fake = FakePynvml(gpus=4)
    fake.nvmlDeviceGetUUID = lambda handle: UUIDS[handle]
    nvml._lib = fake
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    device = machine().devices[1]
    assert (device.index, device.nvml_index, device.uuid) == (1, 3, UUIDS[3])


# --- a sweep holds its device ---

def test_a_cpu_sweep_keeps_going_while_a_cli_run_is_refused_naming_the_sweep(store):
    manager = RunManager(store)
    base = RunOptions(preset="tiny", seq_len=32, dataset_size=16, max_steps=3)
    sweep = Sweep(manager, base, {"batch_size": [1, 2]})
    sweep_id = sweep.start()
    try:
        refusals = []
        deadline = time.monotonic() + 120
        # Ask while the first run trains and again after it ended (between two runs, too).
        while sweep.is_alive() and len(refusals) < 3 and time.monotonic() < deadline:
            result = subprocess.run(
                [sys.executable, "-m", "anatomy", "run", "--preset", "tiny", "--seq-len", "32",
                 "--dataset-size", "8", "--store", str(store.path)],
                capture_output=True, text=True, timeout=120, cwd=PROJECT,
                env={**os.environ, "PYTHONPATH": str(PROJECT)})
            if sweep.is_alive():
                refusals.append(result)
        assert refusals, "the sweep ended before a run could be refused"
        for result in refusals:
            assert result.returncode == 2, result.stderr
            assert f"busy: sweep {sweep_id}" in result.stderr
    finally:
        status = sweep.wait(timeout=180)
    assert status == "completed"
    runs = store.find_runs(sweep=sweep.key)
    assert sorted(r.status for r in runs) == ["completed", "completed"]
    assert len(store.runs()) == 2  # the refused runs recorded nothing
