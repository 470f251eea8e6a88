"""The NVML wrapper, with NVML's answers faked at its one boundary (the pynvml module)."""

from __future__ import annotations

import pynvml
import pytest

from anatomy.engine import devices, nvml
from tests.fake_nvml import GIB, FakePynvml


@pytest.fixture
def fake(fresh_nvml):
    def install(**kwargs) -> FakePynvml:
        nvml._lib = FakePynvml(**kwargs)
        nvml.reset()
        return nvml._lib
    return install


def test_v2_driver_separates_reserved_memory(fake):
    fake(used=3 * GIB, reserved=615 * 2**20)
    reading = nvml.memory(0)
    assert reading == nvml.Memory(used=3 * GIB, total=141 * GIB, reserved=615 * 2**20, api="v2")


def test_v1_only_driver_falls_back_and_says_so(fake):
    fake(v2=False, used=3 * GIB, reserved=615 * 2**20)
    reading = nvml.memory(0)
    assert reading.api == "v1"
    assert reading.reserved is None
    assert reading.used == 3 * GIB + 615 * 2**20  # v1 `used` counts the reservation


def test_bindings_without_v2_use_v1(fake):
    fake(bindings_have_v2=False)
    assert nvml.memory(0).api == "v1"


def test_not_supported_fields_become_none(fake):
    fake(utilization=False)
    assert nvml.utilization(0) is None
    info = nvml.device_info(0)
    assert info.uuid is None  # the fake's UUID call is not supported
    assert info.name == "NVIDIA H200"
    assert info.memory_api == "v2"


def test_supported_utilisation_and_driver(fake):
    fake()
    assert nvml.utilization(0) == 37
    assert nvml.driver_version() == "580.159.04"
    assert nvml.cuda_driver_version() == "13.0"


def test_missing_device_is_none_not_an_error(fake):
    fake(gpus=1)
    assert nvml.memory(5) is None
    assert nvml.device_info(5) is None


def test_no_driver_is_a_message_not_an_exception(fake):
    fake(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert not nvml.available()
    assert nvml.device_count() == 0
    assert nvml.memory(0) is None
    assert nvml.status() == "the NVIDIA driver is not loaded"
    assert "Driver Not Loaded" in nvml.error()


def test_no_package_is_a_message(fresh_nvml):
    nvml._lib = None
    nvml.reset()
    assert not nvml.available()
    assert "nvidia-ml-py" in nvml.status()


def test_machine_reports_nvml_backend_from_the_wrapper(fake, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake(gpus=2, v2=False)
    info = devices.machine()
    assert info.backend == "nvml"
    assert info.memory_api == "v1"
    assert info.gpu_count == 2
    assert info.devices[1].name == "NVIDIA H200"


def test_machine_without_nvml_measures_cpu_rss(fake):
    fake(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    info = devices.machine()
    assert info.backend == "cpu-rss"
    assert info.gpu_count == 0
    assert info.why_no_gpu == "no NVIDIA driver here"
    assert info.nvml_error == "NVML: NVML Shared Library Not Found"


def test_visible_index_follows_cuda_visible_devices():
    uuids = [None] * 4
    assert devices.visible_indices("3,1", uuids) == [3, 1]  # torch's 0 is NVML's 3
    assert devices.visible_indices(None, uuids) == [0, 1, 2, 3]  # unset: every GPU
    assert devices.visible_indices("", uuids) == []  # empty: none


def test_machine_keeps_the_visible_gpus_in_torchs_order(fake):
    fake(gpus=4)
    info = devices.machine({"CUDA_VISIBLE_DEVICES": "3,1"})
    assert [(d.index, d.nvml_index) for d in info.devices] == [(0, 3), (1, 1)]
    hidden = devices.machine({"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.backend == "cpu-rss" and "leaves no GPU visible" in hidden.why_no_gpu


def test_power_temperature_and_every_process_on_the_gpu(fake):
    fake(processes={4242: 3 * GIB, 777: None, 31: 2**20})
    assert nvml.power(0) == 412.345 and nvml.power_limit(0) == 700.0
    assert nvml.temperature(0) == 54
    assert nvml.processes(0) == [nvml.ProcessUse(4242, 3 * GIB), nvml.ProcessUse(777, None),
                                 nvml.ProcessUse(31, 2**20)]  # None: the driver does not say


def test_a_gpu_without_sensors_answers_none(fake):
    fake(sensors=False)
    assert nvml.power(0) is None and nvml.power_limit(0) is None
    assert nvml.temperature(0) is None and nvml.processes(0) is None
    assert nvml.power(7) is None and nvml.processes(7) is None  # no such GPU: None too


def test_no_driver_answers_none_for_the_panel_too(fake):
    fake(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert (nvml.power(0), nvml.temperature(0), nvml.processes(0)) == (None, None, None)
