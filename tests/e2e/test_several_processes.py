"""Several training processes through accelerate (issue 12), on this CPU: two gloo ranks of the
tiny model through the real CLI and manager; a fault on one rank; a stop; a user's own launch of
several processes under `anatomy watch`; the locks a worker of several GPUs inherits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from anatomy.analysis.report import report
from anatomy.cli import main
from anatomy.engine.callbacks import INJECT_ENV
from anatomy.store import Store
from tests.conftest import PROJECT, TINY, flags
from tests.e2e.conftest import HANG_SECONDS, name_of
from tests.helpers import alive, wait_until

TWO = replace(TINY, processes=2, batch_size=2)  # two CPU ranks of the tiny run


RANK_PHASES = ["kernel", "weights", "training"]


def _tree_while_training(store: Store, run_id: int, timeout: float = 120) -> list[psutil.Process]:
    """The worker and every process under it, once both ranks train."""
    wait_until(lambda: {p.rank for p in store.phases(run_id, None) if p.name == "training"}
               == {0, 1}, timeout, "the two ranks to begin training")
    root = psutil.Process(store.run(run_id).worker_pid)
    return [root, *root.children(recursive=True)]


def test_two_cpu_processes_through_the_cli_record_both_ranks(store, capsys):
    code = main(["run", *flags(replace(TWO, max_steps=3)), "--store", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    # The CPU's kernel phase by the name every page gives it (the CLI said "(kernel)"), each
    # rank's as `show` reads it.
    assert "(torch loaded, rank 0)" in out and "(torch loaded, rank 1)" in out
    assert "kernel" not in out
    run_id = store.runs()[-1].id
    rep = report(store, run_id)
    assert rep.status == "completed"
    assert rep.world_size == 2 and rep.strategy == "ddp" and rep.gpus == ()
    assert store.ranks(run_id) == [0, 1]
    assert [p.name for p in rep.phases] == ["baseline", *RANK_PHASES]  # rank 0's, as always
    assert [p.name for p in rep.ranks[1].phases] == RANK_PHASES  # the baseline is the worker's
    for rank in (0, 1):
        assert [s.step for s in store.steps(run_id, rank)] == [1, 2, 3]
        assert rep.ranks[rank].phase("training").done
        assert rep.ranks[rank].peak_bytes > 0
        parts = rep.ranks[rank].components
        assert parts.weights == parts.gradients == 4 * rep.parameters  # DDP: all of it, each
    assert rep.summary.samples_per_second > 0  # the Trainer's: both ranks' samples
    shown = rep.to_dict()
    assert shown["world_size"] == 2 and [r["rank"] for r in shown["ranks"]] == [0, 1]
    assert rep.samples == rep.samples_sent > 0
    # Each rank's own processes measured apart, beside the whole tree (the worker's too): two
    # ranks each hold less than all of it, and the run's peak stays the tree's.
    assert all(rank.measured_alone for rank in rep.ranks)
    assert {s.gpu for s in store.samples(run_id)} == {0, 1, 2}
    assert all(s.used > 0 for s in store.samples(run_id))  # an ended rank read 0 MB till the end
    assert all(0 < rank.peak_bytes < rep.summary.peak_bytes for rank in rep.ranks)
    assert main(["show", str(run_id), "--store", str(store.path)]) == 0
    shown_text = capsys.readouterr().out
    assert "the RSS of each rank's own processes" in shown_text  # `show` said "all ranks' RSS
    # together" and printed identical rows
    assert "torch loaded (MiB)" in shown_text and "kernel" not in shown_text
    # Nothing of the run is left: the worker, the launcher's ranks, the sampler.
    left = [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]
    assert [p for p in left if alive(p)] == []


def test_a_fault_on_one_rank_ends_the_run_and_every_rank(manager, store, monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "oom@2:1")  # rank 1 runs out of memory at step 2
    run_id = manager.start(replace(TWO, max_steps=50))
    tree = _tree_while_training(store, run_id)
    assert len(tree) >= 3  # the worker and its two ranks
    assert manager.wait(run_id, timeout=120) == "oom"
    rep = report(store, run_id)
    assert rep.error.startswith("rank 1: ") and "out of memory" in rep.error
    assert all(p.end_s is not None for p in store.phases(run_id, None))
    assert [p for p in tree if alive(p)] == []


def _temporary(store: Store) -> Path:
    """The temporary directory of the `anatomy run` beside `store` (TMPDIR)."""
    return store.path.with_suffix(".tmp")


def _two_ranks_training(store, steps: int) -> subprocess.Popen:
    """`anatomy run` of two CPU ranks that would train for long, once rank 1 has made `steps`
    steps (killed if it never does); a temporary directory of its own (`_temporary`)."""
    _temporary(store).mkdir()
    cli = subprocess.Popen([sys.executable, "-m", "anatomy", "run",
                            *flags(replace(TWO, max_steps=100_000)), "--store", str(store.path)],
                           cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True,
                           env={**os.environ, "TMPDIR": str(_temporary(store))})
    try:
        wait_until(lambda: store.runs() and store.step_count(1, 1) >= steps, 240,
                   f"rank 1's step {steps}", every=0.2, process=cli)
    except BaseException:
        cli.kill()
        raise
    return cli


def _failed_in_one_line(store: Store, cli: subprocess.Popen, act) -> None:
    """`act()` on the two ranks' training, then `anatomy run` ends with 1 and no traceback (the
    command killed whatever happens), and leaves nothing in its temporary directory (the
    launcher's logs and error files and the Trainer's folder go with the run)."""
    try:
        act()
        _, err = cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 1
    assert "Traceback" not in err, err
    assert list(_temporary(store).iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill_9", "sigterm"])
def test_a_rank_killed_fails_the_run_in_one_line_read_at_its_last_step(store, sig):
    """torch's elastic agent logs the dead rank with a traceback: the terminal gets the run's one
    line instead; the rank's training phase is read at its last step, not at the run's end. A
    SIGTERM is a kill too (before: the rank inherited the agent's handler and failed the run with
    "rank 1: Traceback … SignalException: Process 123 got signal: 15"; a SIGINT, reset with it,
    was "rank 1: Traceback … KeyboardInterrupt")."""
    cli = _two_ranks_training(store, steps=3)

    def kill_rank_1() -> None:
        tree = psutil.Process(store.run(1).worker_pid).children(recursive=True)
        # Its name says its rank (a process it started would bear it too: the eldest is the rank).
        named = [p for p in tree if p.name() == "anatomy-rank-1"]
        (rank_1,) = [p for p in named if p.ppid() not in {q.pid for q in named}]
        rank_1.send_signal(sig)

    _failed_in_one_line(store, cli, kill_rank_1)
    rep = report(store, 1)
    assert rep.status == "failed" and f"rank 1 was killed by {sig.name}" in rep.error, rep.error
    if sig == signal.SIGTERM:  # as watch says it of a rank its launcher runs
        assert rep.error == ("rank 1 was killed by SIGTERM, a signal to that rank alone (no stop"
                             " of the run); the launcher ended the other ranks"), rep.error
    training = next(p for p in store.phases(1, 1) if p.name == "training")
    assert training.end_s == store.last_step(1, 1).t


def test_a_sigterm_to_the_worker_of_several_ranks_fails_the_run_in_one_line(store):
    """The elastic agent in the worker turns it into its SignalException (before: the run's error
    was that traceback, "Traceback … SignalException: Process 123 got signal: 15")."""
    cli = _two_ranks_training(store, steps=1)
    tree: list[psutil.Process] = []

    def terminate_the_worker() -> None:
        worker = psutil.Process(store.run(1).worker_pid)
        tree.extend([worker, *worker.children(recursive=True)])
        worker.terminate()

    _failed_in_one_line(store, cli, terminate_the_worker)
    rep = report(store, 1)
    assert rep.status == "failed" and rep.error.startswith(
        "the training worker was killed by SIGTERM"), rep.error
    assert [p for p in tree if alive(p)] == []


def test_stop_ends_every_rank(manager, store):
    run_id = manager.start(replace(TWO, max_steps=100_000))
    tree = _tree_while_training(store, run_id)
    started = time.monotonic()
    manager.stop(run_id)
    assert time.monotonic() - started < HANG_SECONDS  # it returns: a hang, not a speed
    assert [p for p in tree if alive(p)] == []
    assert report(store, run_id).status == "stopped"


RANK_SCRIPT = """
import anatomy
run = anatomy.start(kernel=False)
run.phase("weights")
run.phase("training")
run.step(0.5, total=2)
run.step(0.4, total=2)
run.end()
"""


LAUNCHER = """
import os, subprocess, sys
children = [subprocess.Popen([sys.executable, "-c", sys.argv[1]],
                             env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                  "WORLD_SIZE": "2"}) for r in range(2)]
