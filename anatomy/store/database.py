"""The Store: one interface over two engines (SQLAlchemy Core): a SQLite file in WAL mode, one
writer (the collector) and any number of readers, or a PostgreSQL database that every host and
person of a team reaches.

A run can be read while it is written. Times are seconds since the run's start (the monotonic
clock, shared by all processes of one machine); memory is in bytes. The statements are SQL both
engines read, written with `?` (SQLite's own, kept as it was for SQLite's speed) and given to
psycopg as `%s`; the few SQLite answers with its own dialect (an aggregate's bare columns, rowid)
have PostgreSQL's beside them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, inspect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from anatomy.store import checks, forks, schema, tables
from anatomy.store.errors import DatabaseError, StoreError, StoreMissing, store_error
from anatomy.store.errors import read_only as _read_only
from anatomy.store.facts import Origin, Record, RunFacts, RunSource, TrainingSummary
from anatomy.store.liveness import Recorder, as_seen, is_alive
from anatomy.store.location import STORE_ENV, ServerUrl, default_store, resolve_path
from anatomy.store.rows import (
    HOST_STRIDE,
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
from anatomy.vocabulary import Backend, Edge, MemoryApi, Name, Status

__all__ = ["STORE_ENV", "Store", "default_store", "resolve_path"]


class Reference(Enum):
    """A run's reference rank: what a reader that names no rank is given (`_reference_rank`)."""
    RANK = "the reference rank"


REFERENCE = Reference.RANK

BUCKET_SECONDS = 0.1
# The coarser buckets (tables.coarse_buckets): level L is BUCKET_RATIO**L 0.1 s buckets wide, 0.4 s
# to 410 s. A chart of B buckets reads the coarsest level at most its bucket's width, so at most
# BUCKET_RATIO * B rows a GPU whatever the run's length (up to B * 410 s: 34 hours at B = 300).
BUCKET_RATIO = 4
LEVELS = range(1, 7)


def level_seconds(level: int) -> float:
    """How wide a bucket of `level` is (0: the 0.1 s ones of tables.sample_buckets)."""
    return BUCKET_SECONDS * BUCKET_RATIO**level
RESERVE_BYTES = 256 * 1024  # a run's end takes a few WAL frames of 4 KiB: room for dozens
CONNECT_SECONDS = 10  # a database server that does not answer is said so, not waited on
SERVER_POOL = 4  # connections a process keeps open to a server (a write or a page's reads)


# psycopg logs (its "psycopg" logger) what it ignores while ending a COPY the server cut off,
# beside the error it raises, which anatomy words; with no handler of the program's, Python's
# last resort printed it on the user's terminal ("error ignored terminating <psycopg.Copy [BAD]
# at 0x…>: the connection is lost"). A library's NullHandler, as logging's HOWTO has libraries
# do: a program that configures logging still gets the record.
logging.getLogger("psycopg").addHandler(logging.NullHandler())


class Db:
    """One connection in its transaction, spoken to in `?`-SQL whatever the engine."""

    def __init__(self, connection: Connection):
        self.connection = connection
        self.postgres = connection.dialect.name == "postgresql"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, args: Sequence = ()):
        return self.connection.exec_driver_sql(self._sql(sql), tuple(args))

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        if rows:
            self.connection.exec_driver_sql(self._sql(sql), [tuple(r) for r in rows])

    def append(self, table, rows: Sequence[Sequence]) -> None:
        """Rows of all `table`'s columns, added in this transaction: PostgreSQL's COPY (a
        statement per row, executemany's way, took a server ~12 s for 40,000 samples on a
        loaded machine, docs/BENCHMARKS.md), SQLite's executemany."""
        if not rows:
            return
        if not self.postgres:
            self.executemany(_insert(table), rows)
            return
        import psycopg

        names = ", ".join(f'"{c.name}"' for c in table.columns)
        statement = f"COPY {table.name} ({names}) FROM STDIN"
        if not self.connection.in_transaction():
            # The COPY goes by the driver's own cursor, which SQLAlchemy does not see: without a
            # transaction begun on its side, its commit does nothing and the pool's rollback
            # drops the rows (a batch of the device panel alone, no sample beside it).
            self.connection.begin()
        raw = self.connection.connection.driver_connection
        try:
            with raw.cursor() as cursor, cursor.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)
        except psycopg.Error as error:  # as SQLAlchemy raises what it runs: a DatabaseError
            if raw.broken or raw.closed:  # the server went: never handed out again
                self.connection.invalidate(error)
            raise DBAPIError.instance(statement, None, error, psycopg.Error) from None

    def commit(self) -> None:
        self.connection.commit()


def _insert(table, columns: Sequence[str] | None = None) -> str:
    """An INSERT of `table`'s columns (all, in their declared order, or those named), from the
    one declaration (store/tables.py)."""
    names = columns or [c.name for c in table.columns if c.autoincrement is not True]
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"INSERT INTO {table.name} ({quoted}) VALUES ({', '.join('?' * len(names))})"


def _insert_samples(db: Db, run_id: int, samples: Sequence[Sample]) -> None:
    """The samples, and their buckets' min and max at every level."""
    db.append(tables.samples, [(run_id, *s) for s in samples])
    _merge_buckets(db, run_id, samples)


def _merge_buckets(db: Db, run_id: int, samples: Sequence[Sample]) -> None:
    """Fold samples into their buckets' min and max (merged with what a bucket already holds),
    the 0.1 s ones and the coarser levels'."""
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
    db.executemany(BUCKET_MERGE,
                   [(run_id, gpu, index, *values) for (gpu, index), values in buckets.items()])
    _merge_coarse(db, run_id, buckets)


