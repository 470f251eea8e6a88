"""How a run ends in words and numbers, the same for every front (engine/endings.py, exits.py)."""

from __future__ import annotations

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
def test_a_sigkill_is_the_out_of_memory_killers_only_where_its_count_rose(tmp_path, text):
    """A CPU run out of RAM is SIGKILLed by the kernel without a word; the kernel's count of
    such kills (the process's cgroup's, else the machine's) tells it from a user's kill -9."""
    from anatomy.engine.endings import OomKills, killed_for_memory

    counter = tmp_path / "counter"
    counter.write_text(text)
    before = OomKills(str(counter), 3)
    assert not killed_for_memory(-signal.SIGKILL, before)  # a kill -9: the count stayed
    counter.write_text(text.replace("oom_kill 3", "oom_kill 4"))
    assert killed_for_memory(-signal.SIGKILL, before)
    assert killed_for_memory(128 + signal.SIGKILL, before)  # a shell's child's
    assert not killed_for_memory(-signal.SIGTERM, before)
    assert not killed_for_memory(1, before)
    assert not killed_for_memory(-signal.SIGKILL, OomKills(None, None))  # nothing tells it
    counter.unlink()  # the cgroup gone meanwhile
    assert not killed_for_memory(-signal.SIGKILL, before)


def test_the_count_is_read_where_this_process_lives():
    from anatomy.engine.cgroups import VMSTAT, oom_kill_counters
    from anatomy.engine.endings import OomKills

    paths = [str(p) for p in oom_kill_counters()]
    assert paths[-1] == str(VMSTAT)  # the machine's, last
    now = OomKills.now()
    assert now.path is None or (now.path in paths and now.count >= 0)


def test_show_says_a_stop_in_its_own_words(seed, store, capsys):
    """A run stopped by a signal: show printed "error: stopped by SIGTERM" (and `run` "stopped:
    stopped by SIGTERM"); a failure stays an error."""
    from anatomy.cli import main

    stopped = seed(status="stopped", error="stopped by SIGTERM")
    failed = seed(status="failed", error="RuntimeError: boom")
    for run_id, said in ((stopped, "stopped by SIGTERM"), (failed, "error: RuntimeError: boom")):
        assert main(["show", str(run_id), "--store", str(store.path)]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == said