sys.exit(max(child.wait() for child in children))
"""


def _launch(store: Store, *watch: str, script: str = RANK_SCRIPT):
    project = PROJECT
    env = {**os.environ, "ANATOMY_STORE": str(store.path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(project),
                                                       os.environ.get("PYTHONPATH"))))}
    command = [*watch, sys.executable, "-c", LAUNCHER, script]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=project,
                          env=env)


def test_watch_of_a_launch_keeps_every_rank_in_one_run(store):
    import sys

    result = _launch(store, sys.executable, "-m", "anatomy", "watch", "--")
    assert result.returncode == 0, result.stderr
    [run] = store.runs()
    rep = report(store, run.id)
    assert rep.status == "completed" and rep.world_size == 2
    assert store.ranks(run.id) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in store.steps(run.id, rank)] == [1, 2]
        assert {p.name for p in store.phases(run.id, rank)} >= {"weights", "training"}


def test_under_watch_a_launch_whose_rank_0_never_started_reads_as_rank_1s(store, capsys):
    """Only rank 1's script calls anatomy.start() (`watch -- torchrun --nproc_per_node 2`; the
    same seen with torchrun and gloo on the CPU). (before: `show` printed rank 0's empty phase
    table and "steps: 0", and watch printed no phase: rank 0 was every reader's reference)"""
    script = "import os\nif os.environ['RANK'] == '1':\n" + textwrap.indent(RANK_SCRIPT, "    ")
    result = _launch(store, sys.executable, "-m", "anatomy", "watch", "--", script=script)
    assert result.returncode == 0, result.stderr
    assert "(training)" in result.stderr, result.stderr  # its live lines: rank 1's phase ends
    [run] = store.runs()
    assert store.ranks(run.id) == [1]
    rep = report(store, run.id)
    assert [p.name for p in rep.phases] == ["baseline", "weights", "training"]
    assert rep.steps == 2 and [s.step for s in store.steps(run.id)] == [1, 2]
    assert all(p.memory_bytes for p in rep.phases)
    assert main(["show", str(run.id), "--store", str(store.path)]) == 0
    shown = capsys.readouterr().out
    assert "steps: 2" in shown and "\ntraining " in shown, shown


def test_under_watch_the_rank_that_raises_is_named_in_the_runs_error(store):
    """(before: "RuntimeError: boom", which of the ranks unsaid)"""
    import sys

    script = RANK_SCRIPT.replace("run.step(0.4, total=2)", "run.step(0.4, total=2)\n"
                                 "if os.environ['RANK'] == '1': raise RuntimeError('boom')")
    result = _launch(store, sys.executable, "-m", "anatomy", "watch", "--", script="import os\n"
                     + script)
    assert result.returncode == 1, result.stderr
    [run] = store.runs()
    rep = report(store, run.id)
    assert rep.status == "failed" and rep.error == "rank 1: RuntimeError: boom", rep.error
    assert store.ranks(run.id) == [0, 1]


TORCHRUN_LIKE = """
import os, signal, subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", sys.argv[1]],
                             env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                  "WORLD_SIZE": "2"}) for r in range(2)]
while all(child.poll() is None for child in children):
    time.sleep(0.05)
for child in children:  # as torchrun's agent does when one rank fails: SIGTERM to the others
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
sys.exit(0 if all(child.wait() == 0 for child in children) else 1)
"""

KILLED_RANK_SCRIPT = """
import os, signal, sys, time
import anatomy
run = anatomy.start(kernel=False)
run.phase("training")
for _ in range(600):
    run.step(0.05, total=600)
    if os.environ["RANK"] == "1" and os.path.exists(os.environ["GO"]):
        os.kill(os.getpid(), int(sys.argv[1]))
    time.sleep(0.05)
run.end()
"""


def _watch_a_rank_signalled(store, tmp_path, sig: signal.Signals,
                            script: str = KILLED_RANK_SCRIPT):
    """`watch` over two ranks that record themselves (`script`), launched as torchrun does;
    rank 1 gets `sig` from someone once both train. The run's report."""
    go = tmp_path / "go"
    env = {**os.environ, "ANATOMY_STORE": str(store.path), "GO": str(go),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT),
                                                       os.environ.get("PYTHONPATH"))))}
    script = script.replace("int(sys.argv[1])", str(int(sig)))
    watch = subprocess.Popen([sys.executable, "-m", "anatomy", "watch", "--", sys.executable,
                              "-c", TORCHRUN_LIKE, script], cwd=PROJECT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: store.runs() and store.step_count(1, 1) >= 2, 120, "rank 1's step 2",
                   every=0.1, process=watch)
        go.touch()
        _, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 1, err
    return report(store, 1)


