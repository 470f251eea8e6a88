"""A run across hosts, in the store every host of its launch shares (PostgreSQL): found by the
launch's key (torchrun's rendezvous id, or ANATOMY_RUN_KEY), made by the first host to arrive and
joined by the others, race-free (the key is unique among running runs: insert, else select); a
row per host (`run_hosts`) that says when it last beat and how its part ended. Every host writes
its own GPUs' samples and its ranks' phases and steps into the one run; the last host to end
writes the run's ending, from every host's.

Times here are the database server's clock (`_NOW`), so that hosts whose clocks differ agree on
which of them has gone silent."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from anatomy.store.database import Db, Store
from anatomy.store.facts import RunFacts, RunSource
from anatomy.store.liveness import Recorder
from anatomy.vocabulary import Backend, MemoryApi, Status

# The server's wall clock, in seconds since the epoch, in each engine's words.
_NOW = {True: "EXTRACT(EPOCH FROM clock_timestamp())",
        False: "((julianday('now') - 2440587.5) * 86400.0)"}


class LaunchRefused(ValueError):
    """This host cannot join its launch's run (one line: which run, why)."""


class HostRow(NamedTuple):
    """One host of a run across hosts, as the store holds it."""
    host: int  # its place: 0 made the run; its GPU i is stored as device_key(host, i)
    name: str
    recorder: Recorder | None
    wall_t0: float  # the wall clock at its recording's start
    silent: float  # seconds since its last beat, by the server's clock
    ranks: dict[int, int | None]  # its ranks, each one's GPU (NVML index there; None: CPU)
    ended_at: float | None
    status: Status | str | None
    error: str | None
    samples_sent: int | None

    @property
    def over(self) -> bool:
        return self.ended_at is not None


class Place(NamedTuple):
    """This host's place in the run: the run, its index and name there, the run's clock (the
    wall clock at host 0's start: every host's times count from it), and whether it made it."""
    run_id: int
    host: int
    name: str
    run_wall_t0: float
    created: bool


def _now(db: Db) -> str:
    return _NOW[db.postgres]


def _lock_run(db: Db, run_id: int) -> tuple | None:
    """The run's row, locked until the transaction ends (PostgreSQL; SQLite's one writer
    is its lock): one host at a time joins it, places its ranks or ends it."""
    lock = " FOR UPDATE" if db.postgres else ""
    return db.execute(f"SELECT status, host_count FROM runs WHERE id = ?{lock}",
                      (run_id,)).fetchone()


def hosts(store: Store, run_id: int) -> list[HostRow]:
    """The run's hosts, in their order."""
    with store.connect() as db:
        return _hosts(db, run_id)


def _hosts(db: Db, run_id: int) -> list[HostRow]:
    rows = db.execute(f"SELECT host, name, recorder, wall_t0, {_now(db)} - beat, ranks, ended_at,"
                      " status, error, samples_sent FROM run_hosts WHERE run_id = ? ORDER BY host",
                      (run_id,)).fetchall()
    return [HostRow(r[0], r[1], Recorder.from_dict(json.loads(r[2] or "null")), r[3], float(r[4]),
                    {int(k): v for k, v in json.loads(r[5] or "{}").items()}, *r[6:])
            for r in rows]


