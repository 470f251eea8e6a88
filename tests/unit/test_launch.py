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
        Status.FAILED, "host node-1 was lost: silent for 11 s; the training on the other hosts"
                       " was ended")
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


# --- a script that records itself, on several hosts (the phase API, the Trainer callback) ---

RANK = {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}


@pytest.mark.parametrize("environ, found", [
    ({**RANK, "TORCHELASTIC_RUN_ID": "job-7"}, ("job-7", 2)),
    ({**RANK, "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "job-7"}, None),  # one host
    ({**RANK, "TORCHELASTIC_RUN_ID": "job-7", launch.RUN_KEY_ENV: "mine"}, ("mine", 2)),
    ({}, None),
])
def test_a_ranks_launch_is_what_torchrun_tells_its_ranks(environ, found):
    across = launch.rank_launch(environ)
    assert (across if across is None else (across.key, across.hosts)) == found


@pytest.mark.parametrize("environ, store, words", [
    # torchrun's default id, "none", is no key: which key to set is said.
    ({**RANK, "TORCHELASTIC_RUN_ID": "none"}, "runs.sqlite",
     "torchrun --nnodes 2: give every host the same --rdzv-id (or ANATOMY_RUN_KEY)"),
    ({**RANK, "TORCHELASTIC_RUN_ID": "job-7"}, "runs.sqlite",
     "needs a store every host reaches: ANATOMY_STORE=postgresql://user@host/db"),
])
def test_a_host_of_a_launch_recording_itself_that_cannot_join_one_run_is_said_in_one_line(
        environ, store, words, tmp_path, monkeypatch, capsys):
    """The first rank of each host records its host's part: where the hosts could not make one
    run (no key, a file no other host reaches), one line says so, nothing is started, no store
    is made, and the training goes on unrecorded."""
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)  # not this pytest's
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    run = attach.start(store=tmp_path / store, kernel=False, baseline=False)
    try:
        assert run.id is None
    finally:
        run.end()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not recording:" in err and words in err, err
    assert not (tmp_path / store).exists()


def test_a_hosts_device_panel_is_stored_under_its_place():
    """Each host's panel: its host row under its place, its GPUs and their processes under
    device_key(host, i), as its samples (before, a host other than the first stored none)."""
    from anatomy.engine import protocol
    from anatomy.engine.recording import on_host
    from anatomy.store import GpuProcess, GpuStatus, HostStatus, device_key

    status = protocol.DeviceStatus(HostStatus(1.0, 5.0, 2, 8), [GpuStatus(1.0, 1, 90, 300.0, 700.0, 40)],
                                   [GpuProcess(1.0, 1, 42, "python", 2**30)])
    moved = on_host(1, status)
    assert moved.host.host == 1 and moved.host.ram_used == 2
    assert [g.gpu for g in moved.gpus] == [device_key(1, 1)]
    assert [p.gpu for p in moved.processes] == [device_key(1, 1)]


def test_the_device_panel_shows_every_hosts_own(store, seed):
    from anatomy.analysis.report import report
    from anatomy.store import GpuProcess, GpuStatus, HostStatus, device_key
    from anatomy.views import live
    from anatomy.views.figures.live import device_figure

    run_id = seed()
    store.merge_environment(run_id, RunFacts.of(hosts=("node-a", "node-b")))
    for host, cpu in ((0, 10.0), (1, 70.0)):
        for t in (0.5, 1.0):
            store.write(run_id, hosts=[HostStatus(t, cpu, (host + 1) * 2**30, 8 * 2**30, host)],
                        gpus=[GpuStatus(t, device_key(host, 0), 50, 100.0, 700.0, 40)],
                        processes=[GpuProcess(t + host, device_key(host, 0), 100 + host, "python",
                                              2**30)])
    rep = report(store, run_id)
    panel = live.device_panel(store, rep, None)
    assert [(h.name, h.metrics[0].value) for h in panel.host] == [("node-a", "10 %"),
                                                                   ("node-b", "70 %")]
    assert [g.name for g in panel.gpus] == ["node-a: GPU 0", "node-b: GPU 0"]
    # Each host's processes at its own last reading.
    assert [(p.host, p.gpu, p.pid) for p in panel.processes] == [("node-a", 0, 100),
                                                                  ("node-b", 0, 101)]
    figure = device_figure(panel.hosts, panel.gpu_readings, panel.host_names)
    cpu = [t.name for t in figure.data if t.yaxis == figure.data[-1].yaxis]
    assert cpu == ["node-a", "node-b"]


def test_a_store_at_the_revision_before_each_hosts_device_panel_gains_it_and_keeps_its_rows(
        tmp_path):
    """A store as revision 0002 wrote it (host_status without its host) opens upgraded in place:
    its panel's rows kept, as the first host's."""
    from anatomy.store import HostStatus

    path = tmp_path / "0002.sqlite"
    store = Store(path)
    kept = store.create_run({}, "cpu-rss", "rss", 0, {}, preset="train.py")
    store.write(kept, hosts=[HostStatus(0.5, 10.0, 2**30, 8 * 2**30)])
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE host_status DROP COLUMN host")
        db.execute("UPDATE alembic_version SET version_num = '0002'")
    database._ENGINES.clear()
    store = Store(path)
    assert store.host_status(kept) == [HostStatus(0.5, 10.0, 2**30, 8 * 2**30, 0)]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema.HEAD,)]
    store.write(kept, hosts=[HostStatus(1.0, 20.0, 2**30, 8 * 2**30, 1)])
    assert [h.host for h in store.host_status(kept)] == [0, 1]
