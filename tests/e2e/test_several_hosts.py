"""Ranks on several hosts, one run, with two "hosts" on this machine: two nodes of one
`torchrun --nnodes 2 --rdzv-id KEY` (CPU ranks over gloo), each either under `anatomy watch` or
recording itself (the phase API, a Trainer's callback: each host's first rank records its host's
part), all writing into one PostgreSQL database of the private cluster (tests/postgres.py). The
first to arrive makes the run, the other joins it by the launch's key; the run holds both hosts'
ranks, samples and device panel; a host that dies mid-run fails the run with its name, and
nothing is left running."""

from __future__ import annotations

import json
import os
import re
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
from anatomy.vocabulary import Status
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


TRAINER_SCRIPT = """
import sys
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
import anatomy

config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, vocab_size=100, max_position_embeddings=32)
examples = [{"input_ids": torch.randint(5, 99, (16,)), "labels": i % 2} for i in range(24)]
arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                              max_steps=int(sys.argv[1]), logging_steps=1, report_to="none",
                              save_strategy="no", disable_tqdm=True, use_cpu=True)
trainer = Trainer(model=BertForSequenceClassification(config), args=arguments,
                  train_dataset=examples, callbacks=[anatomy.AnatomyCallback(predict=False)])
trainer.train()
"""


