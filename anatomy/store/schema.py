"""The store's tables, how a file is known to be anatomy's, and the migration of a store written
before a column existed."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from anatomy.store.errors import StoreError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT,
    created_at REAL NOT NULL,          -- wall clock, seconds since the epoch
    ended_at REAL,
    status TEXT NOT NULL,
    preset TEXT NOT NULL,
    options TEXT NOT NULL,             -- JSON of RunOptions
    environment TEXT NOT NULL DEFAULT '{}',
    backend TEXT NOT NULL,             -- "nvml" or "cpu-rss"
    memory_api TEXT,                   -- "v2", "v1" (NVML) or "rss"
    gpu INTEGER NOT NULL DEFAULT 0,    -- the sampled device that trains (NVML index)
    summary TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    samples_sent INTEGER,
    tags TEXT NOT NULL DEFAULT '',
    sweep TEXT,
    worker_pid INTEGER,                -- the training process (a user's script for attached runs)
    source TEXT NOT NULL DEFAULT '{}', -- JSON: who started it (RunRow.source)
    origin TEXT,                       -- JSON: where an imported run came from (RunRow.origin)
    recorder TEXT                      -- JSON: the process recording it (RunRow.recorder)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    gpu INTEGER NOT NULL,
    used INTEGER NOT NULL,
    reserved INTEGER,
    total INTEGER,
    util INTEGER
);
CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id, gpu, t);
-- Each 0.1 s of samples as its min and max (kept as samples arrive): long runs draw from here.
CREATE TABLE IF NOT EXISTS sample_buckets (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    gpu INTEGER NOT NULL,
    bucket INTEGER NOT NULL,           -- floor(t / BUCKET_SECONDS)
    t_min REAL NOT NULL, used_min INTEGER NOT NULL,
    t_max REAL NOT NULL, used_max INTEGER NOT NULL,
    reserved INTEGER, total INTEGER,
    PRIMARY KEY (run_id, gpu, bucket)
);
CREATE TABLE IF NOT EXISTS phases (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    start REAL NOT NULL,   -- the state is reached (the CUDA context is up, the weights are in)
    end REAL               -- the next step begins: the phase's memory is read here
);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    step INTEGER NOT NULL,
    total INTEGER,
    loss REAL,
    allocated INTEGER,
    reserved INTEGER
);
CREATE INDEX IF NOT EXISTS steps_run ON steps(run_id, step);
CREATE TABLE IF NOT EXISTS messages (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    level TEXT NOT NULL,
    text TEXT NOT NULL
);
-- The device panel (a few readings a second, beside the samples): the host, each GPU, and every
-- process on a GPU.
CREATE TABLE IF NOT EXISTS host_status (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    cpu_percent REAL,
    ram_used INTEGER NOT NULL,
    ram_total INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS host_status_run ON host_status(run_id, t);
CREATE TABLE IF NOT EXISTS gpu_status (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    gpu INTEGER NOT NULL,
    util INTEGER,
    power_w REAL,
    power_limit_w REAL,
    temperature_c INTEGER
);
CREATE INDEX IF NOT EXISTS gpu_status_run ON gpu_status(run_id, t);
CREATE TABLE IF NOT EXISTS gpu_processes (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    gpu INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    name TEXT,
    used INTEGER
);
CREATE INDEX IF NOT EXISTS gpu_processes_run ON gpu_processes(run_id, t);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,   -- what runs.sweep holds: unique across stores, so a run imported
                                -- from another machine never joins a local sweep of the same id
    name TEXT,
    created_at REAL NOT NULL,
    ended_at REAL,
    base TEXT NOT NULL,         -- JSON of the base RunOptions
    vary TEXT NOT NULL,         -- JSON {option: [values]}, as planned
    until_oom INTEGER NOT NULL DEFAULT 0,
    planned INTEGER NOT NULL,   -- runs in the plan; an until-oom ladder may add more
    skipped INTEGER NOT NULL DEFAULT 0,  -- planned runs dropped after an oom in their ladder
    status TEXT NOT NULL,       -- running, completed, stopped, failed
    error TEXT,
    pid INTEGER                 -- the process running it: a sweep whose process ended is over
);
-- The store's own facts: "id", a random name that an export carries, so an import knows which
-- store a run came from.
CREATE TABLE IF NOT EXISTS store_info (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Columns that make a table anatomy's: a file whose tables of these names lack them is another
# program's (MLflow's store has a "runs" table too).
SIGNATURES = {
    "runs": {"id", "status", "preset", "options", "backend"},
    "samples": {"run_id", "t", "gpu", "used"},
    "sweeps": {"key", "base", "vary", "planned"},
}


# Columns added after the first release of the schema, as (table, column, type).
ADDED_COLUMNS = (("sweeps", "pid", "INTEGER"), ("runs", "source", "TEXT NOT NULL DEFAULT '{}'"),
                 ("runs", "origin", "TEXT"), ("runs", "recorder", "TEXT"),
                 # A run of several training processes: each phase and step names its rank.
                 ("phases", "rank", "INTEGER NOT NULL DEFAULT 0"),
                 ("steps", "rank", "INTEGER NOT NULL DEFAULT 0"),
                 # The sequence length each step of a user's Trainer trained at.
                 ("steps", "seq_len", "INTEGER"))


def migrate(db: sqlite3.Connection) -> None:
    """The tables made where missing, the columns added since a file was written, and the
    store's id given once."""
    db.executescript(SCHEMA)
    # Read and altered in one write transaction: two processes opening a new store at once (a
    # Pool's trials) both read the table without its column, and the second to add it failed
    # ("duplicate column name: rank"), its trial unrecorded.
    db.execute("BEGIN IMMEDIATE")
    columns = {}
    for table, column, kind in ADDED_COLUMNS:  # files written before the column existed
        known = columns.setdefault(table, {r["name"] for r in
                                           db.execute(f"PRAGMA table_info({table})")})
        if column not in known:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    db.execute("INSERT OR IGNORE INTO store_info VALUES ('id', ?)", (uuid.uuid4().hex,))


def check(db: sqlite3.Connection, path: Path) -> list[str]:
    """Refuse another program's database: anatomy's has no tables yet, or ours by name and
    columns. Its tables."""
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                       " AND name NOT LIKE 'sqlite_%'")]
    ours = [t for t in tables if t in SIGNATURES]
    foreign = [t for t in ours if not SIGNATURES[t] <=
               {r[1] for r in db.execute(f"PRAGMA table_info({t})")}]
    if (tables and not ours) or foreign:
        shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
        raise StoreError(path, f"it is not an anatomy store: it holds another program's"
                         f" tables ({shown})")
    return tables
