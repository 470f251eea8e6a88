"""Ranks on several hosts, in this process: the launch a watched command is one host of (its key
and host count, from torchrun's options or the environment), the refusals that start nothing, and
the run's ending from every host's part. (Two hosts for real, into PostgreSQL:
tests/e2e/test_several_hosts.py.)"""

from __future__ import annotations

import sqlite3

import pytest

from anatomy.cli import main
from anatomy.engine import launch
from anatomy.store import RunFacts, RunSource, Store, database, launches, schema
from anatomy.vocabulary import Status

TORCHRUN = ["torchrun", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1"]


@pytest.mark.parametrize("command, environ, found", [
    (TORCHRUN + ["--rdzv-id", "job-7", "train.py"], {}, ("job-7", 2)),
    (["python", "-m", "torch.distributed.run", "--nnodes=1:4", "--rdzv_id=j", "train.py"], {},
     ("j", 4)),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"], {}, None),
    (["torchrun", "train.py"], {"PET_NNODES": "2", "PET_RDZV_ID": "from-env"}, ("from-env", 2)),
    # The script's own options are the script's.
    (["torchrun", "--nproc-per-node", "1", "train.py", "--rdzv-id", "x"], {}, None),
    (["python", "train.py"], {launch.RUN_KEY_ENV: "k", launch.RUN_HOSTS_ENV: "3"}, ("k", 3)),
    (["python", "train.py"], {launch.RUN_KEY_ENV: "k"}, ("k", None)),
    (TORCHRUN + ["--rdzv-id", "job-7", "train.py"], {launch.RUN_KEY_ENV: "mine"}, ("mine", 2)),
    (["python", "train.py"], {}, None),
    # One node given an id, as torchrun's own examples do: one host's run.
    (["torchrun", "--nnodes=1", "--rdzv-id=100", "--rdzv-backend=c10d", "train.py"], {}, None),
    (["torchrun", "--rdzv-id", "100", "train.py"], {}, None),
])
def test_a_launchs_key_and_host_count_come_from_torchrun_or_the_environment(command, environ,
                                                                              found):
    across = launch.launch_of(command, environ)
    assert (across if across is None else (across.key, across.hosts)) == found


def test_a_launch_on_several_hosts_without_a_key_is_refused():
    with pytest.raises(launch.LaunchRefused, match="give every host the same --rdzv-id"):
        launch.launch_of(TORCHRUN + ["train.py"], {})  # torchrun's default id, "none", is no key
    with pytest.raises(launch.LaunchRefused, match="not a number of hosts"):
        launch.launch_of(["python", "train.py"], {launch.RUN_KEY_ENV: "k",
                                                  launch.RUN_HOSTS_ENV: "two"})


@pytest.mark.parametrize("command, environ", [
    (TORCHRUN + ["--rdzv-id", "job-7", "train.py"], {}),
    (["python", "train.py"], {launch.RUN_KEY_ENV: "job-7"}),
])
def test_a_run_across_hosts_into_a_file_is_refused_in_one_line_showing_the_url(
        command, environ, tmp_path, capsys, monkeypatch):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    store = tmp_path / "runs.sqlite"
    assert main(["watch", "--store", str(store), "--", *command]) == 2
    err = capsys.readouterr().err
    assert "postgresql://user@host/db" in err and err.count("\n") == 1, err
    assert not store.exists()  # nothing started, nothing made


def _host(index: int, status: str, ended_at: float, error: str | None = None
          ) -> launches.HostRow:
    return launches.HostRow(index, f"node-{index}", None, 0.0, 0.0, {}, ended_at, status, error,
                            10)


def test_the_runs_ending_names_the_host_that_caused_it():
    assert launch.run_ending([_host(0, "completed", 1), _host(1, "completed", 2)]) == (
        Status.COMPLETED, None)
    # Its peers failed first, of it: the host lost is the cause.
    assert launch.run_ending([_host(0, "failed", 1, "rank 0: connection reset"),
                              _host(1, launch.LOST, 9, "silent for 11 s")]) == (
        Status.FAILED, "host node-1 was lost: silent for 11 s; the commands of the other hosts"
                       " were ended")
    # The first host whose part did not complete: the others' ranks lost their peer after it.
    assert launch.run_ending([_host(0, "failed", 3, "ended as host node-1 oom"),
                              _host(1, "oom", 2, "rank 1: CUDA out of memory")]) == (
        Status.OOM, "host node-1: rank 1: CUDA out of memory")
    assert launch.run_ending([_host(0, "stopped", 1, "stopped (SIGINT)"),
                              _host(1, "failed", 2, "rank 1: connection reset by peer")]) == (
        Status.STOPPED, "host node-0: stopped (SIGINT)")
    assert launch.run_ending([_host(0, "completed", 1), _host(1, "stopped", 2, "SIGTERM")]) == (
        Status.STOPPED, "host node-1: SIGTERM")


def test_each_ranks_host_and_gpu_are_the_runs_facts():
    facts = launches.places({0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}, ["a", "b"])
    assert (facts.world_size, facts.hosts, facts.rank_hosts, facts.gpus) == (
        4, ("a", "b"), (0, 0, 1, 1), (0, 1, 0, 1))
    on_cpus = launches.places({0: (0, None), 1: (1, None)}, ["a", "b"])
    assert on_cpus.gpus is None and on_cpus.rank_hosts == (0, 1)


def test_a_store_at_the_revision_before_runs_across_hosts_gains_them_and_keeps_its_runs(
        tmp_path):
    """A store as the release before this one wrote it (revision 0001: no launch key, no hosts'
    table) opens upgraded in place, its runs kept, and takes a run across hosts."""
    path = tmp_path / "0001.sqlite"
    kept = Store(path).create_run({}, "cpu-rss", "rss", 0, {}, preset="train.py")
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX runs_running_key")
        db.execute("DROP TABLE run_hosts")
        db.execute("ALTER TABLE runs DROP COLUMN run_key")
        db.execute("ALTER TABLE runs DROP COLUMN host_count")
        db.execute("UPDATE alembic_version SET version_num = '0001'")
    database._ENGINES.clear()
    store = Store(path)
    assert store.run(kept) is not None
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema.HEAD,)]
        assert {"run_key", "host_count"} <= {r[1] for r in db.execute("PRAGMA table_info(runs)")}
        assert "runs_running_key" in {r[1] for r in db.execute("PRAGMA index_list(runs)")}
    place = launches.join(store, "job", 2, "node", 0.0, 10.0, backend="cpu-rss",
                          memory_api="rss", gpu=0, environment=RunFacts.of(),
                          source=RunSource.of(), preset="train.py", run_name=None)
    assert place.created and place.run_id != kept
