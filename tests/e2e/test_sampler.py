"""The sampler's reader on real processes of its own."""

from __future__ import annotations

import subprocess
import sys
from multiprocessing import Value

import psutil

from anatomy.engine import protocol, sampler
from tests.helpers import wait_until


def test_a_zombie_workers_memory_is_not_read_as_0(tmp_path):
    """psutil reads a zombie's RSS as 0: no sample, so its last phase keeps its last real figure
    instead of a 0 MB that never was."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    reader = sampler.Reader("cpu-rss", worker_pid=Value("i", child.pid))
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 30,
               "the child to end, not yet waited for (a zombie)")
    try:
        assert reader.read(1.0) == []
    finally:
        child.wait()
    assert reader.read(2.0) == []  # and once it is gone altogether


def _launch(env: str) -> psutil.Popen:
    """A launcher (bash) of three processes: two ranks (LOCAL_RANK 0 holding 40 MB more than
    itself, LOCAL_RANK 1 80 MB) and a helper without a rank; `env` goes before the launcher."""
    hold = "import time; held = bytearray([1]) * ({} * 2**20); time.sleep(60)"
    script = (f"LOCAL_RANK=0 {sys.executable} -c '{hold.format(40)}' & "
              f"LOCAL_RANK=1 {sys.executable} -c '{hold.format(80)}' & "
              f"{sys.executable} -c '{hold.format(1)}' & wait")
    return psutil.Popen(["env", *env.split(), "bash", "-c", script])


def _read_when_started(launcher: psutil.Popen) -> list[protocol.Sample]:
    """The reader's samples once each child has started and holds its memory."""
    def holding() -> bool:
        children = launcher.children(recursive=True)
        rss = [p.memory_info().rss for p in children]
        # each holds its memory: the helper least, rank 0 its 40 MB, rank 1 its 80 MB (waiting
        # for rank 1 alone read rank 0 half-filled under load: 38 MB)
        return len(children) == 3 and min(rss) > 0 and sorted(rss)[1] > 40 * 2**20 and \
            max(rss) > 80 * 2**20

    wait_until(holding, 60, "the three children holding their memory", every=0.1,
               process=launcher)
    return sampler.Reader("cpu-rss", worker_pid=Value("i", launcher.pid)).read(0.0)


def test_rss_reader_measures_each_ranks_own_processes_beside_the_tree():
    """Two CPU ranks under a launcher (`anatomy watch -- torchrun …`): `show` printed the same row
    for both, the whole tree's; now each rank's own RSS is a series of its own (1 + local rank)."""
    launcher = _launch("")
    try:
        rows = {row.gpu: row.used for row in _read_when_started(launcher)}
    finally:
        for child in launcher.children(recursive=True):
            child.kill()
        launcher.kill()
        launcher.wait()
    assert set(rows) == {0, 1, 2}
    assert 30 * 2**20 < rows[2] - rows[1] < 50 * 2**20  # rank 1 holds 40 MB more than rank 0
    assert rows[0] > rows[1] + rows[2]  # the tree: the launcher and the helper too


def test_a_root_that_is_a_rank_is_the_one_rank():
    """The callback in rank 0 of a launch samples its own process: its children inherit its
    LOCAL_RANK and are its data loaders, not another rank."""
    launcher = _launch("LOCAL_RANK=0")
    try:
        rows = _read_when_started(launcher)
    finally:
        for child in launcher.children(recursive=True):
            child.kill()
        launcher.kill()
        launcher.wait()
    assert [row.gpu for row in rows] == [0]


FORKS_THEN_NAMES_ITSELF = """
import os, pathlib, sys, time
from anatomy.engine.lifeline import name_rank
if os.fork() == 0:  # a rank as the elastic agent forks it: its launcher's name for a moment
    while not pathlib.Path(sys.argv[1]).exists():
        time.sleep(0.01)
    name_rank(1)
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(60)
os.wait()
"""


def test_a_rank_that_names_itself_just_after_its_fork_is_read_as_the_rank_at_once(tmp_path):
    """Its first phase (the kernel, 0.1 s) ends before RANK_SECONDS: before, the rank was asked
    again only 0.5 s after it was first seen unnamed, and `show` printed "-" for its kernel
    phase."""
    go, named = tmp_path / "go", tmp_path / "named"
    launcher = psutil.Popen([sys.executable, "-c", FORKS_THEN_NAMES_ITSELF, str(go), str(named)])
    try:
        wait_until(launcher.children, 60, "the fork", every=0.01, process=launcher)
        reader = sampler.Reader("cpu-rss", worker_pid=Value("i", launcher.pid))
        assert [row.gpu for row in reader.read(0.0)] == [0]  # the fork, not yet named
        go.touch()
        wait_until(named.exists, 60, "the fork to name itself rank 1", every=0.01,
                   process=launcher)
        assert [row.gpu for row in reader.read(0.2)] == [0, 2]  # rank 1's own series
    finally:
        for child in launcher.children(recursive=True):
            child.kill()
        launcher.kill()
        launcher.wait()
