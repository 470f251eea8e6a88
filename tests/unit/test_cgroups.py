"""The memory a process can have in its container, read as Linux tells it (engine/cgroups.py),
on cgroup trees laid out as v1 and v2 lay them out."""

from __future__ import annotations

import pytest

from anatomy.engine import cgroups

GIB = 2**30


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "sys-fs-cgroup"
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "PROC", proc)
    monkeypatch.setattr(cgroups, "VMSTAT", proc / "vmstat")
    return root, proc / "self" / "cgroup"


def test_v1_reads_the_effective_limit_its_ancestors_included(tree):
    root, proc = tree
    proc.write_text("12:pids:/x\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n")
    folder = root / "memory" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {3 * GIB}\n")
    assert cgroups.memory_limit() == 3 * GIB
    (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cgroups.oom_kill_counter() == folder / "memory.oom_control"
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
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 4\noom_kill 3\n")
    assert cgroups.oom_kill_counter() == leaf / "memory.events"


def test_nothing_told_leaves_the_machines_ram(tree, monkeypatch):
    import psutil

    root, proc = tree  # no /proc/self/cgroup (not Linux)
    assert cgroups.memory_limit() is None
    assert cgroups.usable_ram() == psutil.virtual_memory().total
    assert cgroups.oom_kill_counter() is None  # nothing counts
    cgroups.VMSTAT.write_text("pgfault 7\noom_kill 3\n")
    assert cgroups.oom_kill_counter() == cgroups.VMSTAT  # the machine's count, where no cgroup's
    assert cgroups.oom_kill_counter(4321) is None  # a process gone
    proc.write_text("0::/\n")  # a v2 root without a limit file
    assert cgroups.memory_limit() is None


def test_the_count_is_read_in_the_cgroup_of_the_process_asked_about(tree):
    """A command that sits in another memory cgroup than anatomy (cgexec, systemd-run, a
    container's limit): its kills are counted there, not in anatomy's own."""
    root, own = tree
    own.write_text("4:memory:/anatomy\n0::/\n")
    other = own.parent.parent / "4321"
    other.mkdir()
    (other / "cgroup").write_text("4:memory:/small\n0::/\n")
    for name in ("anatomy", "small"):
        (root / "memory" / name).mkdir(parents=True)
        (root / "memory" / name / "memory.oom_control").write_text("oom_kill 0\n")
    assert cgroups.oom_kill_counter() == root / "memory" / "anatomy" / "memory.oom_control"
    assert cgroups.oom_kill_counter(4321) == root / "memory" / "small" / "memory.oom_control"


def test_a_processs_own_memory_is_its_anonymous_pages_as_proc_tells_them(tree):
    """RssAnon: its heap, not the libraries' pages it shares with the run's worker."""
    _, own = tree
    status = own.parent / "status"
    status.write_text("Name:\tstreamlit\nVmRSS:\t  612340 kB\nRssAnon:\t  377856 kB\n"
                      "RssFile:\t  234484 kB\n")
    assert cgroups.anonymous_bytes() == 377856 * 1024
    status.write_text("Name:\tkthreadd\n")  # a kernel thread tells none
    assert cgroups.anonymous_bytes() is None
    assert cgroups.anonymous_bytes(4321) is None  # gone
