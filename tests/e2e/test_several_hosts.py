"""Ranks on several hosts, one run (issue 21), with two "hosts" on this machine: two `anatomy
watch --join` processes, each running one node of `torchrun --nnodes 2` (CPU ranks over gloo,
each marking its phases and steps with the phase API). The first watch listens on the join
address and records the run; the second joins it over TCP. The run holds both hosts' ranks; a
host that dies mid-run fails the run with its name, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil

from anatomy.analysis import transfer
from anatomy.analysis.report import report
from anatomy.store import HOST_STRIDE, Store
from tests.conftest import PROJECT
from tests.e2e.conftest import HANG_SECONDS, left
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


def _hosts(store: Store, tmp_path, steps: int) -> list[subprocess.Popen]:
    """Two watches, node 0 first (it listens: the run's host), each in a session of its own, as
    on a machine of its own."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port, master = free_port(), str(free_port())
    join = f"127.0.0.1:{port}"
    env = {**os.environ, "ANATOMY_STORE": str(store.path), "ANATOMY_JOIN_KEY": "a shared key",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT),
                                                       os.environ.get("PYTHONPATH"))))}
    watches = []
    for node in (0, 1):
        command = [sys.executable, "-m", "anatomy", "watch", "--join", join, "--",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
                   "127.0.0.1", "--master-port", master, str(script), str(steps)]
        watches.append(subprocess.Popen(command, env=env, cwd=PROJECT, start_new_session=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True))
        if node == 0:  # node 0's watch listens first: the run's host
            wait_until(lambda: _listens(watches[0], port), HANG_SECONDS,
                       f"node 0's watch to listen on {join}", process=watches[0])
    return watches


def _tree(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        root = psutil.Process(process.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listens(process: subprocess.Popen, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in psutil.Process(process.pid).net_connections("tcp"))
    except psutil.Error:
        return False


def test_two_hosts_end_in_one_run_with_every_ranks_phases_and_steps(store, tmp_path):
    watches = _hosts(store, tmp_path, steps=4)
    outputs = [w.communicate(timeout=400)[0] for w in watches]
    assert [w.returncode for w in watches] == [0, 0], outputs
    assert "this host joined it (host 1)" in outputs[1]
    [run] = store.runs()  # one run, recorded on the run's host
    rep = report(store, run.id)
    assert rep.status == "completed" and rep.world_size == 2, rep.error
    assert len(rep.hosts) == 2 and rep.environment.rank_hosts == (0, 1)
    for rank in (0, 1):
        assert [s.step for s in store.steps(run.id, rank)] == [1, 2, 3, 4]
        assert [p.name for p in store.phases(run.id, rank)] == ["baseline", "weights",
                                                                "training"]
    # Each host's own samples, its device apart — on a CPU its tree under 0, its rank's own
    # processes under 1 (store.rank_series) —; every sample each sampler sent is stored.
    assert {s.gpu for s in store.samples(run.id)} == {0, 1, HOST_STRIDE, HOST_STRIDE + 1}
    assert [r.device for r in rep.ranks] == [1, HOST_STRIDE + 1]
    assert all(r.measured_alone and r.peak_bytes for r in rep.ranks)
    assert rep.samples == rep.samples_sent > 0
    # The joined host's times are on the run's clock: its training overlaps the run's host's.
    training = [next(p for p in r.phases if p.name == "training") for r in rep.ranks]
    assert abs(training[0].start_s - training[1].start_s) < 5.0
    # What anatomy writes it reads back: the joined host's devices (1000, 1001) were refused by
    # every import of the run's export ("must be a whole number from 0 to 63").
    target = Store(tmp_path / "imported.sqlite")
    (imported,) = transfer.import_runs(target, json.dumps(transfer.export_runs(store, [run.id])))
    assert report(target, imported).ranks == rep.ranks
    assert target.samples(imported) == store.samples(run.id)


def test_a_host_that_dies_fails_the_run_with_its_name_and_nothing_is_left(store, tmp_path):
    watches = _hosts(store, tmp_path, steps=10_000)
    wait_until(lambda: (runs := store.runs()) and all(store.last_step(runs[0].id, r)
                                                      for r in (0, 1)),
               300, "both ranks to train", every=0.5)
    everything = [p for w in watches for p in _tree(w)]
    joined = watches[1]
    os.killpg(joined.pid, signal.SIGKILL)  # the host dies: its watch and all it ran
    output = watches[0].communicate(timeout=120)[0]
    joined.wait(timeout=30)
    assert watches[0].returncode != 0, output
    rep = report(store, store.runs()[0].id)
    name = rep.hosts[1]
    assert rep.status == "failed" and f"host {name} was lost" in rep.error, rep.error
    assert f"host {name} was lost" in output
    assert left(everything, 30) == []
