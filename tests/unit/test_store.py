"""The run store: WAL, readable while written, phases and reports, decimation that keeps peaks."""

from __future__ import annotations

import math
import threading
import time

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.store import (
    GpuProcess,
    GpuStatus,
    HostStatus,
    PhaseMark,
    Sample,
    Step,
    Store,
    checks,
    database,
)
from anatomy.store.liveness import ENDED_WITHOUT_A_WORD, Recorder
from anatomy.units import MIB


def _new_run(store: Store) -> int:
    return store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {"gpu_name": None})


def test_store_is_in_wal_mode(store):
    with store.connect() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_run_can_be_read_while_it_is_written(store):
    run_id = _new_run(store)
    batches, per_batch = 200, 50
    errors: list[Exception] = []
    seen: list[int] = []
    reading = threading.Event()

    def writer():
        for b in range(batches):
            # one read between every two batches, whatever the scheduler does under load
            while len(seen) <= b and reading.is_set():
                time.sleep(0.001)
            rows = [Sample(b + i / per_batch, 0, b * per_batch + i, None, 10**9, None)
                    for i in range(per_batch)]
            store.write(run_id, samples=rows, steps=[Step(float(b), b, batches, 0.5, None, None)])

    def reader():
        reader_store = Store(store.path)  # its own connection, as the dashboard's would be
        try:
            while thread.is_alive():
                report(reader_store, run_id)
                seen.append(reader_store.sample_count(run_id))
        except Exception as error:  # a locked database would land here
            errors.append(error)
        finally:
            reading.clear()

    thread = threading.Thread(target=writer)
    reading.set()
    thread.start()
    read = threading.Thread(target=reader)
    read.start()
    thread.join()
    read.join()
    assert not errors
    assert seen == sorted(seen)  # never goes backwards: each batch lands whole
    assert len(set(seen)) > 2  # the reader saw the run grow
    assert store.sample_count(run_id) == batches * per_batch


def test_report_reads_each_phase_memory_at_its_end(store):
    run_id = _new_run(store)
    samples = [Sample(t / 10, 0, int(t) * MIB, None, 1000 * MIB, None) for t in range(100)]
    store.write(run_id, samples=samples, phases=[
        PhaseMark("start", "baseline", 0.0), PhaseMark("end", "baseline", 1.0),
        PhaseMark("start", "kernel", 2.0), PhaseMark("end", "kernel", 3.05),
        PhaseMark("start", "weights", 4.0), PhaseMark("end", "weights", 5.0),
        PhaseMark("start", "training", 6.0)])
    rep = report(store, run_id)
    assert [p.name for p in rep.phases] == ["baseline", "kernel", "weights", "training"]
    assert [p.memory_mb for p in rep.phases[:3]] == [10, 30, 50]
    assert rep.phases[3].end_s is None
    assert rep.phases[3].memory_mb == 99  # an open phase: the latest reading
    store.close_phases(run_id, 9.9)
    assert report(store, run_id).phases[3].end_s == 9.9
    assert rep.summary.peak_mb == 99
    assert rep.samples == 100


def test_a_phase_named_again_keeps_each_occurrences_own_end_and_memory(store):
    """A loop alternating run.phase("training") and run.phase("eval") three times: the end of
    each mark was written to every phase of that name, so every training ended at the last
    one's end (3.39 s) with its memory. Readers that name one phase read its first occurrence;
    lists and charts have each."""
    run_id = _new_run(store)
    store.write(run_id, samples=[Sample(t / 10, 0, t * MIB, None, None, None) for t in range(70)])
    marks = []
    for k in range(3):
        marks += [PhaseMark("start", "training", 2.0 * k), PhaseMark("end", "training", 2.0 * k + 1),
                  PhaseMark("start", "eval", 2.0 * k + 1), PhaseMark("end", "eval", 2.0 * k + 1.5)]
    for mark in marks:  # one batch each, as the collector's flushes may cut them
        store.write(run_id, phases=[mark])
    assert [(p.name, p.start_s, p.end_s) for p in store.phases(run_id)] == [
        ("training", 0.0, 1.0), ("eval", 1.0, 1.5), ("training", 2.0, 3.0), ("eval", 3.0, 3.5),
        ("training", 4.0, 5.0), ("eval", 5.0, 5.5)]
    rep = report(store, run_id)
    assert [p.memory_mb for p in rep.phases] == [10, 15, 30, 35, 50, 55]
    assert rep.phase("training").end_s == 1.0 and rep.training.memory_mb == 10
    assert rep.phase_memory()["training"] == 10 * MIB and rep.summary.memory_mb == 10


