"""Shared fixtures. Every test gets its own store file, so nothing touches data/."""

from __future__ import annotations

import functools
import os
import tempfile

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.engine import nvml
from anatomy.engine.manager import LOCK_DIR_ENV, RunManager
from anatomy.store import STORE_ENV, PhaseMark, Sample, Step, Store


def pytest_configure(config):
    # Device locks of this test session only (its subprocesses inherit it): a dashboard running
    # beside the tests is not "busy" for them, nor they for it.
    os.environ[LOCK_DIR_ENV] = tempfile.mkdtemp(prefix="anatomy-test-locks-")


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "anatomy.sqlite"))


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "anatomy.sqlite")


@pytest.fixture
def manager(store):
    manager = RunManager(store)
    yield manager
    manager.stop_all()


@pytest.fixture
def fresh_nvml():
    """NVML's init state is per process: tests that swap its library start and end clean."""
    nvml.reset()
    saved = nvml._lib
    yield
    nvml._lib = saved
    nvml.reset()


GIB_BYTES = 1024**3


def seed_run(store: Store, status: str = "completed", backend: str = "nvml", gpus: int = 1,
             phases_reached: int = 4, error: str | None = None) -> int:
    """A run as the collector writes one, without training: the pages and figures read it back.

    Memory climbs 1, 2, 3, 4 GiB as the phases end at 1, 3, 5 and 9 s; the training GPU is 0,
    any other GPU stays at 0.5 GiB. The allocator's figures come with each step on a GPU."""
    options = {**RunOptions(preset="bert-large-uncased").to_dict(), "max_steps": 8}
    run_id = store.create_run(options, backend, "v2" if backend == "nvml" else "rss", 0,
                              {"gpu_name": "NVIDIA H200" if backend == "nvml" else None})
    ends = [1.0, 3.0, 5.0, 9.0][:phases_reached]
    samples = []
    for i in range(int(ends[-1] * 10) + 1):
        t = i / 10
        level = next((k + 1 for k, end in enumerate(ends) if t <= end), len(ends))
        for gpu in range(gpus):
            used = level * GIB_BYTES if gpu == 0 else GIB_BYTES // 2
            samples.append(Sample(t, gpu, used, None, 141 * GIB_BYTES, None))
    marks = []
    for name, start, end in zip(("baseline", "kernel", "weights", "training"),
                                (0.1, 2.0, 4.0, 6.0), ends):
        marks.append(PhaseMark("start", name, start))
        if status != "running" or end != ends[-1]:
            marks.append(PhaseMark("end", name, end))
    on_gpu = backend == "nvml"
    steps = [Step(6.0 + k * 0.4, k, 8, 1.0 / k, k * 10**8 if on_gpu else None,
              2 * GIB_BYTES if on_gpu else None) for k in range(1, 9)] if phases_reached == 4 else []
    store.write(run_id, samples=samples, phases=marks, steps=steps)
    if status == "running":
        store.update_run(run_id, worker_pid=os.getpid())  # a live worker: this very process
        return run_id
    store.update_run(run_id, samples_sent=len(samples))
    if status == "completed":
        store.update_run(run_id, summary={"time_s": 3.21, "samples_per_second": 9.97, "steps": 8})
    store.finish(run_id, status, error)
    return run_id


@pytest.fixture
def seed(store):
    """seed(**kwargs) -> run id: `seed_run` on this test's store."""
    return functools.partial(seed_run, store)