def _hosts(url: str, tmp_path, steps: int, key: str = "job-7", script: str = SCRIPT,
           watched: bool = True) -> list[subprocess.Popen]:
    """Two nodes of one torchrun launch, each under a watch (or, `watched` False, recording
    itself), each in a session of its own, as on a machine of its own; the store's URL in
    $ANATOMY_STORE (its password in $PGPASSWORD)."""
    (tmp_path / "train.py").write_text(script)
    master = str(free_port())
    # TMPDIR: torchrun's own log folders (a torchelastic_* a launch, which torch never removes)
    # stay in the test's folder.
    env = {**os.environ, "ANATOMY_STORE": url, "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT),
                                                       os.environ.get("PYTHONPATH"))))}
    watch = [sys.executable, "-m", "anatomy", "watch", "--"] if watched else []
    return [subprocess.Popen(
        [*watch, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
         str(node), "--nproc-per-node", "1", "--rdzv-id", key, "--master-addr", "127.0.0.1",
         "--master-port", master, str(tmp_path / "train.py"), str(steps)],
        env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]


def _both_completed(url: str, hosts: list[subprocess.Popen]):
    """(store, run, its report, each host's output) once both hosts have ended well: one run,
    both hosts' parts in it, each completed."""
    outputs = [h.communicate(timeout=400)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], outputs
    store = Store(url)
    [run] = store.runs()
    rep = report(store, run.id)
    assert rep.status == "completed" and rep.world_size == 2, rep.error
    assert [h.status for h in launches.hosts(store, run.id)] == ["completed", "completed"]
    return store, run, rep, outputs


def _tree(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        root = psutil.Process(process.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_two_hosts_end_in_one_run_with_every_ranks_phases_and_steps(pg_url, tmp_path):
    store, run, rep, outputs = _both_completed(pg_url, _hosts(pg_url, tmp_path, steps=4))
    assert len(rep.hosts) == 2 and sorted(rep.environment.rank_hosts) == [0, 1]
    assert any("joined it" in o for o in outputs) and any("made it" in o for o in outputs)
    _each_rank_and_host(store, run.id, ["baseline", "weights", "training"], steps=4)
    # Each host's terminal says its own rank's phases (node N runs rank N), the run's end once.
    for node, output in enumerate(outputs):
        said = {int(r) for r in re.findall(r"\([^,()]+, [^()]*rank (\d+)\)", output)}
        assert said == {node}, output
    assert sum("status: completed" in o for o in outputs) == 1, outputs
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


def _each_rank_and_host(store: Store, run_id: int, phases: list[str], steps: int) -> None:
    """Every rank's phases, ended, and steps; both hosts' samples and device panel."""
    for rank in (0, 1):
        assert [s.step for s in store.steps(run_id, rank)] == list(range(1, steps + 1))
        assert [p.name for p in store.phases(run_id, rank)] == phases
        assert all(p.end_s is not None for p in store.phases(run_id, rank))
    assert {s.gpu // HOST_STRIDE for s in store.samples(run_id)} == {0, 1}
    assert {h.host for h in store.host_status(run_id)} == {0, 1}


@pytest.mark.parametrize("script, phases", [
    (SCRIPT, ["baseline", "weights", "training"]),
    (TRAINER_SCRIPT, ["weights", "training"]),
], ids=["phase-api", "trainer-callback"])
def test_two_hosts_recording_themselves_end_in_one_run_without_a_watch(script, phases, pg_url,
                                                                        tmp_path):
    """No `anatomy watch`: each host's first rank records its host's part of the launch's run
    (before, each host's rank 0 of its own made a run of its own, or nothing: rank 1 of the
    launch recorded nothing)."""
    store, run, rep, outputs = _both_completed(
        pg_url, _hosts(pg_url, tmp_path, steps=3, script=script, watched=False))
    assert sorted(rep.environment.rank_hosts) == [0, 1]
    _each_rank_and_host(store, run.id, phases, steps=3)
    assert any("joined it" in o for o in outputs) and any("made it" in o for o in outputs)
    assert sum(f"the run {Status.COMPLETED}" in o for o in outputs) == 1, outputs


PLAIN_SCRIPT = """
import sys, time
import anatomy
steps = int(sys.argv[1])
run = anatomy.start(kernel=False)
run.phase("training")
for step in range(1, steps + 1):
    time.sleep(0.1)
    run.step(0.5, total=steps)
run.end()
"""


@pytest.mark.parametrize("watched", [True, False], ids=["watch", "recording-itself"])
def test_hosts_whose_commands_set_no_rank_each_record_their_own(watched, pg_url, tmp_path):
    """A launch of one process a host that no launcher gives a RANK (ANATOMY_RUN_KEY and
    ANATOMY_RUN_HOSTS, `python train.py` on each): each host's process is the rank of its host's
    place, so the run holds one training phase and its steps per rank (before: both were rank
    0, `show` listed each phase twice and 2 × 3 steps under one rank)."""
    (tmp_path / "train.py").write_text(PLAIN_SCRIPT)
    env = {**os.environ, "ANATOMY_STORE": pg_url, "ANATOMY_RUN_KEY": "job-12",
           "ANATOMY_RUN_HOSTS": "2", "PYTHONPATH": os.pathsep.join(
               filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    watch = [sys.executable, "-m", "anatomy", "watch", "--"] if watched else []
    hosts = [subprocess.Popen([*watch, sys.executable, str(tmp_path / "train.py"), "3"], env=env,
                              cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in (0, 1)]
    store, run, rep, outputs = _both_completed(pg_url, hosts)
    assert store.ranks(run.id) == [0, 1], outputs
    for rank in (0, 1):
        assert [p.name for p in store.phases(run.id, rank) if p.name == "training"] == \
            ["training"]
        assert [s.step for s in store.steps(run.id, rank)] == [1, 2, 3]
    assert sorted(rep.environment.rank_hosts) == [0, 1]


def _second_host_dies(url: str, tmp_path, watched: bool, kill) -> None:
    """Both hosts train; `kill(host's Popen, its tree)` kills the second; the first host fails
    the run naming it, and nothing of either is left."""
    hosts = _hosts(url, tmp_path, steps=10_000, watched=watched)
    store = Store(url)
    wait_until(lambda: (runs := store.runs()) and all(store.last_step(runs[0].id, r)
                                                      for r in (0, 1)),
               300, "both ranks to train", every=0.5)
    everything = [p for h in hosts for p in _tree(h)]
    living, dying = hosts
    [run] = store.runs()
    dying_tree = _tree(dying)
    name = next(h.name for h in launches.hosts(store, run.id)
                if h.recorder.pid in {p.pid for p in dying_tree})
    kill(dying, dying_tree)
    output = living.communicate(timeout=120)[0]
    dying.wait(timeout=30)
    assert living.returncode != 0, output
    rep = report(store, run.id)
    assert rep.status == "failed" and rep.error.startswith(f"host {name} was lost"), rep.error
    assert f"host {name} was lost" in output
    assert left(everything, 30) == []


def test_a_host_recording_itself_that_dies_fails_the_run_with_its_name(pg_url, tmp_path):
    def kill(_, tree: list[psutil.Process]) -> None:
        for process in tree:  # the host dies: its torchrun and all it ran (its ranks lead
            process.kill()    # sessions of their own)

    _second_host_dies(pg_url, tmp_path, watched=False, kill=kill)


def test_a_host_that_dies_fails_the_run_with_its_name_and_nothing_is_left(pg_url, tmp_path):
    # the host dies: its watch and all it ran
    _second_host_dies(pg_url, tmp_path, watched=True,
                      kill=lambda watch, _: os.killpg(watch.pid, signal.SIGKILL))


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


def test_a_rank_two_hosts_both_record_is_said_once_naming_what_to_set(pg_url):
    """Two hosts whose processes have the same RANK (each its own one-node torchrun, joined by
    ANATOMY_RUN_KEY): the host that places it second says so once, naming the launcher's
    options that give every host's processes ranks of their own (before: nothing was said, and
    one rank held both hosts' phases and steps)."""
    store = Store(pg_url)
    first, second = _arrive(store, "job-11", 2), _arrive(store, "job-11", 2)
    told: list[str] = []
    key = launch.Launch("job-11", 2, "ANATOMY_RUN_KEY='job-11'")
    parts = [launch.HostPart(store, key, place, lambda why: None, told.append)
             for place in (first, second)]
    parts[0].place_rank(0, None)
    parts[0].place_rank(1, None)
    assert told == []
    parts[1].place_rank(0, None)
    parts[1].place_rank(0, None)  # heard again: said once
    assert len(told) == 1 and told[0].startswith("rank 0 of this host is rank 0 of host node"), told
    assert "--node-rank" in told[0] and "RANK" in told[0]


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
