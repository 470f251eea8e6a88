"""The sampler: RSS without NVML, every GPU with NVML faked at the wrapper; batching and its count."""

from __future__ import annotations

import os
import queue
import threading
import time
from multiprocessing import Value

import psutil
import pytest

from anatomy.engine import nvml, protocol, sampler
from tests.fake_nvml import GIB, FakePynvml

STATUSES: list[protocol.DeviceStatus] = []  # the device panel's readings of the last _drain


def _drain(q: queue.Queue) -> tuple[list[list[protocol.Sample]], int | None]:
    batches, done = [], None
    STATUSES.clear()
    while not q.empty():
        message = q.get()
        if isinstance(message, protocol.Samples):
            batches.append(message.samples)
        elif isinstance(message, protocol.DeviceStatus):
            STATUSES.append(message)
        elif isinstance(message, protocol.SamplerDone):
            done = message.sent
        else:
            raise AssertionError(f"the sampler sent {message!r}")
    return batches, done


def _sample_for(seconds: float, backend: str, rate: int, pid=None, gpus=(0,)):
    q: queue.Queue = queue.Queue()
    stop = threading.Event()
    t0 = time.monotonic()
    thread = threading.Thread(target=sampler.run, args=(q, stop, backend, rate, t0, gpus, pid))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(5)
    return _drain(q)


def test_rss_reader_measures_the_process_tree():
    pid = Value("i", os.getpid())
    rows = sampler.Reader("cpu-rss", worker_pid=pid).read(1.5)
    assert len(rows) == 1
    row = rows[0]
    assert (row.t, row.gpu, row.reserved, row.util) == (1.5, 0, None, None)
    own = psutil.Process().memory_info().rss
    assert own * 0.8 <= row.used  # the tree holds at least this process
    assert row.total == psutil.virtual_memory().total


def test_rss_reader_waits_for_the_worker():
    assert sampler.Reader("cpu-rss", worker_pid=Value("i", 0)).read(0.0) == []


def test_rss_sampler_batches_and_counts_what_it_sent():
    batches, done = _sample_for(0.4, "cpu-rss", 200, Value("i", os.getpid()))
    sent = sum(len(b) for b in batches)
    assert done == sent > 0
    assert len(batches) < sent  # batched, not one message a sample
    times = [row.t for batch in batches for row in batch]
    assert times == sorted(times)


def test_nvml_sampler_reads_every_gpu(fresh_nvml):
    nvml._lib = FakePynvml(gpus=2, used=5 * GIB)
    nvml.reset()
    batches, done = _sample_for(0.3, "nvml", 200, gpus=(0, 1))
    rows = [row for batch in batches for row in batch]
    assert done == len(rows)
    assert {row.gpu for row in rows} == {0, 1}
    row = rows[0]
    assert (row.used, row.reserved, row.total, row.util) == (5 * GIB, 615 * 2**20, 141 * GIB, 37)


def test_nvml_sampler_reads_only_the_gpus_it_is_given(fresh_nvml):
    nvml._lib = FakePynvml(gpus=4)
    nvml.reset()
    batches, _ = _sample_for(0.2, "nvml", 100, gpus=(3, 1))
    assert {row.gpu for batch in batches for row in batch} == {3, 1}  # NVML's indices


def test_nvml_sampler_with_v1_driver_and_no_utilisation(fresh_nvml):
    nvml._lib = FakePynvml(v2=False, utilization=False)
    nvml.reset()
    batches, _ = _sample_for(0.2, "nvml", 100)
    row = batches[0][0]
    assert row.reserved is None and row.util is None  # unknown on v1, utilisation unsupported


@pytest.mark.parametrize("rate", [1, 1000])
def test_rates_at_both_ends_of_the_range_run(rate, fresh_nvml):
    nvml._lib = FakePynvml()
    nvml.reset()
    batches, done = _sample_for(0.2, "nvml", rate)
    assert done == sum(len(b) for b in batches) >= 1



def test_a_sampler_that_fails_says_why_with_its_count(monkeypatch, fresh_nvml):
    nvml._lib = FakePynvml()
    nvml.reset()
    reads = []

    def read(self, t):
        reads.append(t)
        if len(reads) > 20:
            raise RuntimeError("NVML went away")
        return [protocol.Sample(t, 0, 1, None, None, None)]

    monkeypatch.setattr(sampler.Reader, "read", read)
    q: queue.Queue = queue.Queue()
    sampler.run(q, threading.Event(), "nvml", 1000, time.monotonic())
    messages = []
    while not q.empty():
        messages.append(q.get())
    done = messages[-1]
    assert isinstance(done, protocol.SamplerDone)
    assert done.ended_by == "an error: RuntimeError: NVML went away"
    assert done.sent == sum(len(m.samples) for m in messages[:-1]
                            if isinstance(m, protocol.Samples)) == 20


def test_the_device_panel_is_read_a_few_times_a_second_beside_the_samples(fresh_nvml):
    nvml._lib = FakePynvml(gpus=2, processes={os.getpid(): 3 * GIB, 2**22 + 1: None})
    nvml.reset()
    batches, done = _sample_for(1.2, "nvml", 200, gpus=(0, 1))
    assert done == sum(len(b) for b in batches) > 100  # the samples are all there, as before
    assert 2 <= len(STATUSES) <= 4  # every STATUS_SECONDS, not every tick
    status = STATUSES[-1]
    assert [(g.gpu, g.util, g.power_w, g.power_limit_w, g.temperature_c) for g in status.gpus] == [
        (0, 37, 412.345, 700.0, 54), (1, 37, 412.345, 700.0, 54)]
    # Every process on each GPU, named where this machine can see it.
    assert {(p.gpu, p.pid, p.name, p.used) for p in status.processes} == {
        (gpu, os.getpid(), psutil.Process().name(), 3 * GIB) for gpu in (0, 1)} | {
        (gpu, 2**22 + 1, None, None) for gpu in (0, 1)}
    assert 0 < status.host.ram_used < status.host.ram_total == psutil.virtual_memory().total
    assert status.host.cpu_percent is not None


def test_without_a_gpu_the_panel_is_the_host_alone():
    _sample_for(0.7, "cpu-rss", 100, Value("i", os.getpid()))
    assert STATUSES and all(s.gpus == [] and s.processes == [] for s in STATUSES)
