"""The prediction's front door: one resolver of the device a prediction is for, one entry that
answers a request part by part, and a GPU's calibration as a value the caches key on."""

from __future__ import annotations

import dataclasses
import json

import pytest

from anatomy.analysis.machine import Device, Machine
from anatomy.analysis.options import RunOptions
from anatomy.prediction import Request, Target, answer, device_constants, memory, target
from anatomy.prediction.limits import judge

GIB = 2**30


def _machine(*gpus: tuple[str, int]) -> Machine:
    devices = tuple(Device(index=i, nvml_index=i, name=name, uuid=None, total=total,
                           memory_api="v2") for i, (name, total) in enumerate(gpus))
    return Machine(backend="nvml" if gpus else "cpu-rss", memory_api="v2" if gpus else "none",
                   devices=devices, driver=None, cuda_driver=None, ram_total=24 * GIB,
                   why_no_gpu=None if gpus else "no NVIDIA driver here")


H200 = device_constants.load("NVIDIA H200")


def test_the_device_is_this_machines_gpu_else_its_ram():
    assert target(_machine()) == Target("cpu", None, 24 * GIB)
    two = _machine(("NVIDIA H200", 140 * GIB), ("NVIDIA L4", 22 * GIB))
    assert target(two) == Target("cuda", "NVIDIA H200", 140 * GIB)
    # the run's GPU, with its own memory; an uncalibrated one keeps its name (DEFAULT's constants)
    assert target(two, 1) == Target("cuda", "NVIDIA L4", 22 * GIB)
    assert target(two, device="cpu") == Target("cpu", None, 24 * GIB)


def test_a_gpu_model_named_is_that_gpus_prediction_with_its_calibrated_memory():
    assert target(_machine(), gpu_model="NVIDIA H200") == \
        Target("cuda", "NVIDIA H200", H200.total_bytes)
    # named on a machine with another GPU: the named one's memory, not this machine's
    assert target(_machine(("NVIDIA L4", 22 * GIB)), gpu_model="NVIDIA H200") == \
        Target("cuda", "NVIDIA H200", H200.total_bytes)
    # named and here: this machine's memory of it
    assert target(_machine(("NVIDIA H200", 141 * GIB)), gpu_model="NVIDIA H200") == \
        Target("cuda", "NVIDIA H200", 141 * GIB)
    # CUDA asked for on a machine without a GPU: the default calibration's GPU
    assert target(_machine(), device="cuda") == \
        Target("cuda", device_constants.DEFAULT.device, device_constants.DEFAULT.total_bytes)


def test_only_a_gpu_bounds_the_allocators_reserve():
    assert Target("cuda", "NVIDIA H200", 140 * GIB).bound == 140 * GIB
    assert Target("cpu", None, 24 * GIB).bound is None


def test_the_entry_answers_as_its_parts_do():
    options = RunOptions(model="tiny-llama", seq_len=16, batch_size=2)
    aimed = target(_machine())
    said = answer(Request(options, aimed))
    assert said.data is None and said.ranks is None
    assert said.alone.to_dict() == memory.predict(options, device="cpu").to_dict()
    assert said.verdict == judge(options, device="cpu", total=24 * GIB)
    assert said.largest_batch().batch_size == \
        memory.max_batch_size(options, device="cpu", total=24 * GIB).batch_size