def join(store: Store, key: str, host_count: int | None, name: str, wall_t0: float,
         silent_seconds: float, *, backend: Backend, memory_api: MemoryApi | None, gpu: int,
         environment: RunFacts, source: RunSource, preset: str, run_name: str | None) -> Place:
    """Make the launch's run or join it, and this host's row in it. A running run of the key whose
    hosts have all been silent `silent_seconds` (a launch that died without a word) is ended
    failed, and a new one made. LaunchRefused where the run has its `host_count` hosts already."""
    recorder = json.dumps(Recorder.here().to_dict())
    for _ in range(5):  # a run ended between the insert and the select: once more
        with store.connect() as db:
            found = db.execute("SELECT id FROM runs WHERE run_key = ? AND status = ?",
                               (key, Status.RUNNING)).fetchone()
            # Inserted only where none runs yet: a conflict spends a number of the ids' sequence.
            created = None if found is not None else db.execute(
                "INSERT INTO runs (name, created_at, status, preset, options, environment,"
                " backend, memory_api, gpu, source, recorder, run_key, host_count) VALUES"
                " (?, ?, ?, ?, '{}', ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_key) WHERE run_key"
                f" IS NOT NULL AND status = '{Status.RUNNING}' DO NOTHING RETURNING id",
                (run_name, time.time(), Status.RUNNING, preset,
                 json.dumps(environment.to_dict()), backend, memory_api, gpu,
                 json.dumps(source.to_dict()), recorder, key, host_count)).fetchone()
            if created is not None:
                run_id = int(created[0])
            else:
                found = found or db.execute("SELECT id FROM runs WHERE run_key = ? AND status = ?",
                                            (key, Status.RUNNING)).fetchone()
                if found is None:
                    continue
                run_id = int(found[0])
            locked = _lock_run(db, run_id)
            if locked is None or locked[0] != Status.RUNNING:
                continue
            known = _hosts(db, run_id)
            if known and all(h.over or h.silent > silent_seconds for h in known):
                _end_dead(db, run_id, known, silent_seconds)
                continue
            if host_count is not None and len(known) >= host_count:
                names = ", ".join(h.name for h in known)
                raise LaunchRefused(
                    f"run {run_id} of launch key {key!r} has its {host_count} hosts already"
                    f" ({names}): is another launch given the same key? Give each launch its"
                    " own --rdzv-id (or ANATOMY_RUN_KEY)")
            index = len(known)
            taken = {h.name for h in known}
            if name in taken:
                name = f"{name}#{index}"
            db.execute(f"INSERT INTO run_hosts (run_id, host, name, recorder, wall_t0, beat)"
                       f" VALUES (?, ?, ?, ?, ?, {_now(db)})",
                       (run_id, index, name, recorder, wall_t0))
            run_wall_t0 = known[0].wall_t0 if known else wall_t0
            _merge_facts(db, run_id, RunFacts.of(hosts=(*(h.name for h in known), name)))
            return Place(run_id, index, name, run_wall_t0, created is not None)
    raise LaunchRefused(f"launch key {key!r}: its run kept ending as this host joined it")


def _end_dead(db: Db, run_id: int, known: list[HostRow], silent_seconds: float) -> None:
    """A run whose every host is silent: failed, as the first silent host left it."""
    silent = next((h for h in known if not h.over), None)
    error = ("its hosts ended without its ending written" if silent is None else
             f"host {silent.name} was lost: silent for {silent.silent:.0f} s (more than"
             f" {silent_seconds:.0f} s), as was every host of the run still running")
    db.execute("UPDATE runs SET status = ?, error = ?, ended_at = ? WHERE id = ?",
               (Status.FAILED, error, time.time(), run_id))


def _merge_facts(db: Db, run_id: int, extra: RunFacts) -> None:
    """The run's facts with `extra` over them, the run's row locked by the caller: every host
    writes them, never over another's."""
    stored = db.execute("SELECT environment FROM runs WHERE id = ?", (run_id,)).scalar()
    try:
        value = json.loads(stored or "{}")
    except ValueError:
        value = {}
    facts = RunFacts.from_dict(value if isinstance(value, dict) else {}, strict=False)
    db.execute("UPDATE runs SET environment = ? WHERE id = ?",
               (json.dumps(facts.merged(extra).to_dict()), run_id))


def places(ranks: Mapping[int, tuple[int, int | None]], names: Sequence[str]) -> RunFacts:
    """The run's facts for ranks on several hosts: each rank's host (its index among `names`) and
    GPU (NVML index on that host), rank by rank."""
    world = max(ranks) + 1
    facts = RunFacts.of(world_size=world, hosts=tuple(names),
                        rank_hosts=tuple(ranks.get(r, (0, None))[0] for r in range(world)))
    if any(gpu is not None for _, gpu in ranks.values()):
        facts = facts.merged(RunFacts.of(gpus=tuple(ranks.get(r, (0, 0))[1] or 0
                                                    for r in range(world))))
    return facts


