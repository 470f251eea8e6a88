"""Rename, tag, filter and delete runs: through the CLI, as a user would, and the Runs page's rows."""

from __future__ import annotations

import io
import json

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import run_rows
from anatomy.cli import main
from tests.helpers import one_line


@pytest.fixture
def runs(store, seed):
    """Three runs: bert-large completed, bert-large out of memory, tiny completed."""
    large = seed()
    oom = seed(status="oom", error="CUDA out of memory")
    tiny = store.create_run(RunOptions(preset="tiny").to_dict(), "cpu-rss", "rss", 0, {})
    store.finish(tiny, "completed")
    return large, oom, tiny


def cli(store, *args: str) -> int:
    return main([*args, "--store", str(store.path)])


def listed(store, capsys, *filters: str) -> list[int]:
    capsys.readouterr()
    assert cli(store, "runs", "--json", *filters) == 0
    return [row["id"] for row in json.loads(capsys.readouterr().out)]


def test_rename_names_a_run_and_an_empty_name_removes_it(store, runs, capsys):
    large, _, _ = runs
    assert cli(store, "rename", str(large), "walkthrough, batch 4") == 0
    assert capsys.readouterr().out == f"run {large}: walkthrough, batch 4\n"
    assert store.run(large).name == "walkthrough, batch 4"
    assert next(r for r in run_rows(store) if r.id == large).name == "walkthrough, batch 4"
    assert cli(store, "rename", str(large), "") == 0
    assert store.run(large).name is None


def test_tags_are_added_removed_and_filtered(store, runs, capsys):
    large, oom, tiny = runs
    assert cli(store, "tag", str(large), "h200", "baseline") == 0
    assert cli(store, "tag", str(oom), "h200", "h200") == 0
    assert cli(store, "tag", str(tiny), "h2") == 0
    assert store.run(large).tags == ("h200", "baseline") and store.run(oom).tags == ("h200",)
    assert listed(store, capsys, "--tag", "h200") == [oom, large]
    assert listed(store, capsys, "--tag", "h2") == [tiny]  # whole tags: h2 is not h200
    assert cli(store, "tag", str(large), "baseline", "--remove") == 0
    assert capsys.readouterr().out.endswith(f"run {large} tags: h200\n")
    assert listed(store, capsys, "--tag", "baseline") == []


def test_a_tag_with_a_comma_is_refused(store, runs, capsys):
    assert cli(store, "tag", str(runs[0]), "a,b") == 2
    assert "a tag cannot contain a comma: 'a,b'" in capsys.readouterr().err
    assert store.run(runs[0]).tags == ()


@pytest.mark.parametrize("text", ["red\x1b[31m", "two\nlines", "bell\x07", "a\tb"])
def test_a_name_or_tag_that_is_not_one_line_of_printable_text_is_refused(store, runs, capsys,
                                                                           text):
    """A newline broke the lines that list the run; a terminal's escape, echoed as the rename
    answers, coloured (or cleared) the user's terminal. The dashboard's labels are saved
    through the same store."""
    assert cli(store, "rename", str(runs[0]), text) == 2
    assert one_line(capsys.readouterr().err).startswith("error: name: holds the control character ")
    assert cli(store, "tag", str(runs[0]), text) == 2
    assert one_line(capsys.readouterr().err).startswith("error: tag: holds the control character ")
    assert store.run(runs[0]).name is None and store.run(runs[0]).tags == ()
    with pytest.raises(SystemExit) as refused:
        cli(store, "watch", "--name", text, "--", "true")
    assert refused.value.code == 2 and "argument --name: holds the control character " in \
        capsys.readouterr().err
    assert len(store.runs()) == len(runs)  # nothing started


