"""The phase API's arguments, refused before anything starts."""

from __future__ import annotations

import sys
import time

import pytest

from tests.helpers import on_screen


@pytest.mark.parametrize("rate", [0, 5000])
def test_the_phase_api_refuses_a_sample_rate_out_of_range(rate):
    import anatomy

    with pytest.raises(ValueError, match="sample_rate"):
        anatomy.start(sample_rate=rate)


def test_the_default_sample_rate_is_said_where_a_user_reads_the_signature():
    """The rate defaults to None (not given: under `anatomy watch` only a rate the script gave
    is said unused); help() says the rate it samples at, in the docstrings."""
    import inspect

    import anatomy
    from anatomy.engine.attach import DEFAULT_SAMPLE_RATE

    for front in (anatomy.start, anatomy.AnatomyCallback):
        assert inspect.signature(front).parameters["sample_rate"].default is None
        assert f"(default {DEFAULT_SAMPLE_RATE})" in inspect.getdoc(front)


@pytest.mark.parametrize("call", [
    lambda run: run.phase(None), lambda run: run.phase(""), lambda run: run.note(None),
    lambda run: run.note("ok", level=None), lambda run: run.phase("caf\udce9")])
def test_a_mark_without_a_name_is_refused_at_the_call(call):
    """`run.phase(None)`, `run.note(None)` were taken: the store's NOT NULL refused them later
    and ended the recording of the whole run ("could not be written … the training went on
    unrecorded"). Refused where the script made the call, with what was wrong."""
    import time

    from anatomy.engine import attach

    run = attach.Run(attach._Unrecorded(), time.monotonic(), dwell=0.0)  # records nowhere
    with pytest.raises(ValueError, match="must be text, got|is not UTF-8 text"):
        call(run)  # a file name's bytes: SQLite's UnicodeEncodeError ended the recording
    run.phase("my own phase")  # any text names a phase of the user's
    run.note("a word", level="debug")


def test_a_phase_is_named_in_one_line_and_a_note_may_take_several():
    """A phase named with a newline or a terminal's escape broke the tables that list it, and
    coloured what a terminal showed after it."""
    import time

    from anatomy.engine import attach

    run = attach.Run(attach._Unrecorded(), time.monotonic(), dwell=0.0)  # records nowhere
    for name in ("eval\nloop", "eval\x1b[2J", "a\tb"):
        with pytest.raises(ValueError, match=r"^phase: holds the control character "):
            run.phase(name)
    run.note("a first line\nand a second")


@pytest.mark.parametrize("kwargs, words", [
    ({"step": -5}, "step: must be a whole number from 0, got -5"),
    ({"total": -1}, "total: must be a whole number from 0, got -1"),
    ({"step": 2.5}, "step: must be a whole number from 0, got 2.5"),
    ({"loss": "abc"}, "loss: must be one number (loss.item()), got 'abc'"),
    ({"loss": [1.0, 2.0]}, "loss: must be one number (loss.item()), got [1.0, 2.0]"),
    # SQLite's INTEGER ends at 2**63 - 1: the store's OverflowError ended the recording of the
    # whole run, its phases lost; float()'s OverflowError came from inside anatomy
    ({"step": 2**70}, "step: must be a whole number from 0, got 1180591620717411303424"),
    ({"total": 2**63}, "total: must be a whole number from 0, got 9223372036854775808"),
    ({"loss": 10**400}, "loss: must be one number (loss.item()), got " + repr(10**400)[:57]
     + "..."),
    ({"batch_size": 0}, "batch_size: must be a whole number from 1, got 0"),
    ({"batch_size": "8"}, "batch_size: must be a whole number from 1, got '8'"),
])
def test_a_step_that_no_import_would_take_is_refused_at_the_call(kwargs, words):
    """`run.step(step=-5)` was stored, and the run's export was then refused by every import
    ("steps[0].step: must be a whole number from 0"); a loss that is no number raised float()'s
    own words."""
    import time

    from anatomy.engine import attach

    run = attach.Run(attach._Unrecorded(), time.monotonic(), dwell=0.0)
    with pytest.raises(ValueError) as refused:
        run.step(**kwargs)
    assert str(refused.value) == words
    run.step(loss=0.5, step=0, total=0)  # a step 0 and an unknown length are the user's to say


