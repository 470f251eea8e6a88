"""The store's tests, the CLI's and the import's, run again on PostgreSQL: each test's store is a
fresh database of a private cluster (tests/postgres.py) instead of a file, named by URL to the
Store, to --store and to $ANATOMY_STORE. A test about a file as such (its folder, its
permissions, SQLite's own errors) stays with SQLite only."""

from __future__ import annotations

import inspect

import pytest

from anatomy.cli import main
from anatomy.store import STORE_ENV, Message, Store, database
from tests.conftest import seed_run
from tests.postgres import PASSWORD
from tests.unit import test_cli_admin, test_store, test_transfer

# Tests of a SQLite file as such: its folder, SQLite's journal, a file made before revisions.
FILE_ONLY = {
    "test_a_store_written_before_a_column_existed_gains_it", "test_store_is_in_wal_mode",
    # a fault or an odd row made in SQLite's own SQL (a trigger, a file's bytes)
    "test_a_failure_while_writing_leaves_nothing_half_imported",
    "test_a_run_whose_recorder_is_gone_reads_as_ended_and_nothing_is_written",
}


def _again(module) -> None:
    for name, test in vars(module).items():
        if name.startswith("test_") and name not in FILE_ONLY and callable(test) \
                and {"store", "source", "target"} & set(inspect.signature(test).parameters):
            globals()[name] = test


for _module in (test_store, test_cli_admin, test_transfer):
    _again(_module)
runs = test_cli_admin.runs  # its fixture, over this module's store


@pytest.fixture(autouse=True)
def _own_store(pg_url, monkeypatch):
    """Every test's store is its own database, named by URL wherever a file was; the
    connections this process keeps to it are closed after the test."""
    monkeypatch.setenv(STORE_ENV, pg_url)
    yield
    for key, engine in list(database._ENGINES.items()):
        if engine.dialect.name == "postgresql":
            engine.dispose()
            del database._ENGINES[key]


@pytest.fixture
def store(pg_url) -> Store:
    return Store(pg_url)


@pytest.fixture
def source(postgres) -> tuple[Store, list[int]]:
    """tests/conftest.py's three runs, in a database."""
    store = Store(postgres.new_database(password=False))
    done = seed_run(store, gpus=2)
    store.write(done, messages=[Message(0.5, "warning", "eval_strategy 'no'")])
    store.rename_run(done, "walkthrough")
    store.set_tags(done, ["h200", "baseline"])
    store.update_run(done, sweep="abc123")
    oom = seed_run(store, status="oom", error="CUDA out of memory. Tried to allocate 1.00 GiB")
    running = seed_run(store, status="running")
    return store, [done, oom, running]


@pytest.fixture
def target(postgres) -> Store:
    store = Store(postgres.new_database(password=False))
    seed_run(store)
    return store


# --- faults of a database server, and its password ---

def test_a_database_restart_mid_recording_keeps_the_samples_and_writes_them_when_it_is_back(
        postgres, store):
    from anatomy.engine import protocol
    from anatomy.engine.collector import Collector
    from anatomy.store import Sample

    run_id = store.create_run({"model": "tiny"}, "nvml", "v2", 0, {})
    said = []
    collector = Collector(store, run_id, say=said.append)

    def record(start: int) -> None:
        collector.handle(protocol.Samples([Sample(i / 100, 0, 2**30 + i, None, None, None)
                                           for i in range(start, start + 100)]))

    record(0)
    assert collector.flush()
    postgres.stop()
    try:
        record(100)
        assert not collector.flush()  # kept
        record(200)
        assert not collector.flush()
        assert len(said) == 1 and "cannot be reached" in said[0]
    finally:
        postgres.start()
    assert collector.flush()
    assert said[1].startswith(f"the store {store.path} is back after") and "200 samples" in said[1]
    assert store.sample_count(run_id) == 300
    assert [s.t for s in store.samples(run_id)] == [i / 100 for i in range(300)]


def test_wrong_credentials_or_no_server_at_start_are_one_line_and_nothing_starts(
        postgres, capsys):
    wrong = postgres.url("postgres", password="not-it")
    for url, why in ((wrong, 'password authentication failed for user "anatomy"'),
                     (postgres.url("postgres").replace(f":{postgres.port}/", ":1/"),
                      "Connection refused")):
        for command in (["runs"], ["run", "--model", "tiny", "--max-steps", "1"]):
            capsys.readouterr()
            assert main([*command, "--store", url]) in (1, 2)
            out, err = capsys.readouterr()
            assert len(err.splitlines()) == 1 and why in err, err
            assert "not-it" not in out + err and PASSWORD not in out + err
    assert store_runs(postgres) == []


def store_runs(postgres) -> list:
    """The runs of the cluster's own database: none was started by a refused command."""
    return Store(postgres.url("postgres")).runs() if _has_runs(postgres) else []


def _has_runs(postgres) -> bool:
    import psycopg
    with psycopg.connect(postgres.url("postgres")) as db:
        return db.execute("SELECT to_regclass('runs')").fetchone()[0] is not None


def test_a_urls_password_is_in_no_line_run_or_export(postgres, capsys, tmp_path):
    url = postgres.new_database(password=True)
    run_id = seed_run(Store(url))
    for command in (["runs"], ["show", str(run_id)],
                    ["export", str(run_id), "--format", "json", "--output", str(tmp_path / "out.json")]):
        capsys.readouterr()
        assert main([*command, "--store", url]) == 0
        out, err = capsys.readouterr()
        assert PASSWORD not in out + err
    exported = (tmp_path / "out.json").read_text()
    assert PASSWORD not in exported and ":***@" in exported  # where the run came from


def test_the_dashboard_over_a_store_its_role_cannot_write_falls_back_to_read_only(
        postgres, pg_url, monkeypatch, capsys):
    """A role granted SELECT only (the honest unwritable store as root, who may write any file)."""
    from anatomy.cli import dashboard
    from anatomy.dashboard import READ_ONLY_ENV

    seed_run(Store(pg_url))
    name = pg_url.rsplit("/", 1)[1]
    postgres.sql("CREATE ROLE reader LOGIN PASSWORD 'r3ad'")
    try:
        postgres.sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader", name)
        reader = postgres.url(name, password="r3ad", user="reader")
        assert not Store(reader).writable() and Store(pg_url).writable()
        started = {}

        def execve(program, command, env):
            started.update(env)
            raise SystemExit(0)

        monkeypatch.setattr(dashboard.os, "execve", execve)
        with pytest.raises(SystemExit):
            main(["dashboard", "--store", reader, "--port", "8599"])
        out = capsys.readouterr().out
        assert "read-only: the store cannot be written by this user" in out and "r3ad" not in out
        assert started[READ_ONLY_ENV] == "the store cannot be written by this user"
        assert started[STORE_ENV] == reader  # the server reaches it with the password
    finally:
        for engine in list(database._ENGINES.values()):
            engine.dispose()
        postgres.sql("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM reader", name)
        postgres.sql("DROP ROLE reader")
