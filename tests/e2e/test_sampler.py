"""The sampler's reader on real processes of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from multiprocessing import Value

import psutil

from anatomy.engine import sampler


def test_a_zombie_workers_memory_is_not_read_as_0(tmp_path):
    """psutil reads a zombie's RSS as 0: no sample, so its last phase keeps its last real figure
    instead of a 0 MB that never was."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    reader = sampler.Reader("cpu-rss", worker_pid=Value("i", child.pid))
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not yet waited for
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert reader.read(1.0) == []
    finally:
        child.wait()
    assert reader.read(2.0) == []  # and once it is gone altogether
