"""The memory cgroup a process lives in (a container's: docker's --memory, a Kubernetes
limit; a systemd scope's; cgexec's), as Linux tells it under /sys/fs/cgroup, v1 or v2: the memory
a process here can have, which may be far less than the machine's RAM that psutil tells, and the
file where the kernel counts its out-of-memory killer's kills of that cgroup's processes.
Elsewhere (not Linux, nothing mounted) nothing is told, and the machine's figures stand.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
VMSTAT = PROC / "vmstat"  # the machine's count, every cgroup's kills with the others'
UNLIMITED = 2**60  # v1 says "no limit" with a number near 2**63


def _memory_folders(pid: int | str = "self") -> list[tuple[Path, int]]:
    """A process's memory cgroup folders with their version: v1's memory controller, v2's
    unified hierarchy (in a container, its own cgroup is the root it sees)."""
    try:
        text = (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        where = where.strip("/")
        if "memory" in controllers.split(","):
            found.append((ROOT / "memory" / where, 1))
        elif controllers == "":
            found.append((ROOT / where, 2))
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def field(path: Path, name: str) -> int | None:
    """The value of a `name N` line of a cgroup's (or /proc's) key-value file."""
    text = _read(path)
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def anonymous_bytes(pid: int | str = "self") -> int | None:
    """A process's memory of its own (/proc/PID/status's RssAnon: its heap, not the libraries'
    pages it shares), in bytes; None where Linux does not tell."""
    text = _read(PROC / str(pid) / "status")
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key == "RssAnon" and value.split()[1:] == ["kB"]:
            return int(value.split()[0]) * 1024
    return None


def memory_limit() -> int | None:
    """The least memory limit on this process's cgroup and those above it (bytes); None where
    none is set or nothing tells."""
    limits = []
    for folder, version in _memory_folders():
        if version == 1:  # v1 states the effective limit, its ancestors' included
            limits.append(field(folder / "memory.stat", "hierarchical_memory_limit"))
            continue
        level = folder
        while True:  # v2 does not: each level, up to the root this process sees
            text = _read(level / "memory.max")
            limits.append(int(text) if text and text.isdigit() else None)
            if level == ROOT or ROOT not in level.parents:
                break
            level = level.parent
    return min((n for n in limits if n is not None and 0 < n < UNLIMITED), default=None)


def usable_ram() -> int:
    """The memory a process here can have: the machine's RAM, or its cgroup's limit if less."""
    import psutil

    total = psutil.virtual_memory().total
    limit = memory_limit()
    return min(total, limit) if limit is not None else total


def oom_kill_counter(pid: int | str = "self") -> Path | None:
    """Where the kernel counts the processes its out-of-memory killer ends (an `oom_kill N`
    line) in the memory cgroup that process `pid` lives in — the kill of a process is counted in
    its own cgroup (v1: there alone; v2: there and above) —, else the machine's count, which
    holds every cgroup's; None when the process is gone or nothing counts."""
    for folder, version in _memory_folders(pid):
        counter = folder / ("memory.oom_control" if version == 1 else "memory.events")
        if field(counter, "oom_kill") is not None:
            return counter
    if not (PROC / str(pid)).exists():
        return None
    return VMSTAT if field(VMSTAT, "oom_kill") is not None else None
