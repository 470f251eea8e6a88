"""The store's tests, the CLI's and the import's, run again on PostgreSQL: each test's store is a
fresh database of a private cluster (tests/postgres.py) instead of a file, named by URL to the
Store, to --store and to $ANATOMY_STORE. A test about a file as such (its folder, its
permissions, SQLite's own errors) stays with SQLite only."""

from __future__ import annotations

import inspect

import pytest

from anatomy.store import STORE_ENV, Message, Store, database
from tests.conftest import seed_run
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