def test_runs_filter_by_preset_and_status_and_together(store, runs, capsys):
    large, oom, tiny = runs
    store.set_tags(oom, ["h200"])
    assert listed(store, capsys, "--preset", "bert-large-uncased") == [oom, large]
    assert listed(store, capsys, "--status", "completed") == [tiny, large]
    both = ("--preset", "bert-large-uncased", "--status", "oom", "--tag", "h200")
    assert listed(store, capsys, *both) == [oom]
    # the Runs page's keyword arguments, and its callers that pass none
    assert [r.id for r in run_rows(store, preset="tiny")] == [tiny]
    assert [r.id for r in run_rows(store)] == [tiny, oom, large]
    assert cli(store, "runs", "--status", "stopped") == 0
    assert "no stored run has status stopped" in capsys.readouterr().out


def test_runs_of_a_model_folder_are_found_by_its_path_as_typed_or_whole(store, capsys,
                                                                       tmp_path, monkeypatch):
    """A run stores its model folder's absolute path (RunOptions.located); one stored before
    kept it as typed: `runs --model ./my-model` lists both, from the folder it names."""
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    before = store.create_run(RunOptions(model="./my-model").to_dict(), "cpu-rss", "rss", 0, {})
    now = store.create_run(RunOptions(model="./my-model").located().to_dict(), "cpu-rss", "rss",
                           0, {})
    assert store.run(now).options["model"] == str(tmp_path / "my-model")
    assert listed(store, capsys, "--model", "./my-model") == [now, before]
    assert listed(store, capsys, "--model", str(tmp_path / "my-model")) == [now]
    assert cli(store, "runs", "--model", "./gone") == 0
    assert "no stored run has model ./gone" in capsys.readouterr().out


def test_an_empty_tag_filter_is_refused_not_read_as_untagged(store, runs, capsys):
    """`anatomy runs --tag "$TAG"` with TAG unset listed every untagged run."""
    store.set_tags(runs[0], ["baseline"])
    with pytest.raises(SystemExit) as exit_:
        cli(store, "runs", "--tag", "")
    assert exit_.value.code == 2
    assert "'' is not a tag: a tag is not empty and holds no comma" in capsys.readouterr().err
    assert listed(store, capsys, "--tag", " baseline ") == [runs[0]]


def test_a_status_that_is_none_is_refused_with_the_statuses_by_name(store, capsys):
    """The refusal listed them as "<Status.RUNNING: 'running'>, <Status.COMPLETED: …>"."""
    with pytest.raises(SystemExit):
        cli(store, "runs", "--status", "done")
    error = capsys.readouterr().err
    assert "invalid choice: 'done' (choose from 'running', 'completed', 'failed', 'oom'," in error
    assert "<Status" not in error


def test_a_long_or_multiline_name_keeps_the_table_one_screen_wide(store, runs, capsys):
    """anatomy.start(name="x" * 100000) padded every row of `runs` to 100,000 characters; a
    name with a line break (no name is given one now: a run imported, or stored before) split
    its row in two."""
    store.rename_run(runs[0], "x" * 100_000)
    store.update_run(runs[1], name="first line\nsecond line")
    capsys.readouterr()
    assert cli(store, "runs") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(runs) and max(map(len, lines)) < 250
    assert any("first line second line" in line for line in lines)
    assert any("xxx…xxx" in line for line in lines)


def test_a_name_with_control_characters_prints_no_control_character(store, runs, capsys):
    """A name with a carriage return, a tab or a terminal escape (an imported run's, a
    describe()'d one) went to the terminal as it was: the escape coloured the rest of the
    table, the return wrote the row over its own start, the tab broke the columns. (No name is
    given one now: a run imported, or stored before, may hold one.)"""
    store.update_run(runs[0], name="over\rwritten\tname \x1b[31mred\x1b[0m\x07")
    capsys.readouterr()
    assert cli(store, "runs") == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\r\t\x1b\x07")
    (row,) = [line for line in out.splitlines() if line.startswith(f"{runs[0]} ")]
    assert row.endswith("over written name ?[31mred?[0m?")


