"""The run store: SQLite, its rows as typed records. Imports nothing else of anatomy."""

from anatomy.store.database import (
    PHASES,
    PROCESS,
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
    StoreError,
    StoreMissing,
    SweepRow,
    resolve_path,
)

__all__ = ["PHASES", "PROCESS", "PROFILING", "SPANS", "STATUSES", "STORE_ENV", "GpuProcess", "GpuStatus",
           "HostStatus", "Message", "PhaseMark", "PhaseSpan", "RunRecord", "RunRow", "Sample",
           "Step", "Store", "StoreError", "StoreMissing", "SweepRow",
           "resolve_path"]