def place_ranks(store: Store, run_id: int, host: int,
                ranks: Mapping[int, int | None]) -> dict[int, str]:
    """This host's ranks (each one's GPU there), and the run's facts from every host's: its world
    size, each rank's host and GPU. Those of its ranks another host has placed too, by the name
    of that host: their phases and steps are stored as one rank's."""
    with store.connect() as db:
        _lock_run(db, run_id)
        db.execute("UPDATE run_hosts SET ranks = ? WHERE run_id = ? AND host = ?",
                   (json.dumps({str(r): g for r, g in ranks.items()}), run_id, host))
        known = _hosts(db, run_id)
        every = {r: (h.host, g) for h in known for r, g in h.ranks.items()}
        if every:
            _merge_facts(db, run_id, places(every, [h.name for h in known]))
    return {r: h.name for h in sorted(known, key=lambda h: h.host, reverse=True)
            if h.host != host for r in h.ranks if r in ranks}


def beat(store: Store, run_id: int, host: int) -> list[HostRow]:
    """This host is alive (now, by the server's clock); every host of the run as it stands."""
    with store.connect() as db:
        db.execute(f"UPDATE run_hosts SET beat = {_now(db)} WHERE run_id = ? AND host = ?",
                   (run_id, host))
        return _hosts(db, run_id)


def lose(store: Store, run_id: int, host: int, why: str, recorder: Recorder,
         status: str = Status.FAILED) -> bool:
    """Host `host` stopped reporting: its part ended failed, saying `why`, and the run's recorder
    (the process whose end readers take for the run's) is `recorder` where it was that host's.
    False where it had ended meanwhile."""
    with store.connect() as db:
        lost = db.execute("UPDATE run_hosts SET status = ?, error = ?, ended_at = ? WHERE run_id"
                          " = ? AND host = ? AND ended_at IS NULL",
                          (status, why, time.time(), run_id, host)).rowcount > 0
        _hand_over(db, run_id, recorder)
    return lost


def _hand_over(db: Db, run_id: int, recorder: Recorder | None) -> None:
    """The run's recorder: a host still running (`recorder`), where the one named has ended or
    was lost; readers take the recorder's end for the run's."""
    if recorder is None:
        return
    ended = {json.dumps(h.recorder.to_dict()) for h in _hosts(db, run_id) if h.over and h.recorder}
    current = db.execute("SELECT recorder FROM runs WHERE id = ?", (run_id,)).scalar()
    try:
        current = json.dumps(json.loads(current or "null"))
    except ValueError:
        current = None
    if current in ended or current is None:
        db.execute("UPDATE runs SET recorder = ? WHERE id = ?",
                   (json.dumps(recorder.to_dict()), run_id))


def end_part(store: Store, run_id: int, host: int, status: Status, error: str | None,
             samples_sent: int | None) -> None:
    """This host's part has ended; the run's recorder handed to a host still running."""
    with store.connect() as db:
        _lock_run(db, run_id)
        db.execute("UPDATE run_hosts SET status = ?, error = ?, ended_at = ?, samples_sent = ?"
                   " WHERE run_id = ? AND host = ?",
                   (status, error, time.time(), samples_sent, run_id, host))
        running = [h for h in _hosts(db, run_id) if not h.over]
        _hand_over(db, run_id, running[0].recorder if running else None)


def finish(store: Store, run_id: int, ending: Any) -> tuple[Status, str | None] | None:
    """The run's ending, once every host's part has ended: `ending(hosts)` gives it (status,
    error); its samples_sent is every host's sampler's count (unknown where one's never came).
    Written by one host only (the run's row locked, its status still running): that host gets
    the ending; None for the others, and while a host still runs."""
    with store.connect() as db:
        locked = _lock_run(db, run_id)
        if locked is None or locked[0] != Status.RUNNING:
            return None
        known = _hosts(db, run_id)
        if not all(h.over for h in known):
            return None
        status, error = ending(known)
        counts = [h.samples_sent for h in known]
        sent = None if None in counts else sum(counts)
        db.execute("UPDATE runs SET status = ?, error = ?, ended_at = ?, samples_sent = ? WHERE"
                   " id = ?", (status, error, time.time(), sent, run_id))
        return status, error