def test_a_run_without_a_sample_shows_its_peak_as_not_measured(store, runs, capsys):
    """A run stopped before its first sample (a store that could not be written, a kill at
    once): `show` printed "peak: None MB"."""
    capsys.readouterr()
    assert cli(store, "show", str(runs[2])) == 0
    assert "peak: not measured   samples: 0   steps: 0" in capsys.readouterr().out.splitlines()


def test_the_table_shows_tags_and_names(store, runs, capsys):
    store.rename_run(runs[0], "walkthrough")
    store.set_tags(runs[0], ["h200"])
    capsys.readouterr()
    assert cli(store, "runs") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"{runs[0]} "))
    assert line.rstrip().endswith("h200  walkthrough")


def test_delete_with_yes_removes_the_run_and_its_rows(store, runs, capsys):
    large, oom, tiny = runs
    assert cli(store, "delete", str(oom), "--yes") == 0
    assert capsys.readouterr().out == f"deleted run {oom}\n"
    assert store.run(oom) is None and store.sample_count(oom) == 0
    assert [r.id for r in run_rows(store)] == [tiny, large]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("answer, deleted", [("y\n", True), ("yes\n", True), ("n\n", False), ("\n", False)])
def test_delete_asks_on_a_terminal(store, runs, capsys, monkeypatch, answer, deleted):
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    assert cli(store, "delete", str(runs[1])) == (0 if deleted else 1)
    assert f"Delete run {runs[1]} (bert-large-uncased, oom, 91 samples)?" in capsys.readouterr().out
    assert (store.run(runs[1]) is None) is deleted


