"""The run store: a SQLite file or a PostgreSQL database, its rows as typed records. Imports
nothing else of anatomy.

`rows` (the typed rows), `facts` (the typed records of a run's JSON columns: RunFacts,
TrainingSummary, RunSource, Origin), `checks` (what a stored value must be), `tables` (the tables,
declared once), `schema` (a store known as anatomy's and brought to this release's schema by the
alembic `migrations`), `location` (a path or a URL, its password never shown), `errors` (why a
store cannot be used), `database` (the Store)."""

from anatomy.store.database import BUCKET_SECONDS, STORE_ENV, Store, default_store, resolve_path
from anatomy.store.errors import (
    DatabaseError,
    StoreError,
    StoreMissing,
    store_error,
    unreachable,
    why,
)
from anatomy.store.facts import (
    Components,
    Origin,
    RunFacts,
    RunSource,
    TrainingArguments,
    TrainingData,
    TrainingSummary,
)
from anatomy.store.location import BadLocation, ServerUrl
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

__all__ = ["BUCKET_SECONDS", "HOST_STRIDE", "device_key", "rank_series", "series_rank", "Components",
           "Origin", "RunFacts", "RunSource", "TrainingArguments", "TrainingData",
           "TrainingSummary", "PHASES", "PROCESS", "PROFILING", "SPANS", "STATUSES", "STORE_ENV",
           "GpuProcess", "GpuStatus", "HostStatus", "Message", "PhaseMark", "PhaseSpan",
           "RunRecord", "RunRow", "Sample", "Step", "Store", "StoreError", "StoreMissing",
           "SweepRow", "default_store", "resolve_path", "store_error", "why", "BadLocation",
           "DatabaseError", "ServerUrl", "unreachable"]
