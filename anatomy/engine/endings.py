"""How a run ends, in words and numbers, the same from every front: a process's exit in words
("was killed by SIGKILL"), the exit status a front gives back (128 + N for signal N), a stop's
reason, and torch's out-of-memory error told apart from any mention of the words.

Imports no torch: a process that never loaded it raised no torch error.
"""

from __future__ import annotations

import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from anatomy.engine import cgroups
from anatomy.vocabulary import Status

# Torch's own out-of-memory errors as they are printed: its exception's name (torch 2.5+:
# torch.OutOfMemoryError; before: torch.cuda.OutOfMemoryError), CUDA's and the caching
# allocator's message, the CPU allocator's, and a CUDA call's cudaErrorMemoryAllocation.
OOM_TEXT = re.compile(
    r"torch(?:\.cuda)?\.OutOfMemoryError"
    r"|\b(?:CUDA|HIP|MPS backend) out of memory\b"
    r"|CUDA error: out of memory"
    r"|DefaultCPUAllocator: can't allocate memory")


SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in /proc/PID/status's masks of pending signals
PF_EXITING = 0x4  # Linux's task flag: set as a process begins to exit


class OomKills:
    """Whether the kernel's out-of-memory killer ended one process: the count of such kills in
    the memory cgroup it lives in (engine/cgroups.py), read while it lives, against the same
    count once it died of SIGKILL. Read while it lives because /proc/PID/cgroup, which says
    where, is gone with it; read again and again (`look`) because another process of that
    cgroup killed for memory earlier in the run is not this one's kill (a user's `kill -9`
    was read as `oom` then). A reading taken once a kill is on its way to it (SIGKILL pending,
    the process exiting) is dropped: the kernel sends its SIGKILL before it counts the kill."""

    def __init__(self, pid: int):
        self.pid = pid
        self.path: Path | None = None  # where its cgroup's count is (None: nothing tells)
        self.count: int | None = None  # the count there, last read while it lived unsignalled
        self.look()

    def look(self) -> None:
        """While it lives: its cgroup (it may have moved: cgexec, systemd-run) and the count."""
        path = cgroups.oom_kill_counter(self.pid)
        count = cgroups.field(path, "oom_kill") if path is not None else None
        if count is not None and _unsignalled(self.pid):
            self.path, self.count = path, count

    def rose(self) -> bool:
        """Whether its cgroup's count rose since the last reading while it lived."""
        if self.path is None or self.count is None:
            return False
        later = cgroups.field(self.path, "oom_kill")
        return later is not None and later > self.count

    def killed(self, code: int | None) -> bool:
        """Whether it ended (exit code `code`, as multiprocessing and subprocess give it; a
        shell's 137 too) by the out-of-memory killer: SIGKILL, its cgroup's count risen. Out of
        RAM a CPU run dies so, without a word: torch never saw an error to print."""
        return code in (-signal.SIGKILL, 128 + signal.SIGKILL) and self.rose()


def _unsignalled(pid: int) -> bool:
    """Whether the process lives on with no kill on its way: not a zombie, not exiting, no
    SIGKILL pending (for the thread /proc shows, or the whole process)."""
    try:
        stat = (cgroups.PROC / str(pid) / "stat").read_text()
        status = (cgroups.PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 7 or fields[0] in ("Z", "X", "x") or int(fields[6]) & PF_EXITING:
        return False
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd") and int(value.strip() or "0", 16) & SIGKILL_BIT:
            return False
    return True


def killed_for_memory(who: str) -> str:
    """The out-of-memory killer's kill of `who`, in words."""
    return (f"the kernel's out-of-memory killer ended {who}, the machine's RAM (or its memory "
            "cgroup's limit: a container's, cgexec's) being full")


@dataclass(frozen=True)
class Ending:
    """How a run ended: what the store gets, and what a caller is told even when the store
    cannot take it (a full disk): `recorded` is False then."""
    status: Status
    error: str | None = None
    recorded: bool = True


def is_oom(error: BaseException) -> bool:
    """Torch's out-of-memory error (CUDA's, or its CPU allocator's), or Python's MemoryError
    (the host's): nothing else, whatever its message says."""
    if isinstance(error, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and OOM_TEXT.search(str(error)) is not None


def oom_in(text: str) -> bool:
    """Whether printed output holds torch's out-of-memory error."""
    return OOM_TEXT.search(text) is not None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def death(code: int | None, verb: str = "ended") -> str:
    """How a process ended, in words, from its exit code as multiprocessing and subprocess give
    it (-N: killed by signal N): "was killed by SIGKILL", "ended with exit code 3"."""
    if code is None:
        return "did not end"
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    return f"{verb} with exit code {code}"


def shell_death(code: int) -> str:
    """A shell's way of saying that its child was killed (exit code 128 + N), in words; "" for
    any other code."""
    if 128 < code < 128 + 65:
        try:
            return f" (a shell's way of saying its child was killed by {signal.Signals(code - 128).name})"
        except ValueError:
            return ""
    return ""


def exit_status(code: int) -> int:
    """The exit status to give back for a process's exit code: 128 + N for signal N, as a shell
    gives it."""
    return 128 - code if code < 0 else code


STOP_WORDS = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM",
              signal.SIGHUP: "SIGHUP: its terminal was closed"}


def stopped_by(signum: int) -> str:
    """A stop's reason for a signal: "stopped by SIGTERM", "stopped by Ctrl-C (SIGINT)"."""
    return f"stopped by {STOP_WORDS.get(signum, signal_name(signum))}"


def stop_signal_in(reason: str) -> int | None:
    """The signal a stop's reason (`stopped_by`) names; None for any other words."""
    return next((signum for signum in STOP_WORDS if reason == stopped_by(signum)), None)


def rank_signalled(who: str, signum: int) -> str:
    """One rank of several ended by a stop signal (SIGTERM, SIGINT, SIGHUP) that the run's front
    never got, in words: someone's signal to that rank alone, which ends the training as a kill
    does — the run fails (as torchrun's own launch does); a stop of the run reaches its front,
    and only that is `stopped`."""
    return f"{who} was killed by {signal_name(signum)}, a signal to that rank alone (no stop of " \
           "the run)"