def _merge_coarse(db: Db, run_id: int, buckets: Mapping[tuple[int, int], Sequence]) -> None:
    """Fold 0.1 s buckets ((gpu, index): [t_min, used_min, t_max, used_max, reserved, total])
    into every coarser level's: a few rows a batch, not a pass over the samples again."""
    coarse: dict[tuple[int, int, int], list] = {}
    for (gpu, index), (t_min, used_min, t_max, used_max, reserved, total) in buckets.items():
        for level in LEVELS:
            key = (level, gpu, index // BUCKET_RATIO**level)
            bucket = coarse.get(key)
            if bucket is None:
                coarse[key] = [t_min, used_min, t_max, used_max, reserved, total]
                continue
            if used_min < bucket[1]:
                bucket[0:2] = t_min, used_min
            if used_max > bucket[3]:
                bucket[2:4] = t_max, used_max
    db.executemany(COARSE_MERGE, [(run_id, *key, *values) for key, values in coarse.items()])


def _bucket_merge(table, keys: str) -> str:
    """An upsert of a bucket's row that keeps the lower min and the higher max, each at its
    own time."""
    name = table.name
    return (_insert(table) + f" ON CONFLICT ({keys}) DO UPDATE SET"
            f" t_min = CASE WHEN excluded.used_min < {name}.used_min THEN excluded.t_min"
            f" ELSE {name}.t_min END,"
            f" used_min = CASE WHEN excluded.used_min < {name}.used_min THEN excluded.used_min"
            f" ELSE {name}.used_min END,"
            f" t_max = CASE WHEN excluded.used_max > {name}.used_max THEN excluded.t_max"
            f" ELSE {name}.t_max END,"
            f" used_max = CASE WHEN excluded.used_max > {name}.used_max THEN excluded.used_max"
            f" ELSE {name}.used_max END")


STEP_INSERT = _insert(tables.steps)
MESSAGE_INSERT = _insert(tables.messages)
PHASE_INSERT = _insert(tables.phases)
BUCKET_MERGE = _bucket_merge(tables.sample_buckets, "run_id, gpu, bucket")
COARSE_MERGE = _bucket_merge(tables.coarse_buckets, "run_id, level, gpu, bucket")
SAMPLE_COLUMNS = ", ".join(Sample._fields)


def _columns(db: Db, table: str) -> set[str]:
    """The columns `table` has in this store: one opened read-only is not migrated."""
    return {c["name"] for c in inspect(db.connection).get_columns(table)}


def _json(value: Record | Mapping) -> str:
    """A record (or its JSON as a dict, as tests and tools write a store) as its column's JSON."""
    return json.dumps(value.to_dict() if isinstance(value, Record) else value)


E = TypeVar("E", bound=Name)


def _member(kind: type[E], value: str | None) -> E | str | None:
    """A stored name as its enum member; a name this anatomy does not know stays as stored."""
    return kind._value2member_map_.get(value, value) if value is not None else None


# The connection each thread's Store.snapshot() holds, by the store's id().
_PINNED = threading.local()


def _stored_object(text: str | None) -> dict[str, Any]:
    """A run's JSON column as its object; {} for text that is no JSON object (a row damaged or
    edited by hand): one such row must not hide every other run from every reader."""
    try:
        value = json.loads(text) if text else {}
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def _check_folder(path: Path) -> None:
    """A store named by the user (--store, $ANATOMY_STORE, `anatomy.start(store=…)`) lives in a
    folder that exists, as `--output`'s file does: a mistyped path made its folders (and an
    empty store) where nobody looks. The default store's folder is anatomy's own, made when
    missing."""
    folder = path.parent
    if folder.is_dir() or path == default_store():
        return
    if folder.exists():
        raise StoreError(path, f"{folder} is not a directory")
    raise StoreError(path, f"its directory {folder} does not exist")


# A process's engines, one per store and mode: a server's keeps its few connections open. A
# fork never inherits them in use (forks.py); the child drops the parent's idle ones unclosed.
_ENGINES: dict[tuple[str, bool, bool], Engine] = {}
_SERVER_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [e.dispose(close=False) for e in _SERVER_ENGINES])


def _sqlite_engine(path: Path, read_only: bool, immutable: bool) -> Engine:
    """A connection per use, as SQLite's locks live in the process (forks.py): WAL and NORMAL
    sync for a writer, foreign keys always; a read-only open writes nothing, not even the mode."""
    mode = "ro" if read_only else "rw"  # never made again here: a store deleted while in use is
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode={mode}"  # gone, not a new one
    uri += "&immutable=1" if immutable else ""

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
        if not read_only:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    return create_engine("sqlite+pysqlite://", creator=connect, poolclass=NullPool)


def _server_engine(url: ServerUrl, read_only: bool) -> Engine:
    """psycopg 3 through libpq: its environment (PGPASSWORD, PGSSLMODE, PGSERVICEFILE, ~/.pgpass)
    fills what the URL leaves out, as for psql."""
    options = {"connect_timeout": CONNECT_SECONDS, "application_name": "anatomy"}
    if read_only:
        options["options"] = "-c default_transaction_read_only=on"
    engine = create_engine(url.driver(), connect_args=options, pool_size=SERVER_POOL, max_overflow=8,
                           pool_pre_ping=True, hide_parameters=True)
    _SERVER_ENGINES.add(engine)
    return engine


def _engine(where: Path | ServerUrl, read_only: bool, immutable: bool = False) -> Engine:
    key = (where.secret() if isinstance(where, ServerUrl) else str(where.absolute()),
           read_only, immutable)
    engine = _ENGINES.get(key)
    if engine is None:
        engine = _ENGINES[key] = (_server_engine(where, read_only) if isinstance(where, ServerUrl)
                                  else _sqlite_engine(where, read_only, immutable))
    return engine