def test_under_watch_a_rank_killed_is_the_cause_not_the_peers_the_launcher_stopped(store,
                                                                                   tmp_path):
    """(before: "stopped: stopped by SIGTERM", the words of rank 0, which the launcher ended after
    rank 1 was killed)"""
    rep = _watch_a_rank_signalled(store, tmp_path, signal.SIGKILL)
    assert rep.status == "failed", rep.error
    assert rep.error.startswith("rank 1 ended without a word (killed or crashed); the command"
                                " ended with exit code 1"), rep.error


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_under_watch_a_rank_stopped_by_a_signal_of_its_own_fails_the_run_as_run_says(
        store, tmp_path, sig):
    """SIGTERM to one rank: the rank's script recorded its own stop, and the run under watch was
    `stopped`, where `anatomy run --processes 2` says `failed` for the same signal to its rank
    (test_a_rank_killed_fails_the_run_in_one_line_read_at_its_last_step). A signal to one rank
    alone is no stop of the run: both say failed, in the same words."""
    rep = _watch_a_rank_signalled(store, tmp_path, sig)
    assert rep.status == "failed", rep.error
    assert rep.error == (f"rank 1 was killed by {sig.name}, a signal to that rank alone (no stop"
                         " of the run); the command ended with exit code 1"), rep.error