def test_delete_without_a_terminal_needs_yes(store, runs, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert cli(store, "delete", str(runs[1])) == 2
    assert "confirm with --yes" in capsys.readouterr().err
    assert store.run(runs[1]) is not None


@pytest.mark.parametrize("command", [["rename", "1", "x"], ["tag", "1", "x"],
                                     ["delete", "1", "--yes"]], ids=" ".join)
def test_editing_a_run_of_a_store_that_is_not_there_makes_none(tmp_path, capsys, command):
    """`anatomy rename 1 x --store typo/s.sqlite` made the folder typo/ and an empty store in it,
    then said that run 1 was not in it. A folder that is not there is refused as such; a store
    that is not there says the run is not in it."""
    path = tmp_path / "typo" / "s.sqlite"
    assert main([*command, "--store", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: the store {path}: its directory {path.parent} "
                                       "does not exist\n")
    assert not path.parent.exists()
    path = tmp_path / "s.sqlite"
    assert main([*command, "--store", str(path)]) == 1
    assert capsys.readouterr().err == f"error: run 1 is not in {path} (no store there yet)\n"
    assert not path.exists()


def test_ctrl_d_at_the_delete_prompt_is_no(store, runs, capsys, monkeypatch):
    """Ctrl-D at "Delete run N …? [y/N]" was an EOFError traceback."""
    monkeypatch.setattr("sys.stdin", Terminal(""))
    assert cli(store, "delete", str(runs[1])) == 1
    out, err = capsys.readouterr()
    assert out.endswith("not deleted\n") and err == ""
    assert store.run(runs[1]) is not None


def test_delete_with_standard_input_closed_needs_yes(store, runs, capsys, monkeypatch):
    """`anatomy delete N <&-` was an AttributeError traceback."""
    monkeypatch.setattr("sys.stdin", None)
    assert cli(store, "delete", str(runs[1])) == 2
    assert "confirm with --yes" in capsys.readouterr().err
    assert store.run(runs[1]) is not None


def test_a_running_run_is_not_deleted(store, seed, capsys):
    live = seed(status="running")  # its worker is this very process: alive
    assert cli(store, "delete", str(live), "--yes") == 2
    assert "still running: stop it first" in capsys.readouterr().err
    assert store.run(live) is not None


@pytest.mark.parametrize("command", [["rename", "42", "x"], ["tag", "42", "x"], ["delete", "42", "--yes"]])
def test_an_unknown_run_is_a_message(store, capsys, command):
    assert cli(store, *command) == 1
    assert "run 42 is not in" in capsys.readouterr().err


def test_a_gpu_model_named_is_a_gpus_prediction_on_a_machine_without_one():
    """`predict --gpu-model "NVIDIA H200"` on a CPU machine predicts for that GPU (it predicted
    for this machine's RAM, the GPU named and ignored); with --device cpu it is refused."""
    from anatomy.analysis.machine import Machine
    from anatomy.prediction import Target, device_constants, target
    from anatomy.vocabulary import Backend

    cpu_only = Machine(Backend.CPU_RSS, "none", (), None, None, 24 * 2**30, "no GPU")
    assert target(cpu_only, gpu_model="NVIDIA H200") == Target(
        "cuda", "NVIDIA H200", device_constants.load("NVIDIA H200").total_bytes)
    assert target(cpu_only) == Target("cpu", None, 24 * 2**30)


def test_a_gpu_model_with_device_cpu_is_one_line_and_predicts_nothing(capsys):
    assert main(["predict", "--device", "cpu", "--gpu-model", "NVIDIA H200"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--device cpu" in err


def test_what_fits_for_several_processes_is_one_line_and_searches_nothing(capsys, monkeypatch):
    """`predict --max-batch-size --processes 2` answered "≥ 4096" for one process alone (two
    CPU ranks share one RAM); the form says so too (views/live.py)."""
    from anatomy import prediction

    def searched(*args, **kwargs):
        raise AssertionError("the search ran")
    monkeypatch.setattr(prediction, "max_batch_size", searched)
    assert main(["predict", "--model", "tiny", "--max-batch-size", "--processes", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "answers for one process alone, not for 2" in err


@pytest.mark.parametrize("extra, words", [
    ([], "there is none here"),
    (["--max-batch-size"], "there is none here"),
    (["--max-batch-size", "--gpu-model", "NVIDIA H200"], "there is none here")])
def test_measuring_the_convolutions_is_refused_in_a_line_where_it_cannot(capsys, monkeypatch,
                                                                          extra, words):
    """--measure-convolutions measures this machine's GPU (for the batch size, or the largest
    one): without one, one line, and nothing traced."""
    from anatomy import prediction

    def searched(*args, **kwargs):
        raise AssertionError("the search ran")
    monkeypatch.setattr(prediction, "max_batch_size", searched)
    monkeypatch.setattr(prediction, "predict", searched)
    assert main(["predict", "--model", "tiny", "--measure-convolutions", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err


def test_ctrl_c_in_a_command_that_keeps_no_run_is_one_line(monkeypatch, capsys):
    """Ctrl-C in `predict` (its trace can take seconds) printed KeyboardInterrupt's traceback:
    it stops in a line, status 130, as a shell counts an interrupt."""
    from anatomy.cli import predict

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(predict, "cmd_predict", interrupted)
    assert main(["predict", "--model", "tiny"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted" and "Traceback" not in err


def _help(capsys, *command: str) -> str:
    """A command's --help, its lines joined as one text (argparse wraps them)."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_predict_offers_what_a_prediction_reads_each_with_its_range_and_default(capsys):
    """`predict --help` listed --sample-rate, --profile-steps and --seed, which a prediction
    never reads, and no default for the batch size or the sequence length."""
    shown = _help(capsys, "predict")
    for flag in ("--seed", "--sample-rate", "--profile-steps"):
        assert flag not in shown
    assert "per_device_train_batch_size (1 to 4096; default 4)" in shown
    assert "(1 to 1048576; default 512 on a GPU, 128 without one)" in shown
    assert "(1 to 10000000; default none: the epochs decide)" in shown
    assert "(calibrated: NVIDIA H200;" in shown
    run = _help(capsys, "run")
    assert all(flag in run for flag in ("--seed", "--sample-rate", "--profile-steps"))
    assert "memory samples per second per GPU (1 to 2000; default 200)" in run


@pytest.mark.parametrize("words", ["H200", "h200", "nvidia h200", "NVIDIA-H200"])
def test_a_gpu_model_is_named_by_its_last_word_in_any_case(capsys, words):
    """`--gpu-model H200` was refused ("has no calibrated constants; calibrated: 'NVIDIA
    H200'"): here it is the H200 (refused for --device cpu, the GPU named in full)."""
    assert main(["predict", "--device", "cpu", "--gpu-model", words]) == 2
    assert "--gpu-model 'NVIDIA H200' names a GPU" in capsys.readouterr().err


def test_a_gpu_model_that_names_no_calibrated_gpu_lists_those_that_are(capsys):
    assert main(["predict", "--gpu-model", "H100"]) == 2
    assert capsys.readouterr().err == ("error: --gpu-model: 'H100' has no calibrated constants; "
                                       "calibrated: 'NVIDIA H200'\n")


def test_runs_names_a_scripts_model_as_the_runs_page_does(store, capsys):
    """A plain loop that said `run.describe(model_name="my-mlp")`: the Runs page's Model column
    read "my-mlp", `anatomy runs`' model column the script's file name ("loop.py")."""
    run_id = store.create_run({"batch_size": 32}, "rss", "rss", 0, {"model_name": "my-mlp"},
                              source={"kind": "script", "script": "/home/me/loop.py"},
                              preset="loop.py")
    store.finish(run_id, "completed")
    (listed,) = run_rows(store)
    assert listed.model == "my-mlp"
    assert cli(store, "runs") == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[4] == "my-mlp" and "loop.py" not in line, line


def test_every_option_of_every_command_says_what_it_does():
    """`anatomy show --help` and `anatomy runs --help` listed a bare "--json", every other
    command's options a line each."""
    import argparse

    from anatomy.cli import entry

    (commands,) = [a for a in entry.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [(name, action.option_strings[0]) for name, command in commands.choices.items()
              for action in command._actions if action.option_strings and not action.help]
    assert silent == []


def test_show_says_the_name_tags_and_sweep_a_run_was_given(store, runs, capsys):
    """`show` left out what `rename` and `tag` gave a run (the Runs table and page show it), and
    a name stored with control characters prints none."""
    store.rename_run(runs[0], "walkthrough café")
    store.set_tags(runs[0], ["h200", "baseline"])
    store.update_run(runs[1], name="over\rwritten\x1b[31m")
    capsys.readouterr()
    assert cli(store, "show", str(runs[0])) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "name: walkthrough café  tags: h200, baseline")
    assert cli(store, "show", str(runs[1])) == 0
    assert capsys.readouterr().out.splitlines()[1] == "name: over written?[31m"
    assert cli(store, "show", str(runs[2])) == 0
    assert not capsys.readouterr().out.splitlines()[1].startswith(("name:", "tags:"))


def test_show_prints_what_the_run_said(store, runs, capsys):
    """The run's messages (a lowered batch size, a training that raised and was caught, a
    user's note) were shown on the pages alone: `show` printed none of them."""
    from anatomy.store import Message

    store.write(runs[0], messages=[Message(1.5, "warning", "the training stopped at step 2"),
                                   Message(2.0, "info", "two\nlines")])
    capsys.readouterr()
    assert cli(store, "show", str(runs[0])) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ["warning: the training stopped at step 2", "info: two lines"]


def test_the_progress_bars_time_left_is_the_trainings_own_pace():
    """`anatomy run` said "3/3000 steps, 0 s left" at first: its clock began when it first saw
    the training phase, steps into it. The pace is the run's own: the seconds its steps took
    since the training began (the steps' and the phase's times, on the run's clock)."""
    from anatomy.cli.run import _progress

    assert _progress(3, 3000, 1.5).endswith("] 3/3000 steps,  1498 s left")
    assert _progress(0, 10, 0.0).endswith("] 0/10 steps,    ?  s left")