@pytest.mark.parametrize("rank, local, world, read", [
    ("1", "1", "2", (1, 1, 2)),
    ("²", "1", "2", (1, 1, 2)),      # RANK unreadable: LOCAL_RANK is the rank
    ("٣", "²", "٣", (0, None, 1)),   # nothing readable: one process alone
    ("", "", "0", (0, None, 1)),
])
def test_a_launchers_rank_and_world_size_are_read_as_ascii_digits(rank, local, world, read,
                                                                  monkeypatch):
    """anatomy.start() under RANK=² raised int()'s ValueError in the user's script ("²" is a digit
    to str.isdigit()), and RANK=٣ was read as rank 3."""
    from anatomy.engine import attach

    for name, value in (("RANK", rank), ("LOCAL_RANK", local), ("WORLD_SIZE", world)):
        monkeypatch.setenv(name, value)
    assert (attach._rank(), attach._local_rank(), attach.launched_world_size()) == read


@pytest.mark.parametrize("kwargs, words", [
    ({"sample_rate": "fast"}, "sample_rate: must be a number of samples a second, got 'fast'"),
    ({"store": 5}, "store: must be a path, got 5"),
    # recorded into the default store without a word, where `--store ''` is refused
    ({"store": " "}, "store: an empty path names no store: give a file, or leave store out for "
                     "the default"),
    ({"name": 5}, "name: must be text, got 5"),
    # TypeError: 'int' object is not iterable, from inside anatomy
    ({"gpus": 0}, "gpus: must be a list of visible GPUs' indices (gpus=[0, 1]), got 0"),
    ({"gpus": "0,1"}, "gpus: must be a list of visible GPUs' indices (gpus=[0, 1]), got '0,1'"),
    ({"name": "caf\udce9"}, "name: holds the byte 0xe9, which is not UTF-8 text"),
    ({"name": "red\x1b[31m"}, "name: holds the control character '\\x1b': give one line of "
                               "printable text")])
def test_an_argument_of_the_wrong_kind_is_refused_in_the_apis_words(kwargs, words):
    """(before: TypeError: '<=' not supported between instances of 'int' and 'str', and
    pathlib's "expected str, bytes or os.PathLike object, not int", from inside anatomy; a name
    of a Latin-1 file name's bytes, SQLite's UnicodeEncodeError from the store)"""
    import anatomy

    with pytest.raises(ValueError) as refused:
        anatomy.start(**kwargs)
    assert str(refused.value) == words
    assert anatomy.current() is None  # nothing started


def test_a_run_pickled_into_another_process_marks_nowhere_there(tmp_path):
    """A Dataset holding the run, loaded by a spawn-context DataLoader (or the run passed to a
    spawned Process), ended the user's training: "TypeError: cannot pickle '_thread.lock'
    object". Pickled, it is a run that marks nothing, as in a forked child: the recording is the
    parent's, and stays untouched."""
    import pickle
    import time
    from multiprocessing.reduction import ForkingPickler

    from anatomy.engine import attach

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    there = pickle.loads(ForkingPickler.dumps(run))
    assert there.id == 7 and there.ended
    there.phase("loading")
    there.step(loss=1.0)
    there.note("from a worker")
    there.end()
    assert heard.messages == [] and not run.ended
    run.phase("training")  # the parent's run records on
    assert heard.messages[-1].mark.name == "training"


def test_a_second_start_that_names_another_run_says_it_is_not_one(capsys, monkeypatch):
    """A loop over trials (or a notebook's cell run again) calling `anatomy.start(name=…)`
    without `run.end()`: the run already recording was returned and the name dropped without a
    word, every trial one run under the first trial's name. Still the same run (a second call
    returns it), now said; a plain `start()` again says nothing."""
    from anatomy.engine import attach

    run = attach.Run(_Heard(), time.monotonic(), dwell=0.0)
    monkeypatch.setattr(attach, "_current", run)
    assert attach.start() is run
    assert capsys.readouterr().err == ""
    assert attach.start("lr=1e-4", sample_rate=500, store="trials.sqlite") is run
    assert capsys.readouterr().err == (
        "anatomy: anatomy.start(name='lr=1e-4', store='trials.sqlite', sample_rate=500): run 7 "
        "records this process already and is returned as it is, these not used; run.end() ends "
        "it, and start() then records a new run\n")