def test_under_watch_a_peer_gone_without_a_word_after_the_ranks_stop_is_not_the_cause(store,
                                                                                      tmp_path):
    """Rank 1 stopped by SIGINT says so; the launcher's SIGTERM then ends rank 0 before it says
    its own stop (seen on a loaded machine; here its handler exits at once). The run named rank 0
    "ended without a word (killed or crashed)" and printed rank 1's KeyboardInterrupt under it."""
    silent_peer = KILLED_RANK_SCRIPT.replace(
        'run.phase("training")',
        'run.phase("training")\nif os.environ["RANK"] == "0":\n'
        '    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))')
    rep = _watch_a_rank_signalled(store, tmp_path, signal.SIGINT, silent_peer)
    assert rep.error == ("rank 1 was killed by SIGINT, a signal to that rank alone (no stop of"
                         " the run); the command ended with exit code 1"), rep.error


def test_without_watch_rank_0_records_and_the_others_stay_silent(store):
    result = _launch(store)
    assert result.returncode == 0, result.stderr
    [run] = store.runs()  # one run, not one per rank
    assert store.ranks(run.id) == [0] and len(store.steps(run.id)) == 2


def _hold(lifeline, seconds: float) -> None:
    lifeline.attach()
    time.sleep(seconds)


def test_the_worker_of_several_gpus_holds_every_gpus_lock(tmp_path, monkeypatch):
    """The worker inherits the locks of all its GPUs (a tuple of descriptors): they stay taken
    while it lives, even when the manager let go of its own copies."""
    import multiprocessing as mp

    from anatomy.engine.lifeline import Lifeline, launch
    from anatomy.engine.manager import LOCK_DIR_ENV, DeviceLock

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    locks = [DeviceLock("gpu0"), DeviceLock("gpu1")]
    assert all(lock.acquire("test") for lock in locks)
    child = mp.get_context("spawn").Process(
        target=_hold, args=(Lifeline("anatomy-test", tuple(lk.fileno() for lk in locks)), 30))
    launch(child)
    try:
        for lock in locks:
            lock.release()
        # named once it has attached: its arguments, the locks among them, have arrived
        wait_until(lambda: name_of(psutil.Process(child.pid)) == "anatomy-test", HANG_SECONDS,
                   "the child to attach its lifeline")
        assert not DeviceLock("gpu0").acquire("other") and not DeviceLock("gpu1").acquire("x")
    finally:
        child.kill()
        child.join(5)
    assert DeviceLock("gpu1").acquire("free again")


