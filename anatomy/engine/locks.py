"""The device locks: one run at a time per GPU, machine-wide.

A lock is a `flock` on <tmp>/anatomy-locks/<key>.lock whose file says who holds it, so the one
refused can be told. Its descriptor is inherited by the run's processes (engine/lifeline.py), so
the device stays taken while any of them lives, even when the process that took it died first.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from anatomy.analysis.machine import Machine
from anatomy.analysis.options import RunOptions

LOCK_DIR_ENV = "ANATOMY_LOCK_DIR"  # where the per-device locks live; machine-wide by default


class DeviceBusy(RuntimeError):
    """The device is taken: another run trains on it, or a sweep holds it."""


def held_by(what: str, store: object, kind: str = "") -> str:
    """A lock's holder in words, for the run it keeps waiting: what holds it, in which store (a
    run's number alone named another store's run 1), by which process of this one's: "run 3 of
    /data/runs.sqlite (a watch, pid 812)"."""
    return f"{what} of {store} ({kind + ', ' if kind else ''}pid {os.getpid()})"


def device_key(options: RunOptions, info: Machine) -> str:
    """The lock a run with these options takes: its (first) GPU's (by NVML index, which every
    process agrees on whatever its CUDA_VISIBLE_DEVICES), or the machine's without a GPU."""
    return device_keys(options, info)[0]


def device_keys(options: RunOptions, info: Machine) -> list[str]:
    """Every lock a run takes: one per GPU it trains on (several with --gpus)."""
    if not info.has_gpu:
        return ["cpu"]
    return [gpu_key(info.devices[g].nvml_index) for g in options.gpu_list()]


def gpu_key(nvml_index: int) -> str:
    return f"gpu{nvml_index}"


def device_words(options: RunOptions, info: Machine, key: str | None = None) -> str:
    if not info.has_gpu:
        return "this machine"
    gpus = options.gpu_list()
    if key is not None:
        gpus = tuple(g for g in gpus if gpu_key(info.devices[g].nvml_index) == key) or gpus
    return f"GPU {gpus[0]}"


class DeviceLock:
    """A machine-wide lock on one device (its key: "gpu0", "cpu")."""

    def __init__(self, key: str):
        self.directory = Path(os.environ.get(LOCK_DIR_ENV)
                              or Path(tempfile.gettempdir()) / "anatomy-locks")
        self.key = key
        self.path = self.directory / f"{key}.lock"
        self.file = None

    def acquire(self, holder: str) -> bool:
        """Take the lock (True), or find it taken (False). DeviceBusy, in one line, when its
        file cannot be opened at all (a folder that cannot be made or written)."""
        try:
            self.file = _open_shared(self.directory, self.path)
        except OSError as error:
            raise DeviceBusy(f"the device lock {self.path} cannot be opened: "
                             f"{error.strerror or error} (${LOCK_DIR_ENV} puts the locks "
                             "elsewhere)") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            self.file = None
            return False
        self.describe(holder)
        return True

    def describe(self, holder: str) -> None:
        """Say who holds the lock (it must be held)."""
        self.file.seek(0)
        self.file.truncate()
        self.file.write(holder)
        self.file.flush()

    def holder(self) -> str:
        """Who holds the lock, in words, as its holder wrote it."""
        try:
            return self.path.read_text().strip() or "another run"
        except OSError:
            return "another run"

    @property
    def held(self) -> bool:
        return self.file is not None

    def fileno(self) -> int:
        return self.file.fileno()

    def release(self) -> None:
        """Let go of our share. Never LOCK_UN: the run's processes share this open file (and its
        flock) and may outlive us; the lock ends when the last descriptor on it closes."""
        if self.file is not None:
            self.file.close()
            self.file = None


def _open_shared(directory: Path, path: Path):
    """The lock file, open for reading and writing. The locks are the machine's, not a user's:
    the folder anatomy makes is everyone's (sticky, as /tmp) and each lock file anyone's to open,
    or the first user's umask (0755, 0644) would refuse every other user's run for good."""
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        pass  # made before (or a file: the open below says so)
    else:
        os.chmod(directory, 0o1777)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.fchmod(descriptor, 0o666)
    except OSError:
        pass  # another user's file: its mode is theirs to give (anatomy gave 0666)
    return os.fdopen(descriptor, "a+")


def take_all(keys: Sequence[str], holder: str, words) -> list[DeviceLock]:
    """The locks of `keys`, all or none: DeviceBusy names the first that is taken (`words(key)`:
    the device in words)."""
    taken: list[DeviceLock] = []
    for key in keys:
        lock = DeviceLock(key)
        if not lock.acquire(holder):
            for other in taken:
                other.release()
            raise DeviceBusy(f"{words(key)} is busy: {lock.holder()}")
        taken.append(lock)
    return taken