def test_a_phase_as_a_block_ends_with_the_block():
    """`with run.phase("training"): …` ended the script in "TypeError: 'NoneType' object does not
    support the context manager protocol" (the run failed with it). The block's end now ends the
    training phase; a phase held a moment ("eval") has ended already and is not ended twice; an
    error in the block goes on as it would have."""
    from anatomy.engine import attach, protocol

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    with run.phase("training") as entered:
        assert entered is run
        run.step(loss=1.0)
    with pytest.raises(ValueError, match="bad batch"), run.phase("eval"):
        raise ValueError("bad batch")
    marks = [(m.mark.edge, m.mark.name) if isinstance(m, protocol.Phase) else "step"
             for m in heard.messages if isinstance(m, (protocol.Phase, protocol.StepReport))]
    assert marks == [("start", "training"), "step", ("end", "training"), ("start", "eval"),
                     ("end", "eval")]
    assert run.reporter.open_phase is None and not run.ended


class _Heard:
    """A run's link that keeps what it is sent."""

    run_id = 7

    def __init__(self):
        self.messages = []

    def put(self, message):
        self.messages.append(message)

    def close(self, ending, held=None):
        self.ending = ending


def test_a_mark_after_the_runs_end_is_said_once_not_lost_without_a_word(capsys):
    """`run.end()` and then `run.phase("eval")`, `run.step(…)`: nothing was recorded and
    nothing said. Still not recorded (the run's ending is written), now said once."""
    import time

    from anatomy.engine import attach

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    run.phase("training")
    run.end()
    sent = len(heard.messages)
    run.phase("eval")
    run.step(loss=1.0)
    run.note("late")
    run.describe(model_name="m")
    assert len(heard.messages) == sent
    err = capsys.readouterr().err
    assert err == ("anatomy: run 7 has ended: run.phase('eval') after its end is not recorded "
                   "(nor any mark after it); anatomy.start() records a new run\n")
    with pytest.raises(ValueError):  # a wrong call is still refused as such
        run.step(step=-1)


def test_a_line_said_while_a_progress_bar_is_drawn_is_a_line_of_its_own(capsys):
    """A Trainer's tqdm bar (or a loop's) is open on stderr as the run says something: its
    closing line, a warning. The line was printed after the bar's last character, so the
    terminal showed "3/10 [00:00<?, ?it/s]anatomy: run 7 has ended: …"; now the bar is cleared,
    the line printed, and the bar drawn again below it, as tqdm.write does."""
    import time

    from tqdm import tqdm

    from anatomy.engine import attach

    run = attach.Run(_Heard(), time.monotonic(), dwell=0.0)
    run.end()
    bar = tqdm(total=10, file=sys.stderr)
    bar.update(3)
    bar.refresh()
    run.phase("eval")  # said once: after its end
    bar.close()
    shown = on_screen(capsys.readouterr().err)
    said = ("anatomy: run 7 has ended: run.phase('eval') after its end is not recorded (nor any "
            "mark after it); anatomy.start() records a new run")
    assert said in shown, shown
    assert "3/10" in shown[shown.index(said) + 1]  # the bar, drawn again below the line


def test_a_loss_tensor_that_requires_grad_is_read_without_a_warning_from_anatomy(recwarn):
    """`run.step(loss=loss)` with the training's own loss tensor printed torch's "UserWarning:
    Converting a tensor with requires_grad=True to a scalar may lead to unexpected behavior",
    pointing at anatomy's line."""
    import time

    import torch

    from anatomy.engine import attach

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    weight = torch.tensor(2.0, requires_grad=True)
    run.step(loss=weight * 3)
    assert [str(w.message) for w in recwarn] == []
    assert heard.messages[-1].step.loss == 6.0


def test_a_scripts_phase_named_profiling_is_kept_as_its_own_and_in_the_peak(capsys):
    """`run.phase("profiling")` in a user's loop took the name of anatomy's torch.profiler
    stretch: `show` dropped the phase, and the run's peak was read before it began (42 MB of a
    run that held 342 MB in and after it). Recorded under a name of the script's, said once."""
    import time

    from anatomy.engine import attach
    from anatomy.vocabulary import Phase

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    run.phase("training")
    run.phase("profiling")
    run.phase(Phase.PROFILING)
    names = {m.mark.name for m in heard.messages if hasattr(m, "mark")}
    assert names == {"training", "profiling (the script's)"}
    assert capsys.readouterr().err.count("\n") == 1


class _InterruptedAsItCloses(_Heard):
    """A link whose ending is written while Ctrl-C is pressed."""

    def close(self, ending, held=None):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler here, as in the recording's wait
        self.ending = ending


