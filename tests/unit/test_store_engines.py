"""The store as a path or a URL: one declaration of the tables, the rows read by its columns, a
store made by an older release upgraded in place, a newer one refused, and a database URL never
taken for a file name nor its password shown."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from anatomy.cli import main
from anatomy.store import (
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    Sample,
    ServerUrl,
    Step,
    Store,
    StoreError,
    resolve_path,
    schema,
    tables,
)
from anatomy.store.migrations import __file__ as migrations_init
from tests.unit.test_store import coarse_buckets_and_their_samples

MADE_BY_MAIN = Path(__file__).parents[1] / "data" / "main-d47e177.sqlite"  # `anatomy run` at d47e177
# Schema 0002, before the coarse buckets: two GPUs at 100 Hz for 40 s, written by the Store of
# main at 8e84c4b in 0.1 s batches (a spike on GPU 0 at 27.77 s, a dip on GPU 1 at 13.21 s).
MADE_AT_0002 = Path(__file__).parents[1] / "data" / "main-8e84c4b.sqlite"


def _counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("runs", "samples", "sample_buckets", "phases", "steps", "messages",
                          "host_status")}


def test_the_rows_are_the_tables_columns():
    for row, table in ((Sample, tables.samples), (Step, tables.steps), (Message, tables.messages),
                       (HostStatus, tables.host_status), (GpuStatus, tables.gpu_status),
                       (GpuProcess, tables.gpu_processes)):
        assert ("run_id", *row._fields) == tuple(c.name for c in table.columns), table.name


def test_head_is_the_migrations_newest_revision():
    assert schema._scripts().get_current_head() == schema.HEAD
    assert Path(migrations_init).parent == schema.MIGRATIONS


def test_a_store_made_by_the_previous_release_is_upgraded_in_place_and_keeps_everything(
        tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    shutil.copy(MADE_BY_MAIN, path)
    before = _counts(path)
    assert before["samples"] == 6942
    store = Store(path)
    assert _counts(path) == before
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema.HEAD,)]
    run = store.run(1)
    assert (run.status, run.preset, store.sample_count(1)) == ("completed", "tiny", 6942)
    assert len(store.steps(1)) == 2 and len(store.phases(1)) == 4
    assert main(["show", "1", "--store", str(path)]) == 0
    assert "status: completed" in capsys.readouterr().out


def test_a_store_at_0002_opens_upgraded_with_its_runs_coarse_buckets_and_nothing_lost(tmp_path):
    path = tmp_path / "0002.sqlite"
    shutil.copy(MADE_AT_0002, path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("0002",)]
    before = _counts(path)
    store = Store(path)
    assert _counts(path) == before
    with sqlite3.connect(path) as db:  # each rank's steps read in time order
        assert db.execute("SELECT sql FROM sqlite_master WHERE name = 'steps_rank'").fetchone()
    stored, expected = coarse_buckets_and_their_samples(store, 1)
    assert stored == expected and len(stored) > 100
    assert store.peaks(1, [0, 1]) == {gpu: max(s.used for s in store.samples(1, gpu)) for gpu in (0, 1)}
    assert store.peak(1, 0) == 3 * 10**9
    assert store.peak(1, 0, before=27.77) < 3 * 10**9 <= store.peak(1, 0, before=27.78)
    points = store.decimated(1, buckets=20)
    assert (27.77, 3 * 10**9) in {(p.t, p.used) for p in points if p.gpu == 0}
    assert (13.21, 10**6) in {(p.t, p.used) for p in points if p.gpu == 1}
    # A run written after the upgrade gains them as it is written.
    run_id = store.create_run({"preset": "tiny"}, "nvml", "v2", 0, {})
    store.write(run_id, samples=[Sample(i / 10, 0, i, None, None, None) for i in range(100)])
    assert coarse_buckets_and_their_samples(store, run_id)[0] == \
        coarse_buckets_and_their_samples(store, run_id)[1]


def test_a_store_of_a_newer_release_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    path = tmp_path / "new.sqlite"
    Store(path).create_run({"model": "tiny"}, "cpu-rss", "rss", 0, {})
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = 'f00dfeed'")
    before = path.read_bytes()
    for command in (["runs"], ["show", "1"], ["rename", "1", "x"]):
        capsys.readouterr()
        assert main([*command, "--store", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: the store {path}: it was written by a newer anatomy (schema"
                       f" revision f00dfeed; this one knows up to {schema.HEAD}): upgrade anatomy"
                       " to use it\n")
    assert path.read_bytes() == before


@pytest.mark.parametrize("value, expected", [
    ("sqlite:///{tmp}/a.sqlite", "{tmp}/a.sqlite"),
    ("{tmp}/b.sqlite", "{tmp}/b.sqlite"),
])
def test_a_sqlite_url_is_its_file(tmp_path, value, expected):
    assert resolve_path(value.format(tmp=tmp_path)) == Path(expected.format(tmp=tmp_path))


def test_a_postgresql_url_is_never_a_file_and_its_password_never_shown(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.chdir(tmp_path)
    url = "postgresql://anatomy:pa55word@127.0.0.1:1/runs"  # port 1: nothing listens
    where = resolve_path(url)
    assert isinstance(where, ServerUrl) and str(where) == "postgresql://anatomy:***@127.0.0.1:1/runs"
    with pytest.raises(StoreError) as raised:
        Store(url)
    assert "pa55word" not in str(raised.value) and "***" in str(raised.value)
    for command in (["runs"], ["show", "1"], ["run", "--model", "tiny", "--max-steps", "1"]):
        capsys.readouterr()
        assert main([*command, "--store", url]) in (1, 2)
        out, err = capsys.readouterr()
        assert "pa55word" not in out + err
        assert err.startswith("error: the store postgresql://anatomy:***@127.0.0.1:1/runs: ")
        assert len(err.splitlines()) == 1, err
    assert os.listdir(tmp_path) == []  # no folder named "postgresql:", no file


def test_a_url_of_another_kind_is_refused_in_one_line(capsys):
    assert main(["runs", "--store", "mysql://root:hunter2@db/anatomy"]) == 2
    assert capsys.readouterr().err == (
        "error: --store mysql://root:***@db/anatomy: not a store anatomy can use; give a file path,"
        " sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE\n")


@pytest.mark.parametrize("url", ["postgresql://anatomy:hunter2@db:notaport/anatomy",
                                 "postgresql://anatomy:hunter2@[::1/anatomy"])
def test_a_postgresql_url_whose_port_is_no_number_is_refused_in_one_line(capsys, url):
    """SQLAlchemy's make_url raised int()'s ValueError, a traceback from every command."""
    assert main(["runs", "--store", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --store postgresql://anatomy:***@") and "hunter2" not in err
    assert err.endswith(": not a URL anatomy can read; give a file path, sqlite:///PATH or"
                        " postgresql://USER@HOST:PORT/DATABASE\n")


def test_a_url_of_another_kind_in_the_environment_is_named_as_the_users_setting(capsys,
                                                                                monkeypatch):
    """From $ANATOMY_STORE, the line said "--store", which the user never gave."""
    monkeypatch.setenv("ANATOMY_STORE", "mysql://root:hunter2@db/anatomy")
    assert main(["runs"]) == 2
    assert capsys.readouterr().err == (
        "error: $ANATOMY_STORE mysql://root:***@db/anatomy: not a store anatomy can use; give a"
        " file path, sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE\n")


def test_the_phase_api_refuses_a_url_of_another_kind_as_its_argument_or_goes_on_without_one(
        capsys, monkeypatch):
    """anatomy.start() with $ANATOMY_STORE of another kind raised BadLocation's traceback into
    the user's training: now a line and the training goes on unrecorded, as for a store it cannot
    reach; `store=` of another kind is the argument's ValueError, as its other arguments'."""
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)  # not this pytest's
    with pytest.raises(ValueError, match=r"^store: mysql://root:\*\*\*@db/a: not a store "):
        attach.start(store="mysql://root:hunter2@db/a", kernel=False, baseline=False)
    assert attach.current() is None
    monkeypatch.setenv("ANATOMY_STORE", "mysql://root:hunter2@db/a")
    run = attach.start(kernel=False, baseline=False)
    assert attach.current() is run
    run.phase("training")
    run.end()
    assert capsys.readouterr().err == (
        "anatomy: not recording: $ANATOMY_STORE mysql://root:***@db/a: not a store anatomy can"
        " use; give a file path, sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE; the"
        " training goes on unrecorded\n")