def test_a_cpu_run_started_by_a_larger_front_is_given_the_ram_that_front_leaves():
    """A CPU run shares the RAM (a container's limit) with the process that starts it: the CLI's
    front is measured into the companions; the dashboard's own memory (its Streamlit server
    peaked at 369 MiB during a run from its form, the CLI's at 53) is told, and the capacity,
    the verdict and the largest batch size leave it out. Seen: in a 1.2 GiB container the form's
    What fits? gave the CLI's answer."""
    small = dataclasses.replace(_machine(), ram_total=int(1.2 * GIB))
    options = RunOptions(model="tiny", seq_len=256, batch_size=32)
    cli, dashboard = target(small), target(small, front=369 * 2**20)
    assert (cli.front, dashboard.front) == (None, 369 * 2**20)
    assert target(_machine(("NVIDIA H200", 140 * GIB)), front=369 * 2**20).front is None
    process = memory.CPU_PROCESS
    left_out = 369 * 2**20 - process.front_bytes  # beyond the CLI's front, measured
    fits = {aimed.front: answer(Request(options, aimed)).largest_batch() for aimed in (cli, dashboard)}
    assert fits[None].capacity - fits[dashboard.front].capacity == pytest.approx(
        left_out / (1 + process.tensor_fraction), abs=1)
    assert fits[dashboard.front].batch_size < fits[None].batch_size
    assert fits[dashboard.front].peak_at_may_fit <= fits[dashboard.front].capacity
    verdicts = [answer(Request(options, aimed)).verdict for aimed in (cli, dashboard)]
    assert verdicts[0].capacity - verdicts[1].capacity == fits[None].capacity - \
        fits[dashboard.front].capacity
    # a front smaller than the CLI's measured one keeps the measured one
    assert process.capacity(GIB, front=1) == process.capacity(GIB)
    # The dashboard's before its first forecast has loaded torch (137 MiB, seen) is not what
    # it holds once the forecast has traced: a run at the size that allowed was killed.
    assert process.dashboard_front(137 * 2**20) == process.dashboard_bytes > 300 * 2**20
    assert process.dashboard_front(None) == process.dashboard_bytes
    assert process.dashboard_front(2 * GIB) == 2 * GIB


def test_several_processes_are_answered_rank_by_rank_without_a_verdict_of_one():
    options = RunOptions(model="tiny-llama", seq_len=16, batch_size=2, processes=2)
    said = answer(Request(options, target(_machine())))
    assert said.verdict is None
    assert said.ranks.to_dict() == memory.predict_ranks(options, device="cpu").to_dict()


def test_a_calibration_is_a_hashable_value():
    again = device_constants.load("NVIDIA H200")
    assert again == H200 and hash(again) == hash(H200)
    made = dataclasses.replace(device_constants.DEFAULT, sdpa_backends={"x": "math"},
                               calibration_set=["a"])
    assert hash(made) == hash(dataclasses.replace(made))
    assert made.sdpa_backends == {"x": "math"} and made.calibration_set == ("a",)
    with pytest.raises(TypeError):
        made.sdpa_backends["x"] = "flash"  # read-only: a value cannot change under a cache
    # the file it was read from is what it writes
    path = device_constants.CALIBRATION_DIR / "nvidia-h200.json"
    assert json.dumps(H200.to_dict(), indent=2, sort_keys=True) + "\n" == path.read_text()


def test_the_recordings_cache_takes_an_equal_calibration_for_the_same():
    options = RunOptions(model="tiny-llama", seq_len=16, batch_size=2)
    memory.recording_for(options, "cuda", H200)
    hits = memory._cached_recording.cache_info().hits
    memory.recording_for(options, "cuda", device_constants.load("NVIDIA H200"))
    assert memory._cached_recording.cache_info().hits == hits + 1


def test_the_anatomy_page_asks_the_entry_as_predict_and_the_form_do(store, seed, monkeypatch):
    """A stored run's prediction (the Anatomy page's, `run`'s predicted peak) is the entry's
    answer for the run's options on the device it ran on: one path, not calls of its own."""
    from anatomy.analysis.report import report
    from anatomy.prediction import breakdown, ran_on, request

    asked, made = [], request.Answer.__init__

    def heard(self, said: Request) -> None:
        asked.append(said)
        made(self, said)

    monkeypatch.setattr(request.Answer, "__init__", heard)
    rep = report(store, seed(backend="cpu-rss"))
    rep = dataclasses.replace(rep, ran_with=RunOptions(model="tiny", seq_len=32, max_steps=8))
    prediction = breakdown.predicted(rep)
    assert asked == [Request(rep.options, ran_on(rep))]
    assert prediction == answer(Request(rep.options, ran_on(rep))).alone
