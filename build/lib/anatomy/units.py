"""Units, in one place: every figure is stored in bytes and shown in MiB ("MB", as the walkthrough
writes it), computed the walkthrough's way: bytes // 2**20."""

from __future__ import annotations

MIB = 1024 * 1024
GIB = 1024 * MIB


def mib(value: int | None) -> int | None:
    """Whole MiB, rounded down as the walkthrough's `used // 1024**2` is; None stays None."""
    return None if value is None else value // MIB


def mib_float(value: float | None) -> float | None:
    """MiB with the fraction kept, for tables and charts."""
    return None if value is None else value / MIB


def mb_text(value: float) -> str:
    """A size in whole MB with thousands separated: "6,456 MB"."""
    return f"{value / MIB:,.0f} MB"


def size_text(value: float) -> str:
    """A size in words, in the walkthrough's units (GB = 2**30 bytes): "1.2 GB" from 1 GB up,
    else "345 MB"."""
    return f"{value / GIB:.1f} GB" if value >= GIB else f"{value / MIB:.0f} MB"
