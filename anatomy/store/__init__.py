"""The run store: SQLite, its rows as typed records. Imports nothing else of anatomy.

`rows` (the typed rows), `schema` (tables and migrations), `errors` (why a store cannot be used),
`database` (the Store)."""

from anatomy.store.database import STORE_ENV, Store, default_store, resolve_path
from anatomy.store.errors import StoreError, StoreMissing, store_error, why
from anatomy.store.rows import (
    PHASES,
    PROCESS,
    PROFILING,
    SPANS,
    STATUSES,
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
    SweepRow,
)

__all__ = ["PHASES", "PROCESS", "PROFILING", "SPANS", "STATUSES", "STORE_ENV",
           "GpuProcess", "GpuStatus", "HostStatus", "Message", "PhaseMark", "PhaseSpan",
           "RunRecord", "RunRow", "Sample", "Step", "Store", "StoreError", "StoreMissing",
           "SweepRow", "default_store", "resolve_path", "store_error", "why"]