class Store:
    """A run store. `read_only` opens it without writing anything (no schema, no journal mode),
    as `runs`, `show` and `export` do: a store on read-only media lists, and another program's
    database stays as it was. StoreError (one line: where and why) when it cannot be opened or is
    not anatomy's; StoreMissing for a read-only open of a store that does not exist.

    `path` is the file's Path, or the database's ServerUrl (printed with its password masked)."""

    def __init__(self, path: str | os.PathLike | ServerUrl | None = None, read_only: bool = False):
        self.path = resolve_path(path)
        self.read_only = read_only
        self._immutable = False  # read-only media: SQLite cannot make the WAL's index beside it
        if isinstance(self.path, ServerUrl):
            self._open_server()
            return
        if self.path.is_dir():
            raise StoreError(self.path, "it is a directory, not a store file")
        _check_folder(self.path)
        if read_only:
            if not self.path.exists():
                raise StoreMissing(self.path, "no store there yet")
            self._open_read_only()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)  # the default's (_check_folder)
        except OSError as error:
            raise StoreError(self.path, f"its directory cannot be made: {error.strerror}") from None
        try:  # made here, not by SQLite, whose "unable to open" of a new file reads as one gone
            if not self.path.exists():  # one there is left as it is: on read-only media, touching
                self.path.touch()       # it said "it cannot be made" of a store that was there
        except OSError as error:
            raise StoreError(self.path, f"it cannot be made: {error.strerror}") from None
        try:
            with forks.connection(), _engine(self.path, True).connect() as probe:
                schema.check(probe, self.path)  # read-only: before a pragma changes the file
            with self.connect() as db:
                db.execute("BEGIN IMMEDIATE")  # one process makes or migrates it, the others wait
                schema.migrate(db.connection, self.path)
        except DatabaseError as error:
            raise store_error(self.path, error) from None

    def _open_server(self) -> None:
        """A PostgreSQL database: reached (or said why not in one line), anatomy's or empty, and
        at this release's schema (made or migrated when written, refused when newer)."""
        try:
            with self.connect() as db:
                if self.read_only:
                    names = schema.check(db.connection, self.path)
                    if "runs" not in names:
                        raise StoreMissing(self.path, "no store there yet (the database holds no"
                                                      " run table)")
                    schema.refuse_newer(self.path, schema.revision(db.connection, names))
                else:
                    schema.migrate(db.connection, self.path)
        except DatabaseError as error:
            raise store_error(self.path, error) from None

    def _open_read_only(self) -> None:
        try:
            with self.connect() as db:
                names = schema.check(db.connection, self.path)
                if not names:  # an empty file, or one whose schema is being written
                    raise StoreMissing(self.path, "no store there yet (the file holds no table)")
                schema.refuse_newer(self.path, schema.revision(db.connection, names))
        except DatabaseError as error:
            name = getattr(error.orig, "sqlite_errorname", "")
            if name != "SQLITE_CANTOPEN" or self._immutable:
                raise store_error(self.path, error) from None
            # A WAL store on read-only media: readable only as immutable (nothing can write it)
            self._immutable = True
            self._open_read_only()

    def writable(self) -> bool:
        """Whether this process may write the store: a file (and its folder, for SQLite's
        journal) it may write on media that are not read-only; a database role granted
        INSERT, UPDATE and DELETE on the runs."""
        if self.read_only and not isinstance(self.path, ServerUrl):
            return not _read_only(self.path)
        if isinstance(self.path, ServerUrl):
            with self.connect() as db:
                return bool(db.execute("SELECT has_table_privilege('runs', 'INSERT, UPDATE,"
                                       " DELETE')").scalar())
        return not _read_only(self.path)

    @property
    def engine_name(self) -> str:
        """"sqlite" or "postgresql"."""
        return "postgresql" if isinstance(self.path, ServerUrl) else "sqlite"

    def locator(self) -> str:
        """What --store or $ANATOMY_STORE takes to reach this store from a process of the same
        run (a watched command's ranks): the file, or the URL with its password. Never printed."""
        return self.path.secret() if isinstance(self.path, ServerUrl) else str(self.path)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read of this thread inside sees the store as one moment left it (one read
        transaction): an export read while another process deletes the run is the whole run,
        not its samples without the steps deleted between two reads. Reads only."""
        if self._in_snapshot():  # inside one already
            yield
            return
        with self.connect() as db:
            if db.postgres:
                db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            else:
                db.execute("BEGIN")
            db.execute("SELECT 1 FROM runs LIMIT 1")  # the moment: the first read
            pinned = _PINNED.__dict__.setdefault("connections", {})
            pinned[id(self)] = db
            try:
                yield
            finally:
                del pinned[id(self)]
                db.connection.rollback()

    def _in_snapshot(self) -> bool:
        return id(self) in _PINNED.__dict__.get("connections", {})

    @contextmanager
    def connect(self) -> Iterator[Db]:
        """A connection in one transaction: committed when the block ends, rolled back when it
        raises."""
        pinned = _PINNED.__dict__.get("connections", {}).get(id(self))
        if pinned is not None:  # inside snapshot(): its transaction, left open
            yield pinned
            return
        engine = _engine(self.path, self.read_only, self._immutable)
        with forks.connection():  # a fork of this process waits until it is closed
            with engine.connect() as connection:
                db = Db(connection)
                yield db
                if connection.in_transaction():
                    connection.commit()

    # --- room to record a run's end on a full disk ---
    def _reserve_path(self, run_id: int) -> Path:
        return self.path.with_name(f"{self.path.name}-reserve-{run_id}")

    def reserve(self, run_id: int) -> None:
        """Hold RESERVE_BYTES beside the store while the run lasts: if the disk fills, freeing
        them leaves room to record how the run ended. Without room for it, nothing is held; a
        database server's disk is not this machine's to hold."""
        if isinstance(self.path, ServerUrl):
            return
        try:
            with open(self._reserve_path(run_id), "wb", buffering=0) as out:
                out.write(os.urandom(RESERVE_BYTES))  # random: a compressing file system keeps it
        except OSError:
            self.free_reserve(run_id)

    def free_reserve(self, run_id: int) -> None:
        if isinstance(self.path, ServerUrl):
            return
        try:
            self._reserve_path(run_id).unlink(missing_ok=True)
        except OSError:
            pass

    def identity(self) -> str | None:
        """The store's random id (None for a read-only store written before ids existed)."""
        with self.connect() as db:
            if "store_info" not in inspect(db.connection).get_table_names():
                return None
            row = db.execute("SELECT value FROM store_info WHERE key = 'id'").fetchone()
        return None if row is None else row[0]

    # --- writing (the collector, or the manager before a run starts) ---
    def create_run(self, options: dict, backend: Backend, memory_api: MemoryApi | None, gpu: int,
                   environment: RunFacts | Mapping, name: str | None = None,
                   sweep: str | None = None, source: RunSource | Mapping | None = None,
                   preset: str | None = None, recorder: Recorder | None = None) -> int:
        """A new run, running; `preset` is the model's name as lists show it (default: the
        options' preset); `recorder` the process that records it (default: this one)."""
        recorder = recorder or Recorder.here()
        with self.connect() as db:
            cursor = db.execute(
                _insert(tables.runs, ["name", "created_at", "status", "preset", "options",
                                      "environment", "backend", "memory_api", "gpu", "sweep",
                                      "source", "recorder"]) + " RETURNING id",
                (name, time.time(), Status.RUNNING, preset or options.get("model",
                                                                          options.get("preset")),
                 json.dumps(options), _json(environment), backend, memory_api, gpu, sweep,
                 _json(source or {}), json.dumps(recorder.to_dict())))
            return int(cursor.scalar())

    def update_run(self, run_id: int, **values: Any) -> None:
        if isinstance(values.get("recorder"), Recorder):
            values["recorder"] = values["recorder"].to_dict()
        for key in ("options", "environment", "summary", "source", "recorder"):
            if key in values and not isinstance(values[key], str):
                values[key] = _json(values[key])
        columns = ", ".join(f'"{tables.runs.c[k].name}" = ?' for k in values)
        with self.connect() as db:
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*values.values(), run_id))

    def merge_environment(self, run_id: int, extra: RunFacts | Mapping) -> None:
        """The run's facts with `extra`'s over them (facts reported later: the worker's torch
        and model, a watched command's ranks)."""
        if not isinstance(extra, RunFacts):
            extra = RunFacts.from_dict(extra, strict=False)
        self.update_run(run_id, environment=self.run(run_id).environment.merged(extra))

    def finish(self, run_id: int, status: Status, error: str | None = None) -> None:
        assert status in STATUSES
        self.update_run(run_id, status=status, error=error, ended_at=time.time())

    def write(self, run_id: int, samples: Sequence[Sample] = (), phases: Sequence[PhaseMark] = (),
              steps: Sequence[Step] = (), messages: Sequence[Message] = (),
              hosts: Sequence[HostStatus] = (), gpus: Sequence[GpuStatus] = (),
              processes: Sequence[GpuProcess] = ()) -> None:
        """One transaction for a batch of rows; `phases` are marks in arrival order."""
        with self.connect() as db:
            for table, rows in ((tables.host_status, hosts), (tables.gpu_status, gpus),
                                (tables.gpu_processes, processes)):
                db.append(table, [(run_id, *r) for r in rows])
            if samples:
                _insert_samples(db, run_id, samples)
            for mark in phases:
                if mark.edge == Edge.START:
                    db.execute(PHASE_INSERT, (run_id, mark.name, mark.t, None, mark.rank))
                else:
                    # The occurrence that is open: a phase named again (training, eval, training)
                    # keeps each occurrence's own end.
                    row = "ctid" if db.postgres else "rowid"  # each engine's own row address
                    db.execute(f'UPDATE phases SET "end" = ? WHERE {row} = (SELECT {row} FROM'
                               ' phases WHERE run_id = ? AND name = ? AND rank = ? AND "end" IS NULL'
                               f' ORDER BY start DESC, {row} DESC LIMIT 1)',
                               (mark.t, run_id, mark.name, mark.rank))
            db.executemany(STEP_INSERT, [(run_id, *s) for s in steps])
            db.executemany(MESSAGE_INSERT, [(run_id, *m) for m in messages])

    def delete_run(self, run_id: int) -> None:
        with self.connect() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def rename_run(self, run_id: int, name: str | None) -> bool:
        """False when there is no such run; ValueError for a name that is not one line of
        printable text (`checks.one_line`)."""
        if name is not None:
            checks.one_line(name, "name")
        with self.connect() as db:
            return db.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id)).rowcount > 0

    def set_tags(self, run_id: int, tags: Sequence[str]) -> bool:
        """Replace the run's tags (blank ones dropped, duplicates once); False when there is no
        such run. The column is comma-separated, so a tag cannot hold a comma."""
        clean = list(dict.fromkeys(t.strip() for t in tags if t.strip()))
        bad = [t for t in clean if not checks.is_tag(t)]
        if bad:
            raise ValueError(f"a tag cannot contain a comma: {bad[0]!r}")
        for tag in clean:
            checks.one_line(tag, "tag")
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
                    _insert(tables.runs, ["name", "created_at", "ended_at", "status", "preset",
                                          "options", "environment", "backend", "memory_api",
                                          "gpu", "summary", "error", "samples_sent", "tags",
                                          "sweep", "source", "origin"]) + " RETURNING id",
                    (run.name, run.created_at, run.ended_at, run.status, run.preset,
                     json.dumps(run.options), _json(run.environment), run.backend,
                     run.memory_api, run.gpu, _json(run.summary), run.error, run.samples_sent,
                     ",".join(run.tags), run.sweep, _json(run.source),
                     None if run.origin is None else _json(run.origin)))
                run_id = int(cursor.scalar())
                _insert_samples(db, run_id, record.samples)
                db.executemany(PHASE_INSERT, [(run_id, *p) for p in record.phases])
                db.executemany(STEP_INSERT, [(run_id, *s) for s in record.steps])
                db.executemany(MESSAGE_INSERT, [(run_id, *m) for m in record.messages])
                ids.append(run_id)
        return ids

    # --- sweeps (the sweep runner writes; the pages read progress from here) ---
    def create_sweep(self, name: str | None, base: dict, vary: dict, until_oom: bool,
                     planned: int) -> int:
        with self.connect() as db:
            cursor = db.execute(
                _insert(tables.sweeps, ["key", "name", "created_at", "base", "vary", "until_oom",
                                        "planned", "status", "pid"]) + " RETURNING id",
                (uuid.uuid4().hex, name, time.time(), json.dumps(base), json.dumps(vary),
                 int(until_oom), planned, Status.RUNNING, os.getpid()))
            return int(cursor.scalar())

    def update_sweep(self, sweep_id: int, **values: Any) -> None:
        columns = ", ".join(f'"{tables.sweeps.c[k].name}" = ?' for k in values)
        with self.connect() as db:
            db.execute(f"UPDATE sweeps SET {columns} WHERE id = ?", (*values.values(), sweep_id))

    @staticmethod
    def _sweep_row(row) -> SweepRow:
        values = {"pid": None, **row._mapping}  # a read-only store may predate the column
        vary = {k: v for k, v in _stored_object(values["vary"]).items() if isinstance(v, list)}
        values.update(base=_stored_object(values["base"]), vary=vary,
                      until_oom=bool(values["until_oom"]), status=_member(Status, values["status"]))
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
    def _run_row(row, as_recorded: bool = False) -> RunRow:
        """The row as readers see it (store/liveness.py: a run whose processes are gone has
        ended), or `as_recorded`, as it is written."""
        # A read-only store may predate the columns added since. What the store wrote is read
        # leniently: a value that fails its check stays as stored, unseen by readers.
        values = {"origin": None, "source": "{}", "recorder": None, **row._mapping}
        for launch in ("run_key", "host_count"):  # a run across hosts' (store/launches.py)
            values.pop(launch, None)
        values["options"] = _stored_object(values["options"])
        for key, kind in (("environment", RunFacts), ("summary", TrainingSummary),
                          ("source", RunSource)):
            values[key] = kind.from_dict(_stored_object(values[key]), strict=False)
        origin = _stored_object(values["origin"])
        values["origin"] = Origin.from_dict(origin, strict=False) if origin else None
        values["recorder"] = Recorder.from_dict(_stored_object(values["recorder"]))
        values["tags"] = tuple(t for t in (values["tags"] or "").split(",") if t)
        values["status"] = _member(Status, values["status"])
        values["backend"] = _member(Backend, values["backend"])
        values["memory_api"] = _member(MemoryApi, values["memory_api"])
        run = RunRow(**values)
        return run if as_recorded else as_seen(run)

    def run(self, run_id: int, as_recorded: bool = False) -> RunRow | None:
        """The run, as readers see it (or `as_recorded`: as it is written)."""
        with self.connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else self._run_row(row, as_recorded)

    def runs(self, as_recorded: bool = False) -> list[RunRow]:
        with self.connect() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY id DESC").fetchall()
        return [self._run_row(r, as_recorded) for r in rows]

    def find_runs(self, tag: str | None = None, preset: str | None = None,
                  status: str | None = None, sweep: str | None = None) -> list[RunRow]:
        """`runs()` narrowed to those with the tag, preset, status and sweep key given."""
        query, args = "SELECT * FROM runs WHERE 1 = 1", []
        for column, value in (("preset", preset), ("sweep", sweep)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        if status is not None:  # as readers see it: a run stored as running may have ended unsaid
            query += " AND status IN (?, ?)"
            args += [status, Status.RUNNING]
        with self.connect() as db:
            rows = db.execute(query + " ORDER BY id DESC", args).fetchall()
        runs = [self._run_row(r) for r in rows]
        return [r for r in runs if (status is None or r.status == status)
                and (tag is None or tag in r.tags)]  # whole tags only: "a" must not match "ab"

    def latest_running(self) -> RunRow | None:
        """The newest run that is being recorded still."""
        with self.connect() as db:
            rows = db.execute("SELECT * FROM runs WHERE status = ? ORDER BY id DESC",
                              (Status.RUNNING,)).fetchall()
        return next((run for run in map(self._run_row, rows) if is_alive(run)), None)

    def _ranked(self, db: Db, table: str) -> bool:
        """Whether `table` has its `rank` column: a store opened read-only is not migrated, and
        one written before several processes existed has none (every row is rank 0's)."""
        known = self.__dict__.setdefault("_rank_columns", {})
        if table not in known:
            known[table] = "rank" in _columns(db, table)
        return known[table]

    def _step_columns(self, db: Db, rank_column: str) -> str:
        """A Step's columns, in its order: a store opened read-only is not migrated, and one
        written before steps had a sequence length reads None for it."""
        known = self.__dict__.setdefault("_seq_len_column", {})
        if "steps" not in known:
            known["steps"] = "seq_len" in _columns(db, "steps")
        return (f"t, step, total, loss, allocated, reserved, {rank_column}, "
                + ("seq_len" if known["steps"] else "NULL"))

    def _rank_clause(self, db: Db, table: str, rank: int | None | Reference,
                     run_id: int) -> tuple[str, str, tuple]:
        """(the rank column to select, the condition, its argument) for rows of `rank` (None:
        every rank's; REFERENCE: the run's reference rank's)."""
        if rank is REFERENCE:
            rank = self._reference_rank(db, run_id)
        if not self._ranked(db, table):
            return "0", ("" if rank in (None, 0) else " AND 0"), ()
        if rank is None:
            return "rank", "", ()
        return "rank", " AND rank = ?", (rank,)

    def phases(self, run_id: int, rank: int | None | Reference = REFERENCE) -> list[PhaseSpan]:
        """The phases of one training process (by default the run's reference rank, `ranks`'
        first; None: every rank's) in order; end_s is None while a phase lasts."""
        with self.connect() as db:
            column, where, args = self._rank_clause(db, "phases", rank, run_id)
            rows = db.execute(f'SELECT name, start, "end", {column} FROM phases WHERE run_id = ?'
                              f"{where} ORDER BY start", (run_id, *args)).fetchall()
        return [PhaseSpan(*r) for r in rows]

    def ranks(self, run_id: int) -> list[int]:
        """The training processes that marked a phase or reported a step ([0] for one); the
        first is the run's reference rank (`_reference_rank`)."""
        with self.connect() as db:
            if not self._ranked(db, "phases"):
                return [0]
            rows = db.execute("SELECT rank FROM phases WHERE run_id = ? UNION SELECT rank FROM"
                              " steps WHERE run_id = ? ORDER BY rank", (run_id, run_id)).fetchall()
        return [r[0] for r in rows] or [0]

    def _reference_rank(self, db: Db, run_id: int) -> int:
        """The rank a run's readers see by default, where a reader names none (its report, its
        phase table, its steps): the lowest that marked a phase or reported a step. Rank 0 of
        nearly every run; not of a launch under `watch` whose rank 0 never called
        anatomy.start(), where rank 0's empty table was shown."""
        if not self._ranked(db, "phases"):
            return 0
        lowest = db.execute("SELECT MIN(rank) FROM phases WHERE run_id = ?", (run_id,)).fetchone()[0]
        if lowest != 0:  # rank 0 marked no phase: a lower rank may have reported steps alone
            stepped = db.execute("SELECT MIN(rank) FROM steps WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
            lowest = min((r for r in (lowest, stepped) if r is not None), default=0)
        return lowest

    def close_phases(self, run_id: int, t: float, rank: int | None = None) -> None:
        """A worker that died mid-phase: its open phases (one rank's, or every rank's) end at
        `t` (its last sample) — or where they began, never before: a watched command that exited
        before the recording first saw it alive (`true`) has its "process" phase begun after
        the last time it was seen (0.0), and a phase ending before it begins is refused by
        every import of its export."""
        with self.connect() as db:
            _, where, args = self._rank_clause(db, "phases", rank, run_id)
            latest = "GREATEST" if db.postgres else "MAX"
            db.execute(f'UPDATE phases SET "end" = {latest}(?, start) WHERE run_id = ?'
                       f' AND "end" IS NULL{where}', (t, run_id, *args))

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

    def latest_samples(self, run_id: int) -> list[Sample]:
        """Each device's last sample."""
        with self.connect() as db:
            if db.postgres:
                return [Sample(*r) for r in db.execute(
                    f"SELECT DISTINCT ON (gpu) {SAMPLE_COLUMNS} FROM samples WHERE run_id = ?"
                    " ORDER BY gpu, t DESC", (run_id,))]
            # SQLite fills the bare columns from the row that holds the MAX.
            return [Sample(*r) for r in db.execute(
                "SELECT MAX(t), gpu, used, reserved, total, util FROM samples WHERE run_id = ?"
                " GROUP BY gpu ORDER BY gpu", (run_id,))]

    def _top_level(self, db: Db, run_id: int) -> int | None:
        """The coarsest bucket level the run holds; None where it has no coarse buckets: a store
        at an older schema opened read-only (not migrated), a run stored before the buckets."""
        known = self.__dict__.setdefault("_coarse_table", {})
        if "coarse_buckets" not in known:
            known["coarse_buckets"] = inspect(db.connection).has_table("coarse_buckets")
        if not known["coarse_buckets"]:
            return None
        held = db.execute("SELECT 1 FROM coarse_buckets WHERE run_id = ? AND level = ? LIMIT 1",
                          (run_id, LEVELS[-1])).fetchone()
        return None if held is None else LEVELS[-1]

    @staticmethod
    def _devices(run_id: int, top: int | None) -> tuple[str, tuple]:
        """A query of the run's devices (and its arguments), from its coarsest buckets: a few
        rows a device, where a DISTINCT over its 0.1 s buckets read 192,000 at 19 million
        samples."""
        if top is None:
            return "SELECT DISTINCT gpu FROM sample_buckets WHERE run_id = ?", (run_id,)
        return "SELECT DISTINCT gpu FROM coarse_buckets WHERE run_id = ? AND level = ?", (run_id, top)

    def last_time(self, run_id: int) -> float:
        """The run's latest sample's time: each device's from the index (its devices read from
        the buckets), not a scan of every sample, which took seconds of a server's time at 19
        million (docs/BENCHMARKS.md); a run stored before the buckets is scanned."""
        with self.connect() as db:
            devices, args = self._devices(run_id, self._top_level(db, run_id))
            return db.execute(
                "SELECT COALESCE((SELECT MAX((SELECT MAX(t) FROM samples WHERE run_id = ? AND"
                f" gpu = devices.gpu)) FROM ({devices}) AS devices), (SELECT MAX(t) FROM samples"
                " WHERE run_id = ?), 0)", (run_id, *args, run_id)).fetchone()[0]

    def decimated(self, run_id: int, buckets: int = 2000, gpu: int | None = None
                  ) -> list[Sample]:
        """Per GPU (`gpu` alone, if given), at most ~2 points per time bucket: the bucket's min
        and its max, at their own times. Every peak survives, and a run of a million samples
        draws like a short one: it is read from the coarsest min/max buckets the store keeps
        that are no wider than the chart's (at most BUCKET_RATIO rows a chart's bucket), not
        from the samples."""
        only, args = ("", ()) if gpu is None else (" AND gpu = ?", (gpu,))
        with self.connect() as db:
            top = self._top_level(db, run_id)
            span = self._span(db, run_id, top)
            if span[2] == 0:
                # A run stored before the buckets existed, read as it is: where nothing may be
                # written (a snapshot only reads)
                if self.read_only or self._in_snapshot():
                    return [Sample(*r) for r in db.execute(
                        "SELECT t, gpu, used, reserved, total, util FROM samples WHERE run_id = ?"
                        f"{only} ORDER BY gpu, t", (run_id, *args))]
                if not self._backfill_buckets(db, run_id):
                    return []
                top = self._top_level(db, run_id)
                span = self._span(db, run_id, top)
            start, width = span[0], max((span[1] - span[0]) / buckets, 1e-9)
            gpus = 1 if gpu is not None else span[2]
            # Whether the samples are few, counted no further than that: a count of them all
            # took seconds of a server's time at 19 million (docs/BENCHMARKS.md)
            few = 2 * buckets * max(1, gpus)
            count = db.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM samples WHERE run_id = ?"
                               f"{only} LIMIT ?) AS first_ones", (run_id, *args, few + 1)).fetchone()[0]
            if count <= few:
                rows = db.execute("SELECT t, gpu, used, reserved, total, util FROM samples"
                                  f" WHERE run_id = ?{only} ORDER BY gpu, t",
                                  (run_id, *args)).fetchall()
                return [Sample(*r) for r in rows]
            level = max((lv for lv in LEVELS if top is not None and level_seconds(lv) <= width),
                        default=0)
            table = "sample_buckets" if level == 0 else "coarse_buckets"
            if level:
                only, args = " AND level = ?" + only, (level, *args)
            points = {}
            if db.postgres:
                # Each part's lowest and highest reading at its time, in one pass: the lowest
                # (used, t) pair is MIN of the arrays (two DISTINCT ON sorts took 2.7 s of a
                # loaded server at 19 million samples, this 0.7 s); reserved and total, the
                # part's highest
                for row in db.execute(
                        "SELECT gpu, MIN(ARRAY[used_min, t_min]), MAX(ARRAY[used_max, t_max]),"
                        f" MAX(reserved), MAX(total) FROM {table} WHERE run_id = ?"
                        f"{only} GROUP BY gpu, FLOOR((t_min - ?) / ?)",
                        (run_id, *args, start, width)):
                    gpu, reserved, total = row[0], row[3], row[4]
                    for used, t in (row[1], row[2]):
                        points[(gpu, t)] = Sample(t, gpu, int(used), reserved, total, None)
                return [points[k] for k in sorted(points)]
            for t, used, agg in (("t_min", "used_min", "MIN"), ("t_max", "used_max", "MAX")):
                # SQLite fills the bare columns from the row that holds the MIN / MAX.
                for r in db.execute(f"SELECT {t} AS t, gpu, {agg}({used}) AS used, reserved, total,"
                                    f" NULL FROM {table} WHERE run_id = ?{only}"
                                    f" GROUP BY gpu, CAST(({t} - ?) / ? AS INTEGER)",
                                    (run_id, *args, start, width)):
                    sample = Sample(*r)
                    points[(sample.gpu, sample.t)] = sample
        return [points[k] for k in sorted(points)]

    def _span(self, db: Db, run_id: int, top: int | None) -> tuple[float, float, int]:
        """(the first sample's time, the last's, the devices) of a run's bucketed samples: each
        device's ends from the samples' index; (None, None, 0) without buckets."""
        devices, args = self._devices(run_id, top)
        return db.execute(
            "SELECT MIN((SELECT MIN(t) FROM samples WHERE run_id = ? AND gpu = devices.gpu)),"
            " MAX((SELECT MAX(t) FROM samples WHERE run_id = ? AND gpu = devices.gpu)), COUNT(*)"
            f" FROM ({devices}) AS devices", (run_id, run_id, *args)).fetchone()

    @staticmethod
    def _backfill_buckets(db: Db, run_id: int) -> bool:
        """Buckets for a run stored before they existed; False when it has no samples."""
        cursor = db.execute("SELECT t, gpu, used, reserved, total, util FROM samples"
                            " WHERE run_id = ?", (run_id,))
        found = False
        while rows := cursor.fetchmany(100_000):
            _merge_buckets(db, run_id, [tuple(r) for r in rows])
            found = True
        db.commit()
        return found

    def steps(self, run_id: int, rank: int | None | Reference = REFERENCE) -> list[Step]:
        """One training process's steps (the run's reference rank's by default; None: every
        rank's)."""
        with self.connect() as db:
            column, where, args = self._rank_clause(db, "steps", rank, run_id)
            return [Step(*r) for r in db.execute(
                f"SELECT {self._step_columns(db, column)} FROM steps"
                f" WHERE run_id = ?{where} ORDER BY t", (run_id, *args))]

    def step_span(self, run_id: int, first_step: int, rank: int | Reference = REFERENCE
                  ) -> tuple[Step, Step] | None:
        """One process's first step numbered `first_step` or later and its last step (two rows,
        however long the run); None without such steps."""
        with self.connect() as db:
            column, where, args = self._rank_clause(db, "steps", rank, run_id)
            query = (f"SELECT {self._step_columns(db, column)} FROM steps"
                     f" WHERE run_id = ? AND step >= ?{where} ORDER BY t")
            first = db.execute(query + " LIMIT 1", (run_id, first_step, *args)).fetchone()
            last = db.execute(query + " DESC LIMIT 1", (run_id, first_step, *args)).fetchone()
        return None if first is None else (Step(*first), Step(*last))

    def step_spans(self, run_id: int, first_step: int) -> dict[int, tuple[Step, Step]]:
        """`step_span` of every rank, by rank, in one connection."""
        with self.connect() as db:
            column, _, _ = self._rank_clause(db, "steps", None, run_id)
            selected = self._step_columns(db, column)
            if db.postgres:  # each rank's row that holds the MIN / MAX, told by DISTINCT ON
                queries = [f"SELECT DISTINCT ON ({column}) {selected} FROM steps WHERE run_id = ?"
                           f" AND step >= ? ORDER BY {column}, t {order}"
                           for order in ("ASC", "DESC")]
            else:  # SQLite fills the bare columns from the row that holds the MIN / MAX.
                queries = [f"SELECT {selected}, {agg}(t) FROM steps WHERE run_id = ?"
                           f" AND step >= ? GROUP BY {column}" for agg in ("MIN", "MAX")]
            ends = [{row[6]: Step(*row[:8]) for row in db.execute(query, (run_id, first_step))}
                    for query in queries]
        return {rank: (first, ends[1][rank]) for rank, first in ends[0].items()}

    def step_count(self, run_id: int, rank: int | None | Reference = REFERENCE) -> int:
        with self.connect() as db:
            _, where, args = self._rank_clause(db, "steps", rank, run_id)
            return db.execute(f"SELECT COUNT(*) FROM steps WHERE run_id = ?{where}",
                              (run_id, *args)).fetchone()[0]

    def last_step(self, run_id: int, rank: int | None | Reference = REFERENCE) -> Step | None:
        with self.connect() as db:
            column, where, args = self._rank_clause(db, "steps", rank, run_id)
            row = db.execute(f"SELECT {self._step_columns(db, column)}"
                             f" FROM steps WHERE run_id = ?{where} ORDER BY t DESC LIMIT 1",
                             (run_id, *args)).fetchone()
        return None if row is None else Step(*row)

    def host_status(self, run_id: int, since: float = 0.0) -> list[HostStatus]:
        with self.connect() as db:
            return [HostStatus(*r) for r in db.execute(
                "SELECT t, cpu_percent, ram_used, ram_total, host FROM host_status WHERE run_id = ?"
                " AND t >= ? ORDER BY host, t", (run_id, since))]

    def gpu_status(self, run_id: int, since: float = 0.0) -> list[GpuStatus]:
        with self.connect() as db:
            return [GpuStatus(*r) for r in db.execute(
                "SELECT t, gpu, util, power_w, power_limit_w, temperature_c FROM gpu_status"
                " WHERE run_id = ? AND t >= ? ORDER BY gpu, t", (run_id, since))]

    def gpu_processes(self, run_id: int, at: float | None = None) -> list[GpuProcess]:
        """The processes on the GPUs at the last reading (at or before `at`, if given): each
        host's last, on a run across hosts (its GPUs' keys: store.device_key)."""
        with self.connect() as db:
            last = {host: t for host, t in db.execute(
                f"SELECT gpu / {HOST_STRIDE}, MAX(t) FROM gpu_processes WHERE run_id = ? AND"
                f" t <= ? GROUP BY gpu / {HOST_STRIDE}", (run_id, math.inf if at is None else at))}
            if not last:
                return []
            marks = ", ".join("?" * len(set(last.values())))
            rows = [GpuProcess(*r) for r in db.execute(
                "SELECT t, gpu, pid, name, used FROM gpu_processes WHERE run_id = ? AND t IN"
                f" ({marks}) ORDER BY gpu, used DESC NULLS LAST", (run_id, *set(last.values())))]
            return [r for r in rows if last.get(r.gpu // HOST_STRIDE) == r.t]

    def messages(self, run_id: int) -> list[Message]:
        with self.connect() as db:
            return [Message(*r) for r in db.execute(
                "SELECT t, level, text FROM messages WHERE run_id = ? ORDER BY t", (run_id,))]

    def memory_before(self, run_id: int, gpu: int, t: float | None) -> int | None:
        """The last reading of `gpu` before time `t` (the end of a phase); None if there is none."""
        return self.readings_before(run_id, [(gpu, t)])[0]

    def readings_before(self, run_id: int, points: Sequence[tuple[int, float | None]]
                        ) -> list[int | None]:
        """`memory_before` of each (device, time) point, in one connection: a run of 64 ranks
        has hundreds of phase ends."""
        out = []
        with self.connect() as db:
            for gpu, t in points:
                row = db.execute("SELECT used FROM samples WHERE run_id = ? AND gpu = ? AND t <= ?"
                                 " ORDER BY t DESC LIMIT 1",
                                 (run_id, gpu, math.inf if t is None else t)).fetchone()
                out.append(None if row is None else row[0])
        return out

    def peak(self, run_id: int, gpu: int, before: float | None = None) -> int | None:
        """The highest reading (of those taken before time `before`, if given): from the buckets'
        maxima (the live page asks every second), the samples of the bucket `before` cuts
        through, and the samples for a run stored before the buckets existed."""
        return self.peaks(run_id, [gpu], before)[gpu]

    def peaks(self, run_id: int, gpus: Sequence[int], before: float | None = None
              ) -> dict[int, int | None]:
        """`peak` of each device, in one connection: the whole run's from its coarsest buckets;
        before a time, from the coarsest buckets wholly before it, then finer ones up to it."""
        edge = None if before is None else math.floor(before / BUCKET_SECONDS)
        found: dict[int, int] = {}
        if not gpus:
            return {}
        marks = ", ".join("?" * len(gpus))

        def highest(table: str, where: str, args: tuple) -> None:
            for gpu, peak in db.execute(f"SELECT gpu, MAX(used_max) FROM {table} WHERE run_id = ?"
                                        f" AND gpu IN ({marks}){where} GROUP BY gpu",
                                        (run_id, *gpus, *args)):
                if peak is not None:
                    found[gpu] = max(found.get(gpu, peak), peak)

        with self.connect() as db:
            top = self._top_level(db, run_id)
            if edge is None:
                if top is None:
                    highest("sample_buckets", "", ())
                else:
                    highest("coarse_buckets", " AND level = ?", (top,))
            else:
                covered = 0  # the 0.1 s buckets read so far: those before it
                for level in reversed(LEVELS) if top is not None else ():
                    ratio = BUCKET_RATIO**level
                    whole = edge // ratio  # this level's buckets wholly before the edge
                    if whole * ratio > covered:
                        highest("coarse_buckets", " AND level = ? AND bucket >= ? AND bucket < ?",
                                (level, covered // ratio, whole))
                        covered = whole * ratio
                highest("sample_buckets", " AND bucket >= ? AND bucket < ?", (covered, edge))
            out = {}
            for gpu in gpus:
                peak = found.get(gpu)
                if before is not None:
                    # From a bucket early: a sample of bucket `edge` (floor(t / 0.1)) may lie
                    # below edge * 0.1 by a rounding (1.7 s is bucket 17; 17 * 0.1 > 1.7), and a
                    # maximum over more of the samples before the time is the same maximum.
                    cut = db.execute("SELECT MAX(used) FROM samples WHERE run_id = ? AND gpu = ?"
                                     " AND t >= ? AND t < ?",
                                     (run_id, gpu, (edge - 1) * BUCKET_SECONDS, before)).fetchone()[0]
                    peak = max((p for p in (peak, cut) if p is not None), default=None)
                if peak is None:
                    peak = db.execute("SELECT MAX(used) FROM samples WHERE run_id = ? AND gpu = ?"
                                      " AND t < ?", (run_id, gpu, math.inf if before is None
                                                     else before)).fetchone()[0]
                out[gpu] = peak
        return out
