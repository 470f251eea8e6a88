"""Ranks on several hosts, one run, with two "hosts" on this machine: two `anatomy watch`
processes, each running one node of `torchrun --nnodes 2 --rdzv-id KEY` (CPU ranks over gloo, each
marking its phases and steps with the phase API), both writing into one PostgreSQL database of
the private cluster (tests/postgres.py). The first to arrive makes the run, the other joins it by
the launch's key; the run holds both hosts' ranks; a host that dies mid-run fails the run with its
name, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from anatomy.analysis import transfer
from anatomy.analysis.report import report
from anatomy.engine import launch
from anatomy.store import HOST_STRIDE, RunFacts, RunSource, Store, launches
from tests.conftest import PROJECT
from tests.e2e.conftest import left
from tests.helpers import free_port, wait_until

SCRIPT = """
import sys, time
import anatomy
steps = int(sys.argv[1])
run = anatomy.start(kernel=False)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
run.phase("weights")
x = torch.ones(4096)
run.phase("training")
for step in range(1, steps + 1):
    dist.all_reduce(x)
    time.sleep(0.2)
    run.step(0.5, total=steps)
run.end()
dist.destroy_process_group()
"""


def _hosts(url: str, tmp_path, steps: int, key: str = "job-7") -> list[subprocess.Popen]:
    """Two watches, each a node of one torchrun launch, each in a session of its own, as on a
    machine of its own; the store's URL in $ANATOMY_STORE (its password in $PGPASSWORD)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    master = str(free_port())
    env = {**os.environ, "ANATOMY_STORE": url,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT),
                                                       os.environ.get("PYTHONPATH"))))}
    return [subprocess.Popen(
        [sys.executable, "-m", "anatomy", "watch", "--", sys.executable, "-m",
         "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
         "1", "--rdzv-id", key, "--master-addr", "127.0.0.1", "--master-port", master,
         str(script), str(steps)],
        env=env, cwd=PROJECT, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]


def _tree(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        root = psutil.Process(process.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_two_hosts_end_in_one_run_with_every_ranks_phases_and_steps(pg_url, tmp_path):
    watches = _hosts(pg_url, tmp_path, steps=4)
    outputs = [w.communicate(timeout=400)[0] for w in watches]
    assert [w.returncode for w in watches] == [0, 0], outputs
    store = Store(pg_url)
    [run] = store.runs()  # one run, both hosts' parts in it
    rep = report(store, run.id)
    assert rep.status == "completed" and rep.world_size == 2, rep.error
    hosts = launches.hosts(store, run.id)
    assert [h.status for h in hosts] == ["completed", "completed"]
    assert len(rep.hosts) == 2 and sorted(rep.environment.rank_hosts) == [0, 1]
    assert any("joined it" in o for o in outputs) and any("made it" in o for o in outputs)
    for rank in (0, 1):
        assert [s.step for s in store.steps(run.id, rank)] == [1, 2, 3, 4]
        assert [p.name for p in store.phases(run.id, rank)] == ["baseline", "weights",
                                                                "training"]
        assert all(p.end_s is not None for p in store.phases(run.id, rank))
    # Each host's own samples, its device apart — on a CPU its tree under 0, its rank's own
    # processes under 1 (store.rank_series) —; every sample each sampler sent is stored.
    assert {s.gpu for s in store.samples(run.id)} == {0, 1, HOST_STRIDE, HOST_STRIDE + 1}
    assert sorted(r.device for r in rep.ranks) == [1, HOST_STRIDE + 1]
    assert all(r.measured_alone and r.peak_bytes for r in rep.ranks)
    assert rep.samples == rep.samples_sent > 0
    # The joined host's times are on the run's clock: its training overlaps the first host's.
    training = [next(p for p in r.phases if p.name == "training") for r in rep.ranks]
    assert abs(training[0].start_s - training[1].start_s) < 5.0
    # What anatomy writes it reads back: the run's export imports as it was recorded.
    target = Store(tmp_path / "imported.sqlite")
    (imported,) = transfer.import_runs(target, json.dumps(transfer.export_runs(store, [run.id])))
    assert report(target, imported).ranks == rep.ranks
    assert target.samples(imported) == store.samples(run.id)


def test_a_host_that_dies_fails_the_run_with_its_name_and_nothing_is_left(pg_url, tmp_path):
    watches = _hosts(pg_url, tmp_path, steps=10_000)
    store = Store(pg_url)
    wait_until(lambda: (runs := store.runs()) and all(store.last_step(runs[0].id, r)
                                                      for r in (0, 1)),
               300, "both ranks to train", every=0.5)
    everything = [p for w in watches for p in _tree(w)]
    dying, living = watches[1], watches[0]
    [run] = store.runs()
    name = next(h.name for h in launches.hosts(store, run.id) if h.recorder.pid == dying.pid)
    os.killpg(dying.pid, signal.SIGKILL)  # the host dies: its watch and all it ran
    output = living.communicate(timeout=120)[0]
    dying.wait(timeout=30)
    assert living.returncode != 0, output
    rep = report(store, run.id)
    assert rep.status == "failed" and rep.error.startswith(f"host {name} was lost"), rep.error
    assert f"host {name} was lost" in output
    assert left(everything, 30) == []


def test_hosts_arriving_at_once_make_one_run_and_each_its_own_place(pg_url):
    store = Store(pg_url)
    places, start = [], threading.Barrier(4)

    def arrive() -> None:
        start.wait()
        places.append(_arrive(store, "job-8", 4))

    threads = [threading.Thread(target=arrive) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len({p.run_id for p in places}) == 1 and [p.created for p in places].count(True) == 1
    assert sorted(p.host for p in places) == [0, 1, 2, 3]
    assert sorted(p.name for p in places) == ["node", "node#1", "node#2", "node#3"]
    assert len(store.runs()) == 1


def _arrive(store: Store, key: str, hosts: int | None, silent: float = 10.0) -> launches.Place:
    return launches.join(store, key, hosts, "node", time.time(), silent, backend="cpu-rss",
                         memory_api="rss", gpu=0, environment=RunFacts.of(),
                         source=RunSource.of(), preset="train.py", run_name=None)


def test_a_launch_that_has_its_hosts_refuses_another_given_its_key(pg_url):
    store = Store(pg_url)
    first = _arrive(store, "job-9", 2)
    _arrive(store, "job-9", 2)
    with pytest.raises(launches.LaunchRefused, match="has its 2 hosts already .*same key"):
        _arrive(store, "job-9", 2)
    assert [h.name for h in launches.hosts(store, first.run_id)] == ["node", "node#1"]


def test_a_launch_whose_every_host_went_silent_is_ended_when_its_key_comes_again(pg_url):
    store = Store(pg_url)
    dead = _arrive(store, "job-10", 2)
    # Silent longer than allowed (here: any time at all): the launch died without a word.
    again = _arrive(store, "job-10", 2, silent=0.0)
    assert again.created and again.run_id != dead.run_id and again.host == 0
    old = store.run(dead.run_id)
    assert old.status == "failed" and "host node was lost" in old.error


def test_a_database_restart_mid_run_loses_no_host(postgres, pg_url, tmp_path):
    """Every host's beats stop while the server is away: none is taken for lost once it is back
    (silence is judged only after a host has beaten again as long as a host may be silent)."""
    watches = _hosts(pg_url, tmp_path, steps=150)  # 0.2 s a step: 30 s of training
    store = Store(pg_url)
    wait_until(lambda: (runs := store.runs()) and all(store.last_step(runs[0].id, r)
                                                      for r in (0, 1)),
               300, "both ranks to train", every=0.5)
    postgres.stop()
    time.sleep(launch.SILENT_SECONDS + 5)  # longer than a host may be silent
    postgres.start()
    outputs = [w.communicate(timeout=400)[0] for w in watches]
    assert [w.returncode for w in watches] == [0, 0], outputs
    [run] = store.runs()
    assert run.status == "completed", run.error
    assert [h.status for h in launches.hosts(store, run.id)] == ["completed", "completed"]
    for rank in (0, 1):
        assert [s.step for s in store.steps(run.id, rank)] == list(range(1, 151))
