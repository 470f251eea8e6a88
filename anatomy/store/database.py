"""The run store: SQLite in WAL mode, one writer (the collector), any number of readers.

A run can be read while it is written. Times are seconds since the run's start (the monotonic
clock, shared by all processes of one machine); memory is in bytes.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

PROJECT_DIR = Path(__file__).resolve().parent.parent.parent
DEFAULT_STORE = PROJECT_DIR / "data" / "anatomy.sqlite"
STORE_ENV = "ANATOMY_STORE"

PHASES = ("baseline", "kernel", "weights", "training")
STATUSES = ("running", "completed", "failed", "oom", "stopped")


# --- the rows, as readers get them: read by name, never by position or string key ---

class Sample(NamedTuple):
    """One reading of one device: the sampler sends these, the store keeps them as they are."""
    t: float  # seconds since the run's start
    gpu: int  # the device's NVML index (0 for a CPU run's RSS)
    used: int  # bytes
    reserved: int | None  # NVML v2's driver reservation
    total: int | None
    util: int | None  # percent


class Step(NamedTuple):
    t: float
    step: int
    total: int | None
    loss: float | None
    allocated: int | None  # torch's allocator at the step's end (GPU runs)
    reserved: int | None


class Message(NamedTuple):
    t: float
    level: str
    text: str


class PhaseMark(NamedTuple):
    """A phase's start or end as it happens: the collector writes these in arrival order."""
    edge: str  # "start" or "end"
    name: str
    t: float


class PhaseSpan(NamedTuple):
    """A phase as stored: end_s is None while it lasts."""
    name: str
    start_s: float
    end_s: float | None


@dataclass(frozen=True)
class RunRow:
    """A run's own row: what it is and how it ended, without its samples."""
    id: int
    name: str | None
    created_at: float
    ended_at: float | None
    status: str
    preset: str
    options: dict[str, Any]
    environment: dict[str, Any]
    backend: str  # "nvml" or "cpu-rss"
    memory_api: str | None
    gpu: int
    summary: dict[str, Any]
    error: str | None
    samples_sent: int | None
    tags: tuple[str, ...]
    sweep: str | None
    worker_pid: int | None


@dataclass(frozen=True)
class RunRecord:
    """A whole run as an import brings it: its row and everything it recorded."""
    run: RunRow
    samples: Sequence[Sample]
    phases: Sequence[PhaseSpan]
    steps: Sequence[Step]
    messages: Sequence[Message]


@dataclass(frozen=True)
class SweepRow:
    id: int
    key: str
    name: str | None
    created_at: float
    ended_at: float | None
    base: dict[str, Any]
    vary: dict[str, list]
    until_oom: bool
    planned: int
    skipped: int
    status: str
    error: str | None
    pid: int | None

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
    worker_pid INTEGER
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
"""


BUCKET_SECONDS = 0.1


def _insert_samples(db: sqlite3.Connection, run_id: int, samples: Sequence[Sample]) -> None:
    """The samples, and their 0.1 s buckets' min and max."""
    db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [(run_id, *s) for s in samples])
    _merge_buckets(db, run_id, samples)


def _merge_buckets(db: sqlite3.Connection, run_id: int, samples: Sequence[Sample]) -> None:
    """Fold samples into their buckets' min and max (merged with what a bucket already holds)."""
    buckets: dict[tuple[int, int], list] = {}
    for t, gpu, used, reserved, total, _ in samples:
        key = (gpu, math.floor(t / BUCKET_SECONDS))
        bucket = buckets.get(key)
        if bucket is None:
            buckets[key] = [t, used, t, used, reserved, total]
        else:
            if used < bucket[1]:
                bucket[0:2] = t, used
            if used > bucket[3]:
                bucket[2:4] = t, used
    db.executemany(
        "INSERT INTO sample_buckets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (run_id, gpu, bucket) DO UPDATE SET"
        " t_min = CASE WHEN excluded.used_min < used_min THEN excluded.t_min ELSE t_min END,"
        " used_min = MIN(used_min, excluded.used_min),"
        " t_max = CASE WHEN excluded.used_max > used_max THEN excluded.t_max ELSE t_max END,"
        " used_max = MAX(used_max, excluded.used_max)",
        [(run_id, gpu, index, *values) for (gpu, index), values in buckets.items()])


# Columns added after the first release of the schema, as (table, column, type).
ADDED_COLUMNS = (("sweeps", "pid", "INTEGER"),)