def test_the_first_rank_to_end_is_named_though_the_launcher_reaps_a_peer_first(tmp_path):
    """The launcher names the rank its poll met first; a rank killed by SIGKILL whose peer ended
    a moment later (it lost the killed rank in a collective) is still the one named."""
    import multiprocessing as mp
    import signal as sig

    from anatomy.engine import ranks
    from anatomy.engine.lifeline import name_rank
    from anatomy.engine.training import EXIT_PEER_LOST

    go = tmp_path / "go"

    def rank(local: int) -> None:
        name_rank(local)
        while not go.exists():
            time.sleep(0.01)
        os._exit(EXIT_PEER_LOST)

    fork = mp.get_context("fork")
    children = [fork.Process(target=rank, args=(local,)) for local in (0, 1)]
    deaths = ranks._Deaths(2)
    for child in children:
        child.start()
    wait_until(lambda: {c.name() for c in psutil.Process().children()}
               >= {"anatomy-rank-0", "anatomy-rank-1"}, HANG_SECONDS, "both ranks named",
               every=0.01)
    # a thread waits for each one's end (on a loaded machine, seconds after they named themselves)
    wait_until(lambda: len(deaths.kills) >= 2, HANG_SECONDS, "a thread watching each rank",
               every=0.01)
    os.kill(children[1].pid, sig.SIGKILL)
    # seen dead, not reaped: the launcher has not polled yet
    wait_until(lambda: 1 in deaths.ended, HANG_SECONDS, "rank 1's death seen", every=0.01)
    go.touch()  # rank 0 now ends as a peer that lost rank 1
    for child in children:  # reaped as the launcher does, rank 0 first
        child.join(10)
    assert (children[0].exitcode, children[1].exitcode) == (EXIT_PEER_LOST, -sig.SIGKILL)
    local, end = deaths.first_cause()
    assert (local, end.code, end.for_memory) == (1, -sig.SIGKILL, False)  # a kill -9 of ours
    deaths.done.set()
