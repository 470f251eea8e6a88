"""The real worker end to end on this CPU (tiny preset), and its failure paths: oom, crash, stop."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from dataclasses import replace

import psutil
import pytest

from anatomy.analysis.options import InvalidOptions
from anatomy.analysis.report import report
from anatomy.engine.callbacks import INJECT_ENV
from anatomy.engine.manager import DeviceBusy, DeviceLock, device_key, machine
from anatomy.store import PHASES
from tests.conftest import PROJECT, TINY
from tests.e2e.conftest import HANG_SECONDS, trainer_folders
from tests.helpers import alive, wait_until


def _wait_for_phase(store, run_id: int, name: str, timeout: float = 180) -> None:
    wait_until(lambda: any(p.name == name for p in store.phases(run_id)), timeout,
               f"run {run_id}'s phase {name} to begin")


def test_tiny_run_records_every_phase_in_order(recorded, tiny):
    store, run_id = recorded(tiny)
    rep = report(store, run_id)
    assert rep.status == "completed", rep.error
    phases = rep.phases
    assert [p.name for p in phases] == list(PHASES)
    edges = [t for p in phases for t in (p.start_s, p.end_s)]
    assert edges == sorted(edges) and None not in edges
    # every phase was seen by the sampler, and memory only grew from baseline to training
    assert all(p.memory_mb is not None for p in phases)
    assert phases[0].memory_mb < phases[1].memory_mb < phases[3].memory_mb
    assert rep.backend == machine().backend  # cpu-rss here; nvml on a GPU machine
    assert rep.samples > 50
    assert rep.samples == rep.samples_sent  # nothing the sampler sent was lost
    steps = store.steps(run_id)
    assert [s.step for s in steps] == [1, 2, 3, 4]  # 16 sequences / 4 = 4 steps
    assert all(s.loss is not None for s in steps)
    summary = rep.summary
    assert summary.time_s > 0 and summary.samples_per_second > 0
    assert summary.peak_mb >= phases[3].memory_mb
    env = rep.environment
    assert env.torch and env.transformers and env.parameters == 4_386_178
    assert rep.parameters == env.parameters
    # the arguments say eval_strategy "no" (nothing is evaluated): transformers warns nothing
    assert not any("eval_strategy" in m.text for m in rep.messages)
    parts = rep.components  # measured on the CPU from tensor sizes and saved tensors
    assert parts.weights == parts.gradients == 4 * env.parameters
    assert parts.optimizer_states == 8 * env.parameters  # AdamW: two fp32 moments
    assert parts.activations > 0
    assert rep.operations is None  # not asked for
    assert rep.profiling is None
    # The device panel's readings, taken by the same sampler every 0.5 s from start to end.
    hosts = store.host_status(run_id)
    assert len(hosts) >= 2 and all(0 < h.ram_used < h.ram_total for h in hosts)
    assert hosts[-1].t - hosts[0].t >= phases[3].start_s - phases[0].end_s


def test_profiled_run_stores_operation_classes(manager, store, tiny):
    run_id = manager.start(replace(tiny, max_steps=2, profile_steps=1))
    assert manager.wait(run_id, timeout=120) == "completed"
    rep = report(store, run_id)
    classes = rep.operations.classes
    assert classes["tensor contraction"].flops > classes["element-wise"].flops > 0
    # The profiler's steps are marked after training, and the run's peak leaves them out.
    assert rep.profiling.done and rep.profiling.start_s >= rep.training.end_s
    before = [s.used for s in store.samples(run_id) if s.t < rep.profiling.start_s]
    assert rep.summary.peak_bytes == max(before)


def test_out_of_memory_keeps_the_error_the_peak_and_the_samples(manager, store, monkeypatch,
                                                                tiny):
    monkeypatch.setenv(INJECT_ENV, "oom@2")  # on a CPU the failure is injected; the GPU test is real
    run_id = manager.start(tiny)
    assert manager.wait(run_id, timeout=120) == "oom"
    rep = report(store, run_id)
    assert "out of memory" in rep.error
    assert rep.summary.peak_mb > 0
    assert rep.samples == rep.samples_sent > 0
    assert [s.step for s in store.steps(run_id)] == [1, 2]
    assert rep.phases[-1].name == "training" and rep.phases[-1].end_s is not None
    assert not manager.is_active(run_id)
    lock = DeviceLock(device_key(tiny, machine()))  # the device is free again
    assert lock.acquire("test"), lock.holder()
    lock.release()


def test_a_crashed_worker_fails_and_keeps_what_it_recorded(manager, store, monkeypatch, tiny):
    monkeypatch.setenv(INJECT_ENV, "crash@3")
    run_id = manager.start(tiny)
    assert manager.wait(run_id, timeout=120) == "failed"
    rep = report(store, run_id)
    assert "exit code 9" in rep.error
    assert rep.samples == rep.samples_sent > 0
    assert [p.name for p in rep.phases] == list(PHASES)
    assert rep.phases[-1].end_s is not None  # closed at the last sample
    assert len(store.steps(run_id)) >= 2


def test_a_second_run_on_a_busy_device_is_refused_and_stop_ends_the_whole_tree(manager, store,
                                                                              tiny):
    run_id = manager.start(replace(tiny, max_steps=100_000))
    # One run holds the device: a second start there is refused and records nothing.
    held = rf"is busy: run {run_id} of {re.escape(str(store.path))} \(pid {os.getpid()}\)"
    with pytest.raises(DeviceBusy, match=held):
        manager.start(tiny)
    assert len(store.runs()) == 1
    _wait_for_phase(store, run_id, "training")
    worker_pid = store.run(run_id).worker_pid
    tree = [psutil.Process(worker_pid), *psutil.Process(worker_pid).children(recursive=True)]
    started = time.monotonic()
    manager.stop(run_id)
    assert time.monotonic() - started < HANG_SECONDS  # it returns: a hang, not a speed
    assert not any(alive(p) for p in tree)
    rep = report(store, run_id)
    assert rep.status == "stopped"
    assert rep.samples == rep.samples_sent > 0
    assert not manager.is_active(run_id)



@pytest.mark.parametrize("ending", ["killed", "stopped"])
def test_the_trainers_output_folder_goes_however_the_worker_ends(manager, store, tiny, tmp_path,
                                                                  monkeypatch, ending):
    """The Trainer's output folder (it saves nothing there) is removed when the run ends,
    though its worker ends by a SIGKILL (as the kernel's OOM killer ends it) or by Stop and
    never cleans up after itself: hundreds of empty anatomy-* folders were left in /tmp."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # the worker's, and ours read again:
    monkeypatch.setattr(tempfile, "tempdir", None)
    run_id = manager.start(replace(tiny, max_steps=100_000))
    _wait_for_phase(store, run_id, "training")
    assert len(trainer_folders(temporary)) == 1
    if ending == "killed":
        os.kill(store.run(run_id).worker_pid, signal.SIGKILL)
        assert manager.wait(run_id, timeout=60) == "failed"
    else:
        manager.stop(run_id)
        assert report(store, run_id).status == "stopped"
    assert trainer_folders(temporary) == []


def test_a_script_without_a_main_guard_can_start_runs(tmp_path):
    """Spawned children do not re-run the caller's script (nor import Streamlit under it)."""
    import subprocess
    import sys

    script = tmp_path / "plain.py"
    script.write_text(
        "from anatomy.analysis.options import RunOptions\n"
        "from anatomy.engine.manager import RunManager\n"
        "from anatomy.store import Store\n"
        f"manager = RunManager(Store({str(tmp_path / 'plain.sqlite')!r}))\n"
        f"run_id = manager.start(RunOptions(**{TINY.to_dict()!r}))\n"
        "print('status', manager.wait(run_id, 120))\n"
        "import sys\n"
        "print('torch loaded here:', 'torch' in sys.modules)\n")
    project = str(PROJECT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=180, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, (project, os.environ.get("PYTHONPATH"))))})
    assert result.stdout.count("status") == 1, result.stderr
    assert "status completed" in result.stdout
    # Nothing the worker sends makes its reader load torch (a TorchVersion would).
    assert "torch loaded here: False" in result.stdout


