"""`anatomy watch` refusals, before anything starts: a GPU another run holds (fake NVML: the
GPUs), an empty --gpus entry."""

from __future__ import annotations

import sys

import pytest

from anatomy.engine import nvml
from anatomy.engine.devices import machine
from anatomy.engine.locks import LOCK_DIR_ENV, DeviceLock
from anatomy.engine.watch import WatchRefused, choose_devices, watch
from tests.fake_nvml import FakePynvml


def test_a_gpu_another_run_holds_is_refused_and_nothing_is_recorded(store, fresh_nvml,
                                                                     monkeypatch, tmp_path):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml._lib = FakePynvml(gpus=2)
    busy = DeviceLock("gpu1")
    assert busy.acquire("run 5 (pid 123)")
    with pytest.raises(WatchRefused, match=r"GPU 1 is busy: run 5 \(pid 123\)"):
        watch([sys.executable, "-c", "pass"], store, machine())
    assert store.runs() == []
    assert DeviceLock("gpu0").acquire("free")  # GPU 0's lock was given back


@pytest.mark.parametrize("gpus", [",,", "0,,1", "x", "²", "٣", "0,²"])
def test_gpus_that_name_no_visible_gpu_are_refused(fresh_nvml, monkeypatch, gpus):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml._lib = FakePynvml(gpus=2)
    with pytest.raises(WatchRefused, match="is not a visible GPU"):
        choose_devices(machine(), gpus)


def test_a_file_that_is_no_command_is_refused_saying_how_to_run_it(store, tmp_path,
                                                                   monkeypatch):
    """`anatomy watch train.py`: the shell would not run it either; the refusal says how to
    (its interpreter first), not "no such command", where the file is right there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('trained')\n")
    (tmp_path / "train.sh").write_text("echo trained\n")
    said = {}
    for program in ("train.py", "train.sh", "no-such-command-anywhere"):
        with pytest.raises(WatchRefused) as refused:
            watch([program], store, machine())
        said[program] = str(refused.value)
    assert said == {
        "train.py": "cannot run 'train.py': a Python script, not a command: run it as python "
                    "train.py",
        "train.sh": "cannot run 'train.sh': a file that is not executable: make it so "
                    "(chmod +x), or run its interpreter",
        "no-such-command-anywhere": "cannot run 'no-such-command-anywhere': no such command or "
                                    "not executable"}
    assert store.runs() == []
