"""How a run ends in words and numbers, the same for every front (engine/endings.py, exits.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.engine import exits, protocol
from anatomy.engine.collector import Collector
from anatomy.engine.endings import death, exit_status, is_oom, oom_in, shell_death, stopped_by
from anatomy.engine.exits import ExitWatch, ending_of
from anatomy.engine.training import lost_peer
from anatomy.vocabulary import Status


@pytest.mark.parametrize("text, oom", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory.", True),
    ("RuntimeError: CUDA error: out of memory", True),
    ("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB", True),
    ("checking for out of memory conditions: none", False),
    ("the job ran out of memory budget on the scheduler", False),
])
def test_oom_is_torchs_own_error_not_any_mention_of_the_words(text, oom):
    assert oom_in(text) is oom
    assert is_oom(RuntimeError(text)) is oom
    assert not is_oom(ValueError(text))  # torch raises its error as a RuntimeError
    assert is_oom(MemoryError())


def test_a_signal_is_named_and_given_back_as_128_plus_n():
    assert death(-9) == "was killed by SIGKILL" and death(3) == "ended with exit code 3"
    assert exit_status(-9) == 137 and exit_status(-15) == 143 and exit_status(3) == 3
    assert "killed by SIGKILL" in shell_death(137) and shell_death(1) == ""
    assert stopped_by(signal.SIGTERM) == "stopped by SIGTERM"
    assert stopped_by(signal.SIGINT) == "stopped by Ctrl-C (SIGINT)"


@pytest.mark.parametrize("error, status, words", [
    (None, Status.COMPLETED, None),
    (SystemExit(0), Status.COMPLETED, None),
    (SystemExit(), Status.COMPLETED, None),
    (SystemExit(1), Status.FAILED, "exited with code 1 (sys.exit)"),
    (SystemExit("fatal"), Status.FAILED, "exited with code 1: fatal"),
    (KeyboardInterrupt(), Status.STOPPED, "Ctrl-C"),
    (RuntimeError("the loss went NaN"), Status.FAILED, "RuntimeError: the loss went NaN"),
    (RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"), Status.OOM, "CUDA out of memory"),
])
def test_how_a_script_ends_is_how_its_run_ends(error, status, words):
    ending = ending_of(error)
    assert ending.status == status
    assert ending.error is None if words is None else words in ending.error


def test_a_rank_that_only_lost_its_peer_gives_way_to_the_rank_that_ended(store):
    """Rank 1 killed: rank 0's collective fails first ("Connection reset by peer"); the run's
    error is the worker's word on rank 1, not rank 0's traceback. A real error stays first."""
    run_id = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert lost_peer(lost) and not lost_peer(RuntimeError("shape mismatch"))
    collector = Collector(store, run_id)
    collector.handle(protocol.Failure("failed", "rank 0: Traceback …", protocol.Source(0), True))
    collector.handle(protocol.Failure("failed", "rank 1 killed by SIGKILL", protocol.Source(0)))
    assert collector.outcome.failure.text == "rank 1 killed by SIGKILL"
    first = Collector(store, run_id)
    first.handle(protocol.Failure("failed", "rank 1: ValueError", protocol.Source(1)))
    first.handle(protocol.Failure("failed", "rank 0: reset by peer", protocol.Source(0), True))
    assert first.outcome.failure.text == "rank 1: ValueError"


def test_of_several_ranks_the_cause_is_the_first_to_fail_on_the_runs_clock_not_to_arrive(store):
    """SIGTERM to rank 1 alone: its script says its stop, then the launcher stops rank 0, whose
    word came first on a loaded machine (each rank's is on a connection of its own): the run
    named rank 0. In whichever order they arrive, the earliest on the run's clock is the cause;
    a rank that only lost its peer still gives way, however early, and a failure whose time
    was not said (an older anatomy's) comes after any time said."""
    run_id = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})
    signalled = protocol.Failure(Status.STOPPED, "stopped by SIGTERM", protocol.Source(1), t=5.0)
    failures = [
        protocol.Failure(Status.STOPPED, "stopped by SIGTERM", protocol.Source(0), t=5.2),
        signalled,
        protocol.Failure(Status.FAILED, "rank 2: reset by peer", protocol.Source(2), True, t=4.9),
        protocol.Failure(Status.FAILED, "rank 3: ValueError", protocol.Source(3)),
    ]
    for order in itertools.permutations(failures):
        collector = Collector(store, run_id)
        for failure in order:
            collector.handle(failure)
        assert collector.outcome.failure == signalled, order


