"""Units, in one place: every figure is stored in bytes and shown in binary units, MiB (2**20
bytes) and GiB (2**30), wherever a size is said: every page, the CLI, an export. Binary because
every figure is one already: the walkthrough computes its "MB" as `used // 1024**2`, NVML's
nvidia-smi and PyTorch (`torch.cuda.memory_summary`, its out-of-memory error) write MiB and GiB,
and a GPU's memory is a power of two. Decimal MB beside them would differ by 5 % (7 % in GB) for
the same bytes."""

from __future__ import annotations

MIB = 1024 * 1024
GIB = 1024 * MIB
MIB_NAME = "MiB"
GIB_NAME = "GiB"


def mib(value: int | None) -> int | None:
    """Whole MiB, rounded down as the walkthrough's `used // 1024**2` is; None stays None."""
    return None if value is None else value // MIB


def mib_float(value: float | None) -> float | None:
    """MiB with the fraction kept, for tables and charts."""
    return None if value is None else value / MIB


def in_mib(what: str) -> str:
    """A heading whose values are MiB: "peak (MiB)"."""
    return f"{what} ({MIB_NAME})"


def mib_text(value: float) -> str:
    """A size in whole MiB with thousands separated, rounded down as `mib` is: "6,456 MiB"."""
    return f"{int(value // MIB):,} {MIB_NAME}"


def gib_text(value: float) -> str:
    """A size in GiB to a tenth: "139.8 GiB" (a device's or a machine's memory)."""
    return f"{value / GIB:.1f} {GIB_NAME}"


def size_text(value: float) -> str:
    """A size in words: "1.2 GiB" from 1 GiB up, else "345 MiB"."""
    return gib_text(value) if value >= GIB else f"{value / MIB:.0f} {MIB_NAME}"
