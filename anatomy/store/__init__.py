"""The run store: SQLite, its rows as typed records. Imports nothing else of anatomy."""

from anatomy.store.database import (
    PHASES,
    STATUSES,
    STORE_ENV,
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

__all__ = ["PHASES", "STATUSES", "STORE_ENV", "Message", "PhaseMark", "PhaseSpan", "RunRecord",
           "RunRow", "Sample", "Step", "Store", "StoreError", "StoreMissing", "SweepRow",
           "resolve_path"]