def test_under_watch_a_rank_gone_silent_is_the_cause_by_the_runs_clock_not_by_arrival():
    """Rank 1 says its stop (at 5.0 on the run's clock), then the launcher's SIGTERM ends rank 0
    before it says its own: rank 0's link closes silent. Its receiving thread may see the close
    before rank 1's thread has passed on the stop (a loaded machine): the run named rank 0
    "ended without a word". Seen later than the stop was said, the rank that said it is the
    cause; a rank killed first, the peers' later stops or lost collectives are not."""
    from anatomy.engine.watch import Vanished

    stop = protocol.Failure(Status.STOPPED, "stopped by SIGINT", protocol.Source(1), t=5.0)
    for arrived_first in (False, True):
        assert not Vanished(0, 5.3, after_a_word=arrived_first).is_cause(stop)
        assert Vanished(0, 4.8, after_a_word=arrived_first).is_cause(stop)
    lost = protocol.Failure(Status.FAILED, "reset by peer", protocol.Source(1), True, t=4.9)
    assert Vanished(0, 5.3, after_a_word=True).is_cause(lost)
    error = protocol.Failure(Status.FAILED, "ValueError", protocol.Source(1), t=6.0)
    assert not Vanished(0, 5.3, after_a_word=False).is_cause(error)
    assert Vanished(0, 5.3, after_a_word=False).is_cause(None)
    undated = protocol.Failure(Status.STOPPED, "stopped by SIGINT", protocol.Source(1))
    assert Vanished(0, 5.3, after_a_word=False).is_cause(undated)  # by arrival: no time said
    assert not Vanished(0, 5.3, after_a_word=True).is_cause(undated)


def test_a_watched_process_dates_its_failure_on_the_runs_clock(monkeypatch):
    """A process under `anatomy watch` says its stop and its error with the time they came on
    the watch's clock ($ANATOMY_T0), which every rank of the machine shares."""
    import threading
    import time
    from multiprocessing.connection import Listener

    from anatomy.engine import attach, link
    from anatomy.engine.endings import Ending

    key, heard = os.urandom(16), []
    address = link.new_address()
    monkeypatch.setenv("RANK", "1")
    with Listener(link.socket_address(address), family="AF_UNIX", authkey=key) as listener:
        def watch() -> None:
            with listener.accept() as connection:
                connection.send(link.Ready(7))
                with contextlib.suppress(EOFError):
                    while True:
                        heard.append(connection.recv())

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        t0 = time.monotonic() - 1000.0  # the watch started its run before this process
        watched = attach._WatchLink(address, key, t0)
        before = time.monotonic() - t0
        watched.stop("stopped by SIGTERM")
        watched.close(Ending(Status.FAILED, "ValueError: bad batch"))
        after = time.monotonic() - t0
        watching.join()
    assert [(f.status, f.source.rank) for f in heard] == [(Status.STOPPED, 1), (Status.FAILED, 1)]
    assert all(before <= f.t <= after for f in heard), heard


@pytest.mark.parametrize("script, status, words", [
    ("raise SystemExit(main())", Status.COMPLETED, "whose exit code anatomy cannot read"),
    ("raise SystemExit(3)", Status.FAILED, "exited with code 3"),
    ("raise SystemExit('fatal')", Status.FAILED, "exited with code 1: fatal"),
    ("raise SystemExit", Status.COMPLETED, None),
])
def test_a_scripts_own_raise_of_systemexit_ends_its_run_as_its_bytecode_says(script, status,
                                                                               words):
    """The code of `raise SystemExit(constant)` is in the script's bytecode; that of `raise
    SystemExit(main())`, the idiom of scripts that succeed, is gone by exit: completed, saying
    so, not failed."""
    module = compile(f"def main():\n    return 0\n{script}\n", "train.py", "exec")
    with pytest.raises(SystemExit) as raised:
        exec(module, {"__name__": "__main__"})
    watch = ExitWatch.__new__(ExitWatch)  # without its hooks on this process's sys.exit
    watch.frame, watch.code = raised.tb.tb_next.tb_frame, exits._UNKNOWN  # no sys.exit seen
    ending = watch.ending()
    assert ending.status == status
    assert (words in ending.error) if words else ending.error is None