def test_an_end_without_an_open_occurrence_changes_no_phase(store):
    run_id = _new_run(store)
    store.write(run_id, phases=[PhaseMark("start", "training", 1.0), PhaseMark("end", "training", 2.0),
                                PhaseMark("end", "training", 3.0)])
    assert [(p.start_s, p.end_s) for p in store.phases(run_id)] == [(1.0, 2.0)]


def test_decimation_keeps_every_peak(store):
    run_id = _new_run(store)
    n = 200_000
    spike_at = {777, 123_456, 199_998}
    rows = [Sample(i / 1000, 0, (10**9 if i in spike_at else 5 * 10**8) + (i % 7), None, None,
                   None) for i in range(n)]
    store.write(run_id, samples=rows)
    points = store.decimated(run_id, buckets=500)
    assert len(points) <= 2 * 500 + 2
    assert {round(p.t * 1000) for p in points if p.used >= 10**9} == spike_at
    assert min(p.used for p in points) == 5 * 10**8
    assert [p.t for p in points] == sorted(p.t for p in points)


def coarse_buckets_and_their_samples(store: Store, run_id: int) -> tuple[dict, dict]:
    """(each coarse bucket's (used_min, used_max) as stored, the same from the run's samples),
    keyed (level, gpu, bucket): a bucket of level L spans BUCKET_RATIO**L whole 0.1 s ones."""
    expected: dict[tuple[int, int, int], tuple[int, int]] = {}
    for sample in store.samples(run_id):
        index = math.floor(sample.t / database.BUCKET_SECONDS)
        for level in database.LEVELS:
            key = (level, sample.gpu, index // database.BUCKET_RATIO**level)
            low, high = expected.get(key, (sample.used, sample.used))
            expected[key] = (min(low, sample.used), max(high, sample.used))
    with store.connect() as db:
        stored = {(level, gpu, bucket): (low, high) for level, gpu, bucket, low, high in db.execute(
            "SELECT level, gpu, bucket, used_min, used_max FROM coarse_buckets WHERE run_id = ?",
            (run_id,))}
    return stored, expected


def test_each_coarse_bucket_holds_the_lowest_and_highest_sample_of_its_span(store):
    run_id = _new_run(store)
    for b in range(1500):  # 150 s of two devices at 200 Hz, in the recorder's 0.1 s batches
        store.write(run_id, samples=[
            Sample((b * 20 + i) / 200, gpu, 10**9 + ((b * 20 + i) * 7919 + gpu) % 10**6, None,
                   None, None) for i in range(20) for gpu in (0, 3)])
    store.write(run_id, samples=[Sample(77.777, 3, 5 * 10**9, None, None, None),
                                 Sample(140.01, 0, 10, None, None, None)])  # late, out of order
    stored, expected = coarse_buckets_and_their_samples(store, run_id)
    assert stored == expected
    assert {level for level, _, _ in stored} == set(database.LEVELS)


def test_the_peak_before_any_time_is_the_highest_sample_before_it(store):
    """Read from the coarsest buckets wholly before the time, then finer ones, then the
    samples of the 0.1 s it cuts through: each time below crosses the levels' edges
    differently."""
    run_id = _new_run(store)
    rows = [Sample(i / 100, 0, 10**9 + (i * 7919) % 10**6, None, None, None) for i in range(90_000)]
    for at in (3.33, 51.2, 409.6, 410.0, 655.36, 819.0):  # spikes at levels' edges
        rows.append(Sample(at, 0, 10**9 + int(at * 10**7), None, None, None))
    store.write(run_id, samples=rows)
    for before in (0.005, 3.33, 3.34, 51.2, 51.25, 409.6, 409.61, 500.0, 655.36, 655.37, 818.9,
                   None):
        wanted = max(s.used for s in rows if before is None or s.t < before)
        assert store.peak(run_id, 0, before) == wanted, before


def test_a_sample_on_a_buckets_edge_counts_in_the_peak_before_a_time_after_it(store):
    """1.7 s falls in the 0.1 s bucket 17 (floor(1.7 / 0.1)), yet 17 * 0.1 is 1.7000000000000002:
    the samples of the bucket a time cuts through are read from that bucket's first sample, not
    from its edge's product, which lies above it."""
    run_id = _new_run(store)
    store.write(run_id, samples=[Sample(i / 10, 0, 100 + i, None, None, None) for i in range(17)]
                + [Sample(1.7, 0, 10**6, None, None, None)])
    assert store.peak(run_id, 0, 1.75) == 10**6
    assert store.peaks(run_id, [0], 1.75) == {0: 10**6}


def test_a_long_runs_chart_keeps_every_extreme_whatever_the_level_it_reads(store):
    run_id = _new_run(store)
    n = 400_000  # 4,000 s at 100 Hz: 300 buckets read the 6.4 s level, 20,000 the 0.1 s
    rows = [Sample(i / 100, 0, 10**9 + (i * 7919) % 10**6, None, None, None) for i in range(n)]
    rows[123_457] = rows[123_457]._replace(used=4 * 10**9)
    rows[333_333] = rows[333_333]._replace(used=7)
    store.write(run_id, samples=rows)
    for buckets in (300, 1000, 2000, 20_000):
        points = store.decimated(run_id, buckets)
        assert len(points) <= 2 * buckets + 2
        assert max(points, key=lambda p: p.used).t == rows[123_457].t
        assert min(points, key=lambda p: p.used).t == rows[333_333].t
        assert points[0].t <= 10.0 and points[-1].t >= 3990.0


def test_delete_removes_every_row(store):
    run_id = _new_run(store)
    store.write(run_id, samples=[Sample(0.0, 0, 1, None, None, None)],
                phases=[PhaseMark("start", "baseline", 0)])
    store.delete_run(run_id)
    assert store.run(run_id) is None
    assert store.sample_count(run_id) == 0
    assert store.phases(run_id) == []


def test_store_path_follows_flag_then_env_then_default(tmp_path, monkeypatch):
    from anatomy.store import STORE_ENV, default_store, resolve_path

    monkeypatch.setenv(STORE_ENV, str(tmp_path / "env.sqlite"))
    assert resolve_path(tmp_path / "flag.sqlite") == tmp_path / "flag.sqlite"
    assert resolve_path() == tmp_path / "env.sqlite"
    monkeypatch.delenv(STORE_ENV)
    assert resolve_path() == default_store()


def test_one_default_store_for_the_clone_the_installed_package_scripts_and_the_dashboard(
        tmp_path, monkeypatch):
    """Without --store or $ANATOMY_STORE every front finds the same file, the user's data
    directory, wherever anatomy is imported from (this clone too) and whatever the working
    directory: a run a script records shows on the dashboard started anywhere else."""
    from anatomy.store import STORE_ENV, resolve_path

    monkeypatch.delenv(STORE_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert resolve_path() == tmp_path / "data" / "anatomy" / "anatomy.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path() == tmp_path / "home" / ".local" / "share" / "anatomy" / "anatomy.sqlite"


def test_runs_stored_before_the_buckets_existed_still_decimate(store):
    run_id = _new_run(store)
    rows = [Sample(i / 1000, 0, 5 * 10**8 + (10**9 if i == 4242 else 0), None, None, None)
            for i in range(20_000)]
    store.write(run_id, samples=rows)
    with store.connect() as db:
        db.execute("DELETE FROM sample_buckets")  # as a store written by an older anatomy
        db.execute("DELETE FROM coarse_buckets")
    assert store.peak(run_id, 0) == 15 * 10**8  # read from the samples then
    points = store.decimated(run_id, buckets=100)
    assert max(p.used for p in points) == 15 * 10**8
    assert len(points) <= 2 * 100 + 2


def test_a_store_written_before_a_column_existed_gains_it(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the sweeps table as the first release wrote it
        db.execute("CREATE TABLE sweeps (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL"
                   " UNIQUE, name TEXT, created_at REAL NOT NULL, ended_at REAL, base TEXT NOT NULL,"
                   " vary TEXT NOT NULL, until_oom INTEGER NOT NULL DEFAULT 0, planned INTEGER"
                   " NOT NULL, skipped INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, error TEXT)")
    store = Store(path)
    sweep_id = store.create_sweep(None, RunOptions().to_dict(), {"batch_size": [1]}, False, 1)
    assert store.sweep(sweep_id).pid is not None


def test_the_device_panels_readings_are_kept_and_go_with_their_run(store):
    run_id = store.create_run({"preset": "tiny"}, "nvml", "v2", 0, {})
    other = store.create_run({"preset": "tiny"}, "nvml", "v2", 0, {})
    for t in (0.5, 1.0):
        store.write(run_id, hosts=[HostStatus(t, 12.5, 3 * 2**30, 16 * 2**30)],
                    gpus=[GpuStatus(t, 0, 97, 412.3, 700.0, 54), GpuStatus(t, 1, 0, None, None,
                                                                          None)],
                    processes=[GpuProcess(t, 0, 4242, "python", 8 * 2**30),
                               GpuProcess(t, 0, 777, None, None)])
    assert [h.t for h in store.host_status(run_id)] == [0.5, 1.0]
    assert store.host_status(run_id, since=0.9) == [HostStatus(1.0, 12.5, 3 * 2**30, 16 * 2**30)]
    assert store.gpu_status(run_id)[0] == GpuStatus(0.5, 0, 97, 412.3, 700.0, 54)
    assert [p.pid for p in store.gpu_processes(run_id)] == [4242, 777]  # the latest, biggest first
    assert {p.t for p in store.gpu_processes(run_id, at=0.7)} == {0.5}
    assert store.host_status(other) == [] and store.gpu_processes(other) == []
    store.delete_run(run_id)
    assert store.host_status(run_id) == [] and store.gpu_status(run_id) == []


def test_a_run_whose_recorder_is_gone_reads_as_ended_and_nothing_is_written(store):
    """The one liveness answer (store/liveness.py): the recorder's pid, its start time (a pid
    that came back as another process is not it) and its host (another's cannot be seen)."""
    here = Recorder.here()
    cases = {
        "alive": here,
        "gone": Recorder(2**22 + 7, here.started, here.host),  # above pid_max
        "pid reused": Recorder(here.pid, here.started - 3600, here.host),
        "another host": Recorder(2**22 + 7, here.started, here.host + "-elsewhere"),
    }
    ids = {name: store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {},
                                  recorder=recorder) for name, recorder in cases.items()}
    store.write(ids["gone"], samples=[Sample(0.5, 0, 10, None, None, None)],
                phases=[PhaseMark("start", "baseline", 0.1)])
    before = store.path.read_bytes()
    seen = {name: store.run(run_id) for name, run_id in ids.items()}
    assert {name: run.status for name, run in seen.items()} == {
        "alive": "running", "gone": "failed", "pid reused": "failed", "another host": "running"}
    assert seen["gone"].error == ENDED_WITHOUT_A_WORD
    assert [r.id for r in store.find_runs(status="running")] == [ids["another host"], ids["alive"]]
    assert ids["gone"] in [r.id for r in store.find_runs(status="failed")]
    assert store.latest_running().id == ids["another host"]
    assert report(store, ids["gone"]).phase("baseline").done  # read as ending at its last sample
    assert store.run(ids["gone"], as_recorded=True).status == "running"  # nothing was written
    assert store.path.read_bytes() == before


@pytest.mark.parametrize("word, number", [
    ("7", 7), ("007", 7), ("0", 0), (str(2**63 - 1), 2**63 - 1), (str(2**63), None),
    ("", None), ("-1", None), ("+1", None), (" 1", None), ("1.0", None), ("²", None),
    ("٣", None), ("9" * 5000, None), ("0" * 5000 + "1", 1)])
def test_a_number_typed_or_set_is_ascii_digits_alone(word, number):
    assert checks.digits(word) == number


def test_a_reader_that_names_no_rank_reads_the_lowest_rank_that_reported(store):
    # Rank 0 of nearly every run; here rank 2 marked phases, rank 1 only reported a step and
    # rank 0 nothing (its script never called anatomy.start()): rank 1 is the reference.
    run_id = _new_run(store)
    store.write(run_id, phases=[PhaseMark("start", "training", 0.0, rank=2)],
                steps=[Step(1.0, 1, 2, 0.5, None, None, rank=2),
                       Step(1.1, 1, 2, 0.5, None, None, rank=1)])
    assert store.ranks(run_id) == [1, 2]
    assert [s.rank for s in store.steps(run_id)] == [1] and store.step_count(run_id) == 1
    assert store.phases(run_id) == [] and store.phases(run_id, 2) != []
    store.write(run_id, phases=[PhaseMark("start", "training", 2.0, rank=0)])
    assert store.phases(run_id)[0].rank == 0 and store.step_count(run_id) == 0