def resolve_path(path: str | os.PathLike | None = None) -> Path:
    """--store, then $ANATOMY_STORE, then the project's default file."""
    return Path(path or os.environ.get(STORE_ENV) or DEFAULT_STORE)


class Store:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = resolve_path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as db:
            db.executescript(SCHEMA)
            for table, column, kind in ADDED_COLUMNS:  # files written before the column existed
                if column not in {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    @contextmanager
    def connect(self):
        db = sqlite3.connect(self.path, timeout=30)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            with db:
                yield db
        finally:
            db.close()

    # --- writing (the collector, or the manager before a run starts) ---
    def create_run(self, options: dict, backend: str, memory_api: str | None, gpu: int,
                   environment: dict, name: str | None = None, sweep: str | None = None) -> int:
        with self.connect() as db:
            cursor = db.execute(
                "INSERT INTO runs (name, created_at, status, preset, options, environment, backend,"
                " memory_api, gpu, sweep) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (name, time.time(), options.get("model", options.get("preset")), json.dumps(options),
                 json.dumps(environment),
                 backend, memory_api, gpu, sweep))
            return int(cursor.lastrowid)

    def update_run(self, run_id: int, **values: Any) -> None:
        for key in ("options", "environment", "summary"):
            if key in values and not isinstance(values[key], str):
                values[key] = json.dumps(values[key])
        columns = ", ".join(f"{k} = ?" for k in values)
        with self.connect() as db:
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*values.values(), run_id))

    def merge_environment(self, run_id: int, extra: dict) -> None:
        environment = {**self.run(run_id).environment, **extra}
        self.update_run(run_id, environment=environment)

    def finish(self, run_id: int, status: str, error: str | None = None) -> None:
        assert status in STATUSES
        self.update_run(run_id, status=status, error=error, ended_at=time.time())

    def write(self, run_id: int, samples: Sequence[Sample] = (), phases: Sequence[PhaseMark] = (),
              steps: Sequence[Step] = (), messages: Sequence[Message] = ()) -> None:
        """One transaction for a batch of rows; `phases` are marks in arrival order."""
        with self.connect() as db:
            if samples:
                _insert_samples(db, run_id, samples)
            for mark in phases:
                if mark.edge == "start":
                    db.execute("INSERT INTO phases VALUES (?, ?, ?, NULL)",
                               (run_id, mark.name, mark.t))
                else:
                    db.execute("UPDATE phases SET end = ? WHERE run_id = ? AND name = ?",
                               (mark.t, run_id, mark.name))
            if steps:
                db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
                               [(run_id, *s) for s in steps])
            if messages:
                db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)",
                               [(run_id, *m) for m in messages])

    def delete_run(self, run_id: int) -> None:
        with self.connect() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def rename_run(self, run_id: int, name: str | None) -> bool:
        """False when there is no such run."""
        with self.connect() as db:
            return db.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id)).rowcount > 0

    def set_tags(self, run_id: int, tags: Sequence[str]) -> bool:
        """Replace the run's tags (blank ones dropped, duplicates once); False when there is no
        such run. The column is comma-separated, so a tag cannot hold a comma."""
        clean = list(dict.fromkeys(t.strip() for t in tags if t.strip()))
        bad = [t for t in clean if "," in t]
        if bad:
            raise ValueError(f"a tag cannot contain a comma: {bad[0]!r}")
        with self.connect() as db:
            return db.execute("UPDATE runs SET tags = ? WHERE id = ?",
                              (",".join(clean), run_id)).rowcount > 0

    def add_runs(self, records: Sequence[RunRecord]) -> list[int]:
        """Whole runs from elsewhere (an import), in one transaction: all of them or none. Each
        gets a new id (the record's own is not kept)."""
        ids = []
        with self.connect() as db:
            for record in records:
                run = record.run
                cursor = db.execute(
                    "INSERT INTO runs (name, created_at, ended_at, status, preset, options,"
                    " environment, backend, memory_api, gpu, summary, error, samples_sent, tags,"
                    " sweep) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run.name, run.created_at, run.ended_at, run.status, run.preset,
                     json.dumps(run.options), json.dumps(run.environment), run.backend,
                     run.memory_api, run.gpu, json.dumps(run.summary), run.error, run.samples_sent,
                     ",".join(run.tags), run.sweep))
                run_id = int(cursor.lastrowid)
                _insert_samples(db, run_id, record.samples)
                db.executemany("INSERT INTO phases VALUES (?, ?, ?, ?)",
                               [(run_id, *p) for p in record.phases])
                db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
                               [(run_id, *s) for s in record.steps])
                db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)",
                               [(run_id, *m) for m in record.messages])
                ids.append(run_id)
        return ids

    # --- sweeps (the sweep runner writes; the pages read progress from here) ---
    def create_sweep(self, name: str | None, base: dict, vary: dict, until_oom: bool,
                     planned: int) -> int:
        with self.connect() as db:
            cursor = db.execute(
                "INSERT INTO sweeps (key, name, created_at, base, vary, until_oom, planned, status,"
                " pid) VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                (uuid.uuid4().hex, name, time.time(), json.dumps(base), json.dumps(vary),
                 int(until_oom), planned, os.getpid()))
            return int(cursor.lastrowid)

    def update_sweep(self, sweep_id: int, **values: Any) -> None:
        columns = ", ".join(f"{k} = ?" for k in values)
        with self.connect() as db:
            db.execute(f"UPDATE sweeps SET {columns} WHERE id = ?", (*values.values(), sweep_id))

    @staticmethod
    def _sweep_row(row: sqlite3.Row) -> SweepRow:
        values = dict(row)
        values.update(base=json.loads(values["base"]), vary=json.loads(values["vary"]),
                      until_oom=bool(values["until_oom"]))
        return SweepRow(**values)

    def sweep(self, sweep_id: int) -> SweepRow | None:
        with self.connect() as db:
            row = db.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return None if row is None else self._sweep_row(row)

    def sweeps(self) -> list[SweepRow]:
        with self.connect() as db:
            rows = db.execute("SELECT * FROM sweeps ORDER BY id DESC").fetchall()
        return [self._sweep_row(r) for r in rows]

    # --- reading ---
    @staticmethod
    def _run_row(row: sqlite3.Row) -> RunRow:
        values = dict(row)
        for key in ("options", "environment", "summary"):
            values[key] = json.loads(values[key] or "{}")
        values["tags"] = tuple(t for t in (values["tags"] or "").split(",") if t)
        return RunRow(**values)

    def run(self, run_id: int) -> RunRow | None:
        with self.connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else self._run_row(row)

    def runs(self) -> list[RunRow]:
        with self.connect() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY id DESC").fetchall()
        return [self._run_row(r) for r in rows]

    def find_runs(self, tag: str | None = None, preset: str | None = None,
                  status: str | None = None, sweep: str | None = None) -> list[RunRow]:
        """`runs()` narrowed to those with the tag, preset, status and sweep key given."""
        query, args = "SELECT * FROM runs WHERE 1", []
        if tag is not None:
            # whole tags only: "a" must not match "ab"
            query += " AND instr(',' || tags || ',', ',' || ? || ',') > 0"
            args.append(tag)
        for column, value in (("preset", preset), ("status", status), ("sweep", sweep)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        with self.connect() as db:
            rows = db.execute(query + " ORDER BY id DESC", args).fetchall()
        return [self._run_row(r) for r in rows]

    def latest_running(self) -> RunRow | None:
        with self.connect() as db:
            row = db.execute("SELECT * FROM runs WHERE status = 'running' ORDER BY id DESC"
                             " LIMIT 1").fetchone()
        return None if row is None else self._run_row(row)

    def phases(self, run_id: int) -> list[PhaseSpan]:
        """The phases in order; end_s is None while a phase lasts."""
        with self.connect() as db:
            rows = db.execute("SELECT name, start, end FROM phases WHERE run_id = ? ORDER BY start",
                              (run_id,)).fetchall()
        return [PhaseSpan(*r) for r in rows]

    def close_phases(self, run_id: int, t: float) -> None:
        """A worker that died mid-phase: its open phase ends at `t` (its last sample)."""
        with self.connect() as db:
            db.execute("UPDATE phases SET end = ? WHERE run_id = ? AND end IS NULL", (t, run_id))

    def samples(self, run_id: int, gpu: int | None = None) -> list[Sample]:
        query = "SELECT t, gpu, used, reserved, total, util FROM samples WHERE run_id = ?"
        args: tuple = (run_id,)
        if gpu is not None:
            query += " AND gpu = ?"
            args += (gpu,)
        with self.connect() as db:
            return [Sample(*r) for r in db.execute(query + " ORDER BY gpu, t", args)]

    def sample_count(self, run_id: int) -> int:
        with self.connect() as db:
            return db.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?",
                              (run_id,)).fetchone()[0]

    def last_time(self, run_id: int) -> float:
        with self.connect() as db:
            return db.execute("SELECT COALESCE(MAX(t), 0) FROM samples WHERE run_id = ?",
                              (run_id,)).fetchone()[0]

    def decimated(self, run_id: int, buckets: int = 2000) -> list[Sample]:
        """Per GPU, at most ~2 points per time bucket: the bucket's min and its max, at their own
        times. Every peak survives, and a run of a million samples draws like a short one: it
        is read from the 0.1 s min/max buckets the store keeps, not from the samples."""
        with self.connect() as db:
            span = db.execute("SELECT MIN(t_min), MAX(t_max), COUNT(*) FROM sample_buckets"
                              " WHERE run_id = ?", (run_id,)).fetchone()
            if span[2] == 0:
                if not self._backfill_buckets(db, run_id):
                    return []
                span = db.execute("SELECT MIN(t_min), MAX(t_max), COUNT(*) FROM sample_buckets"
                                  " WHERE run_id = ?", (run_id,)).fetchone()
            start, width = span[0], max((span[1] - span[0]) / buckets, 1e-9)
            gpus = db.execute("SELECT COUNT(DISTINCT gpu) FROM sample_buckets WHERE run_id = ?",
                              (run_id,)).fetchone()[0]
            if self.sample_count(run_id) <= 2 * buckets * gpus:
                rows = db.execute("SELECT t, gpu, used, reserved, total, util FROM samples"
                                  " WHERE run_id = ? ORDER BY gpu, t", (run_id,)).fetchall()
                return [Sample(*r) for r in rows]
            points = {}
            # SQLite fills the bare columns from the row that holds the MIN / MAX.
            for t, used, agg in (("t_min", "used_min", "MIN"), ("t_max", "used_max", "MAX")):
                for r in db.execute(
                        f"SELECT {t} AS t, gpu, {agg}({used}) AS used, reserved, total, NULL"
                        " FROM sample_buckets WHERE run_id = ?"
                        f" GROUP BY gpu, CAST(({t} - ?) / ? AS INTEGER)", (run_id, start, width)):
                    sample = Sample(*r)
                    points[(sample.gpu, sample.t)] = sample
        return [points[k] for k in sorted(points)]

    @staticmethod
    def _backfill_buckets(db: sqlite3.Connection, run_id: int) -> bool:
        """Buckets for a run stored before they existed; False when it has no samples."""
        cursor = db.execute("SELECT t, gpu, used, reserved, total, util FROM samples"
                            " WHERE run_id = ?", (run_id,))
        found = False
        while rows := cursor.fetchmany(100_000):
            _merge_buckets(db, run_id, [tuple(r) for r in rows])
            found = True
        db.commit()
        return found

    def steps(self, run_id: int) -> list[Step]:
        with self.connect() as db:
            return [Step(*r) for r in db.execute(
                "SELECT t, step, total, loss, allocated, reserved FROM steps WHERE run_id = ?"
                " ORDER BY t", (run_id,))]

    def step_count(self, run_id: int) -> int:
        with self.connect() as db:
            return db.execute("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,)).fetchone()[0]

    def last_step(self, run_id: int) -> Step | None:
        with self.connect() as db:
            row = db.execute("SELECT t, step, total, loss, allocated, reserved FROM steps"
                             " WHERE run_id = ? ORDER BY t DESC LIMIT 1", (run_id,)).fetchone()
        return None if row is None else Step(*row)

    def messages(self, run_id: int) -> list[Message]:
        with self.connect() as db:
            return [Message(*r) for r in db.execute(
                "SELECT t, level, text FROM messages WHERE run_id = ? ORDER BY t", (run_id,))]

    def memory_before(self, run_id: int, gpu: int, t: float | None) -> int | None:
        """The last reading of `gpu` before time `t` (the end of a phase); None if there is none."""
        query = "SELECT used FROM samples WHERE run_id = ? AND gpu = ?"
        args: tuple = (run_id, gpu)
        if t is not None:
            query += " AND t <= ?"
            args += (t,)
        with self.connect() as db:
            row = db.execute(query + " ORDER BY t DESC LIMIT 1", args).fetchone()
        return None if row is None else row[0]

    def peak(self, run_id: int, gpu: int) -> int | None:
        """The highest reading, from the buckets' maxima (the live page asks every second);
        from the samples for a run stored before the buckets existed."""
        with self.connect() as db:
            peak = db.execute("SELECT MAX(used_max) FROM sample_buckets WHERE run_id = ? AND"
                              " gpu = ?", (run_id, gpu)).fetchone()[0]
            if peak is None:
                peak = db.execute("SELECT MAX(used) FROM samples WHERE run_id = ? AND gpu = ?",
                                  (run_id, gpu)).fetchone()[0]
        return peak