def test_a_config_the_model_cannot_take_fails_the_run_in_one_line_naming_why(
        manager, store, tmp_path):
    """What only the model's code finds (a layer it cannot make): the run fails with that one
    line, not a traceback."""
    config = json.loads((PROJECT / "anatomy/analysis/configs/tiny-llama.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "hidden_act": "no-such-activation"}))
    run_id = manager.start(replace(TINY, model=str(path)))
    assert manager.wait(run_id, timeout=180) == "failed"
    error = report(store, run_id).error
    assert "\n" not in error.strip() and "LlamaMLP.__init__: 'no-such-activation'" in error


def test_a_config_its_config_class_refuses_starts_nothing(manager, store, tmp_path):
    """The config class's own refusal is known before the run: one line, nothing stored, and
    the caller's process still without torch (a child interpreter built the config class)."""
    import sys

    config = json.loads((PROJECT / "anatomy/analysis/configs/tiny-llama.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "rms_norm_eps": "x"}))
    loaded, before = "transformers" in sys.modules, len(store.runs())
    with pytest.raises(InvalidOptions) as refused:
        manager.start(replace(TINY, model=str(path)))
    message = refused.value.errors["model"]
    assert "\n" not in message
    assert "'rms_norm_eps': TypeError: Field 'rms_norm_eps' expected float" in message
    assert len(store.runs()) == before
    assert ("transformers" in sys.modules) == loaded
