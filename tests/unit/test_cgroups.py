"""The memory a process can have in its container, read as Linux tells it (engine/cgroups.py),
on cgroup trees laid out as v1 and v2 lay them out."""

from __future__ import annotations

import pytest

from anatomy.engine import cgroups

GIB = 2**30


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "sys-fs-cgroup"
    proc = tmp_path / "proc-self-cgroup"
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", proc)
    return root, proc


def test_v1_reads_the_effective_limit_its_ancestors_included(tree):
    root, proc = tree
    proc.write_text("12:pids:/x\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n")
    folder = root / "memory" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {3 * GIB}\n")
    assert cgroups.memory_limit() == 3 * GIB
    assert cgroups.oom_kill_counters()[0] == folder / "memory.oom_control"
    (folder / "memory.stat").write_text("hierarchical_memory_limit 9223372036854771712\n")
    assert cgroups.memory_limit() is None  # v1's "no limit"


def test_v2_takes_the_least_limit_up_to_the_root_it_sees(tree):
    root, proc = tree
    proc.write_text("0::/kubepods/pod1/c1\n")
    leaf = root / "kubepods" / "pod1" / "c1"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")  # the container itself: no limit of its own
    (root / "kubepods" / "pod1" / "memory.max").write_text(f"{2 * GIB}\n")  # the pod's
    (root / "kubepods" / "memory.max").write_text(f"{64 * GIB}\n")
    assert cgroups.memory_limit() == 2 * GIB
    assert cgroups.oom_kill_counters() == [leaf / "memory.events", cgroups.VMSTAT]


def test_nothing_told_leaves_the_machines_ram(tree, monkeypatch):
    import psutil

    root, proc = tree  # no /proc/self/cgroup (not Linux)
    assert cgroups.memory_limit() is None
    assert cgroups.usable_ram() == psutil.virtual_memory().total
    assert cgroups.oom_kill_counters() == [cgroups.VMSTAT]
    proc.write_text("0::/\n")  # a v2 root without a limit file
    assert cgroups.memory_limit() is None