@pytest.mark.parametrize("text", [
    "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",                          # cgroup v1
    "low 0\nhigh 0\nmax 12\noom 4\noom_kill 3\noom_group_kill 0\n",           # cgroup v2
    "pgfault 7\noom_kill 3\nunevictable_pgs_culled 0\n",                      # /proc/vmstat
])
def test_a_sigkill_is_the_out_of_memory_killers_only_where_its_count_rose(tmp_path, monkeypatch,
                                                                          text):
    """A CPU run out of RAM is SIGKILLed by the kernel without a word; the count of such kills in
    the cgroup the process lived in tells it from a user's kill -9 — read while it lived, so that
    another process of that cgroup killed earlier is not taken for its kill."""
    from anatomy.engine import cgroups
    from anatomy.engine.endings import OomKills

    counter = tmp_path / "counter"
    counter.write_text(text)
    monkeypatch.setattr(cgroups, "oom_kill_counter", lambda pid: counter)
    kills = OomKills(os.getpid())  # this process: alive, no kill on its way
    assert kills.count == 3
    assert not kills.killed(-signal.SIGKILL)  # a kill -9: the count stayed
    counter.write_text(text.replace("oom_kill 3", "oom_kill 4"))
    assert kills.killed(-signal.SIGKILL)
    assert kills.killed(128 + signal.SIGKILL)  # a shell's child's
    assert not kills.killed(-signal.SIGTERM)
    assert not kills.killed(1)
    kills.look()  # the kill was another process's, read while this one lived on
    assert kills.count == 4 and not kills.killed(-signal.SIGKILL)
    counter.unlink()  # the cgroup gone meanwhile
    assert not kills.killed(-signal.SIGKILL)


def test_nothing_told_is_no_kill_for_memory(monkeypatch):
    from anatomy.engine import cgroups
    from anatomy.engine.endings import OomKills

    monkeypatch.setattr(cgroups, "oom_kill_counter", lambda pid: None)
    assert not OomKills(os.getpid()).killed(-signal.SIGKILL)


def test_a_count_read_once_a_kill_is_on_its_way_is_not_kept(tmp_path, monkeypatch):
    """The kernel sends its SIGKILL, then counts the kill: a reading taken between, or later
    (the process exiting, a zombie), would hold the process's own kill."""
    from anatomy.engine import cgroups, endings

    counter = tmp_path / "counter"
    counter.write_text("oom_kill 3\n")
    monkeypatch.setattr(cgroups, "oom_kill_counter", lambda pid: counter)
    kills = endings.OomKills(os.getpid())
    counter.write_text("oom_kill 4\n")
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "PROC", proc)
    kills.pid = 7
    for stat, status in [("7 (python) R 1 7 7 0 -1 4194560", "SigPnd:\t0000000000000100\n"),
                         ("7 (python) R 1 7 7 0 -1 4194560", "ShdPnd:\t0000000000000100\n"),
                         ("7 (python) R 1 7 7 0 -1 4194564", "SigPnd:\t0\n"),  # PF_EXITING
                         ("7 (py) thon) Z 1 7 7 0 -1 4194560", "SigPnd:\t0\n")]:
        (proc / "7" / "stat").write_text(stat)
        (proc / "7" / "status").write_text(status)
        kills.look()
        assert kills.count == 3 and kills.killed(-signal.SIGKILL), (stat, status)
    (proc / "7" / "stat").write_text("7 (python) S 1 7 7 0 -1 4194560")
    (proc / "7" / "status").write_text("SigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n")
    kills.look()  # alive, only a SIGTERM pending: the count is its cgroup's before its end
    assert kills.count == 4


def test_every_front_says_a_stopped_runs_time_is_its_steps_until_the_stop(seed, store, capsys):
    """A stopped run's Time is its steps' until the stop (its Trainer never reported one):
    `anatomy run` said "(8 steps, until stopped)", while `show` and the Live page's summary said
    a bare "Time: 3.20 s" of it, as of a run that completed."""
    from anatomy.analysis.report import report, trained_until_stopped
    from anatomy.cli import main
    from anatomy.views.live import summary_lines

    stopped = seed(backend="cpu-rss", status="stopped", error="stopped by the user")
    store.update_run(stopped, summary=trained_until_stopped(store, stopped))
    completed = seed(backend="cpu-rss")
    store.update_run(completed, summary={"time_s": 3.2, "samples_per_second": 10.0, "steps": 8})
    for run_id, time_line in ((stopped, "Time: 3.20 s (8 steps, until stopped)"),
                              (completed, "Time: 3.20 s")):
        assert main(["show", str(run_id), "--store", str(store.path)]) == 0
        shown = capsys.readouterr().out.splitlines()
        assert time_line in shown and "Samples/second: 10.00" in shown, shown
        assert summary_lines(report(store, run_id))[:2] == [time_line, "Samples/second: 10.00"]


def test_show_says_a_stop_in_its_own_words(seed, store, capsys):
    """A run stopped by a signal: show printed "error: stopped by SIGTERM" (and `run` "stopped:
    stopped by SIGTERM"); a failure stays an error."""
    from anatomy.cli import main

    stopped = seed(status="stopped", error="stopped by SIGTERM")
    failed = seed(status="failed", error="RuntimeError: boom")
    for run_id, said in ((stopped, "stopped by SIGTERM"), (failed, "error: RuntimeError: boom")):
        assert main(["show", str(run_id), "--store", str(store.path)]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == said
