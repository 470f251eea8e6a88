"""One parser of CUDA_VISIBLE_DEVICES decides which GPUs a run may use, before anything starts."""

from __future__ import annotations

import psutil
import pytest

from anatomy.analysis.options import InvalidOptions, RunOptions
from anatomy.cli import main
from anatomy.engine import nvml
from anatomy.engine.devices import machine, visible_indices
from anatomy.engine.manager import RunManager
from tests.fake_nvml import FakePynvml

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
    ("1,²", [1]),                  # "²" is a digit to str.isdigit(), none to int() or CUDA
    ("٣", []),                     # nor is "٣", which int() reads as 3
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
