"""The run store: a SQLite file or a PostgreSQL database, its rows as typed records. Imports
nothing else of anatomy.

`rows` (the typed rows), `facts` (the typed records of a run's JSON columns: RunFacts,
TrainingSummary, RunSource, Origin), `checks` (what a stored value must be), `tables` (the tables,
declared once), `schema` (a store known as anatomy's and brought to this release's schema by the
alembic `migrations`), `location` (a path or a URL, its password never shown), `errors` (why a
store cannot be used), `database` (the Store)."""

from anatomy.store.facts import (
    Components,
    Origin,
    RunFacts,
    RunSource,
    TrainingArguments,
    TrainingData,
    TrainingSummary,
)
from anatomy.store.rows import (
    HOST_STRIDE,
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
    device_key,
    rank_series,
    series_rank,
)
from anatomy.vocabulary import PHASES, Phase

PROFILING, PROCESS = Phase.PROFILING, Phase.PROCESS

# The database and its errors, loaded on first use: SQLAlchemy is half a CPU second to import,
# and a process that only sends rows (the sampler, a rank) never opens a store.
_DATABASE = {
    "BUCKET_SECONDS": "database", "STORE_ENV": "database", "Store": "database",
    "default_store": "database", "resolve_path": "database",
    "DatabaseError": "errors", "StoreError": "errors", "StoreMissing": "errors",
    "store_error": "errors", "unreachable": "errors", "why": "errors",
    "BadLocation": "location", "ServerUrl": "location",
}

__all__ = ["BUCKET_SECONDS", "HOST_STRIDE", "device_key", "rank_series", "series_rank", "Components",
           "Origin", "RunFacts", "RunSource", "TrainingArguments", "TrainingData",
           "TrainingSummary", "PHASES", "PROCESS", "PROFILING", "SPANS", "STATUSES", "STORE_ENV",
           "GpuProcess", "GpuStatus", "HostStatus", "Message", "PhaseMark", "PhaseSpan",
           "RunRecord", "RunRow", "Sample", "Step", "Store", "StoreError", "StoreMissing",
           "SweepRow", "default_store", "resolve_path", "store_error", "why", "BadLocation",
           "DatabaseError", "ServerUrl", "unreachable"]


def __getattr__(name: str):
    if name in _DATABASE:
        import importlib

        return getattr(importlib.import_module(f"anatomy.store.{_DATABASE[name]}"), name)
    raise AttributeError(f"module 'anatomy.store' has no attribute {name!r}")