def test_ctrl_c_while_the_ending_is_written_is_held_until_it_is_written(capsys):
    """A Ctrl-C while run.end() waited for its ending raised inside anatomy: the run was left
    running. It is held, said once, and raised once the ending is written; where the run ends
    by that very Ctrl-C (`with anatomy.start()`, its KeyboardInterrupt) it is dropped. With
    Python's own Ctrl-C handler, as a script started from a terminal has it (a test session
    started with `&` inherits SIGINT ignored)."""
    import signal

    from anatomy.engine import attach

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_as_it_closes(attach, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_as_it_closes(attach, capsys) -> None:
    for error in (None, KeyboardInterrupt()):
        link = _InterruptedAsItCloses()
        run = attach.Run(link, time.monotonic(), dwell=0.0)
        run.phase("training")
        if error is None:
            with pytest.raises(KeyboardInterrupt):
                run.end()
        else:
            run.end(error)
        assert link.ending.status == ("completed" if error is None else "stopped")
        assert capsys.readouterr().err == ("anatomy: run 7: Ctrl-C: writing how the run ended "
                                           "first\n")


def test_steps_that_say_their_batch_size_give_the_run_its_batch_size_and_samples_a_second():
    """A plain loop's run had no speed on any page (`run.step()` took no batch size): its
    batch size (the largest said) is described as a Trainer's is, and its end reports the
    steps, the time and the samples a second from the training phase's start."""
    from anatomy.engine import attach, protocol

    heard = _Heard()
    run = attach.Run(heard, time.monotonic(), dwell=0.0)
    run.phase("training")
    for size in (8, 8, 4):
        time.sleep(0.05)
        run.step(loss=1.0, batch_size=size)
    run.end()
    described = [m.options for m in heard.messages if isinstance(m, protocol.Described)]
    assert described == [{"batch_size": 8}]
    [summary] = [m.summary for m in heard.messages if isinstance(m, protocol.Summarised)]
    assert summary.steps == 3 and summary.time_s >= 0.15
    assert summary.samples_per_second == pytest.approx(20 / summary.time_s, rel=1e-2)
    unsized = attach.Run(_Heard(), time.monotonic(), dwell=0.0)
    unsized.step(batch_size=8)
    time.sleep(0.01)
    unsized.step()  # one step did not say: the samples a second are not known
    unsized.end()
    [summary] = [m.summary for m in unsized.link.messages if isinstance(m, protocol.Summarised)]
    assert summary.samples_per_second is None and summary.steps == 2


def _summary(run) -> object:
    from anatomy.engine import protocol

    [summary] = [m.summary for m in run.link.messages if isinstance(m, protocol.Summarised)]
    return summary


def test_a_step_with_no_time_before_it_gives_no_time_and_no_speed():
    """One step reported as the training phase began (or with no training phase marked: the
    run's start was read as the training's): the run stored "Time: 0.00 s" and 18,860 samples a
    second, a speed measured over no time, or over loading torch. A time under a hundredth of a
    second measures nothing: the steps are kept, without a time or a speed."""
    from anatomy.engine import attach

    marked = attach.Run(_Heard(), time.monotonic(), dwell=0.0)
    marked.phase("training")
    marked.step(loss=1.0, batch_size=8)
    marked.end()
    unmarked = attach.Run(_Heard(), time.monotonic() - 5.0, dwell=0.0)  # 5 s of setup
    unmarked.step(loss=1.0, batch_size=8)
    unmarked.end()
    for run in (marked, unmarked):
        summary = _summary(run)
        assert (summary.steps, summary.time_s, summary.samples_per_second) == (1, None, None)


def test_without_a_training_phase_the_speed_is_measured_from_the_first_step():
    """Steps with no training phase marked: their time was read from the run's start, the
    loading of torch and the model's building counted as training (5 s of setup and 0.1 s of
    steps: 4.7 samples a second where the steps made 160). Where the training began is not
    known; its first step's end is the first moment known to be in it: the speed is measured over
    the steps after it."""
    from anatomy.engine import attach

    run = attach.Run(_Heard(), time.monotonic() - 5.0, dwell=0.0)
    for _ in range(3):
        run.step(loss=1.0, batch_size=8)
        time.sleep(0.05)
    run.step(loss=1.0, batch_size=8)
    run.end()
    summary = _summary(run)
    assert summary.steps == 4 and 0.15 <= summary.time_s < 1.0
    assert summary.samples_per_second == pytest.approx(24 / summary.time_s, rel=1e-2)
