"""The run store: SQLite, its rows as typed records. Imports nothing else of anatomy."""

from anatomy.store.database import (
    PHASES,
    PROFILING,
    SPANS,
    STATUSES,
    STORE_ENV,
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    PhaseMark,
    PhaseSpan,
    RunRecord,
    RunRow,
    Sample,
    Step,
    Store,
    SweepRow,
    resolve_path,
)

__all__ = ["PHASES", "PROFILING", "SPANS", "STATUSES", "STORE_ENV", "GpuProcess", "GpuStatus",
           "HostStatus", "Message", "PhaseMark",
           "PhaseSpan", "RunRecord", "RunRow", "Sample", "Step", "Store", "SweepRow",
           "resolve_path"]
