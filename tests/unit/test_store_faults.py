"""Stores that cannot be used, in this process: another program's SQLite file, a file that is no
store, a damaged one, read-only commands that write nothing; the CLI's one-line errors; the
dashboard's line for a store it cannot use, and a run its dead server left running. (The faults
of a run's processes, and read-only media, are in tests/e2e/test_faults.py.)"""

from __future__ import annotations

import io
import json
import os
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from anatomy import cli
from anatomy.analysis import transfer
from anatomy.store import Store
from anatomy.store.liveness import Recorder
from tests.conftest import seed_run
from tests.helpers import one_line


def test_the_dashboard_closes_a_run_its_dead_server_left_running(store, seed):
    from tests.apptest import open_page

    run_id = seed(status="running")
    store.update_run(run_id, recorder=Recorder(2**22 + 1, time.time(), socket.gethostname()))
    assert store.run(run_id).status == "failed"  # every reader sees it ended, at once
    app = open_page("screens/live.py")
    assert "No run in progress" in app.info[0].value
    assert store.run(run_id, as_recorded=True).status == "failed"  # the page's manager wrote it


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _foreign_sqlite(path: Path) -> bytes:
    with sqlite3.connect(path) as db:  # another program's database (MLflow's has "runs" too)
        db.execute("CREATE TABLE runs (run_uuid TEXT, name TEXT)")
        db.execute("CREATE TABLE metrics (key TEXT, value REAL)")
    return path.read_bytes()


@pytest.mark.parametrize("command", [("runs",), ("show", "1"), ("export", "1", "--format", "json"),
                                     ("tag", "1", "x"), ("import", "{file}"),
                                     ("run", "--max-steps", "1")])
def test_another_programs_sqlite_file_is_refused_and_left_as_it_was(tmp_path, capsys, command):
    path = tmp_path / "mlflow.db"
    before = _foreign_sqlite(path)
    exported = tmp_path.parent / f"{tmp_path.name}-export.json"
    exported.write_text(json.dumps(transfer.export_runs(*_one_run(tmp_path.parent))))
    command = [part.format(file=exported) for part in command]
    code, _, err = _main(capsys, *command, "--store", str(path))
    assert code == 2
    assert one_line(err) == (f"error: the store {path}: it is not an anatomy store: it holds "
                             "another program's tables (runs, metrics)\n")
    assert path.read_bytes() == before  # no tables added, no journal mode changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def _one_run(folder: Path) -> tuple[Store, list[int]]:
    store = Store(folder / "one-run.sqlite")
    return store, [seed_run(store)]


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(os.urandom(4096)), "it is not an SQLite database"),
    (lambda p: p.write_bytes(b"SQLite format 3\0" + b"\xff" * 4000), "it is not an SQLite database"),
    (lambda p: p.mkdir(), "it is a directory, not a store file"),
])
def test_a_file_that_is_no_store_is_named_with_the_reason(tmp_path, capsys, make, reason):
    path = tmp_path / "store.sqlite"
    make(path)
    for command in (("runs",), ("show", "1"), ("run", "--max-steps", "1")):
        code, _, err = _main(capsys, *command, "--store", str(path))
        assert code == 2, err
        assert one_line(err).startswith(f"error: the store {path}: {reason}")


def test_a_damaged_store_is_named_with_the_reason(store, seed, capsys):
    seed()
    data = bytearray(store.path.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page after the schema's
    store.path.write_bytes(bytes(data))
    for command in (("runs",), ("show", "1")):
        code, _, err = _main(capsys, *command, "--store", str(store.path))
        assert code in (1, 2)
        assert one_line(err).startswith(f"error: the store {store.path}: the file is corrupt")


def test_read_only_commands_write_nothing_to_a_store(store, seed, capsys):
    run_id = seed()
    with sqlite3.connect(store.path) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # as another tool might have left it
    before = store.path.read_bytes()
    for command in (("runs",), ("show", str(run_id)), ("export", str(run_id), "--format", "json")):
        assert _main(capsys, *command, "--store", str(store.path))[0] == 0
    assert store.path.read_bytes() == before
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_empty_store_path_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "--store", ""])
    assert exited.value.code == 2
    assert "argument --store: an empty path names no store" in capsys.readouterr().err


@pytest.mark.parametrize("command, argument", [(["import", ""], "FILE"),
                                               (["export", "1", "--format", "json", "--output",
                                                 ""], "-o/--output")])
def test_an_empty_file_path_is_refused(capsys, command, argument):
    """`--output "$OUT"` with OUT unset wrote the whole export to the terminal; `import ""` said
    "cannot read : Is a directory"."""
    with pytest.raises(SystemExit) as exited:
        cli.main(command)
    assert exited.value.code == 2
    assert f"argument {argument}: an empty path names no file" in capsys.readouterr().err


def test_an_export_to_dash_is_standard_output_as_import_reads_dash(capsys, store, monkeypatch,
                                                                     tmp_path):
    """(before: "wrote -", a file named "-" in the working directory, where `import -` reads
    standard input)"""
    monkeypatch.chdir(tmp_path)
    seed = seed_run(store)
    assert cli.main(["export", str(seed), "--format", "json", "--output", "-",
                     "--store", str(store.path)]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["run"]["id"] == seed
    assert not (tmp_path / "-").exists()


def test_export_writes_where_o_says_as_output_does(capsys, store, monkeypatch, tmp_path):
    """`-o FILE`, the short form users type for an output file, was "unrecognized arguments"."""
    monkeypatch.chdir(tmp_path)
    seed = seed_run(store)
    assert cli.main(["export", str(seed), "--format", "json", "-o", "run.json",
                     "--store", str(store.path)]) == 0
    assert capsys.readouterr().out == "wrote run.json\n"
    assert json.loads((tmp_path / "run.json").read_text())["runs"][0]["run"]["id"] == seed


@pytest.mark.parametrize("word", ["9223372036854775808", "0", "٣", "1_0"])
@pytest.mark.parametrize("command", ["show", "tag", "rename", "delete", "export"])
def test_a_run_id_beyond_sqlites_range_is_refused_in_a_line(capsys, command, word):
    # "٣" was run 3 and "1_0" run 10 to int(); the pages read their URL's ids as ASCII digits.
    extra = {"tag": ["x"], "rename": ["x"], "export": ["--format", "json"]}.get(command, [])
    with pytest.raises(SystemExit) as exited:
        cli.main([command, word, *extra])
    assert exited.value.code == 2
    assert (f"{word!r} is not a run id: a whole number from 1 to 9223372036854775807"
            in capsys.readouterr().err)


def test_an_export_to_a_folder_that_does_not_exist_is_refused_before_any_work(store, seed,
                                                                              capsys, tmp_path):
    run_id = seed()
    missing = tmp_path / "missing"  # the test's own: "/nonexistent" may exist on a machine
    code, _, err = _main(capsys, "export", str(run_id), "--format", "html", "--output",
                         str(missing / "x.html"), "--store", str(store.path))
    assert code == 2
    assert one_line(err) == (f"error: cannot write {missing / 'x.html'}: its directory "
                             f"{missing} does not exist\n")
    assert not missing.exists()
    # Under a file: that file is no directory (it exists: "does not exist" was wrong).
    page = tmp_path / "page.html"
    page.write_text("kept")
    code, _, err = _main(capsys, "export", str(run_id), "--format", "json", "--output",
                         str(page / "x.json"), "--store", str(store.path))
    assert code == 2
    assert one_line(err) == f"error: cannot write {page / 'x.json'}: {page} is not a directory\n"
    assert page.read_text() == "kept"


@pytest.mark.parametrize("format", ["json", "csv", "html"])
def test_an_export_over_a_store_is_refused_and_the_store_kept(store, seed, capsys, tmp_path,
                                                              format):
    """`anatomy export 1 --format csv --output runs.sqlite --store runs.sqlite` (--output typed
    for --store) wrote the CSV over the store: every run lost. Over another store, the same."""
    run_id = seed()
    other = Store(tmp_path / "other.sqlite")
    seed_run(other)
    for target, reason in ((store.path, "it is the store the runs are read from"),
                           (other.path, "it is an SQLite database (a run store?): the export "
                                        "would write over it")):
        before = target.read_bytes()
        code, _, err = _main(capsys, "export", str(run_id), "--format", format, "--output",
                             str(target), "--store", str(store.path))
        assert code == 2 and one_line(err) == f"error: cannot write {target}: {reason}\n"
        assert target.read_bytes() == before
    assert _main(capsys, "runs", "--store", str(store.path))[0] == 0


def test_the_exit_statuses_are_in_every_commands_help(capsys):
    for command in ([], ["run"], ["import"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        text = capsys.readouterr().out
        assert "exit status:" in text and "130: Ctrl-C" in text and "141" in text


def test_the_dashboard_names_a_store_it_cannot_use_in_a_line(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.apptest import APP, TIMEOUT

    path = tmp_path / "mlflow.db"
    _foreign_sqlite(path)
    monkeypatch.setenv("ANATOMY_STORE", str(path))
    app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not app.exception
    assert [e.value for e in app.error] == [
        f"The run store cannot be used: {path}: it is not an anatomy store: it holds another"
        " program's tables (runs, metrics). Point ANATOMY_STORE at another file."]


def test_the_dashboard_names_a_store_whose_folder_does_not_exist(tmp_path, monkeypatch):
    """`streamlit run app.py` with $ANATOMY_STORE in a folder not there: said on the page, and
    no folder made."""
    from streamlit.testing.v1 import AppTest

    from tests.apptest import APP, TIMEOUT

    path = tmp_path / "missing" / "x.sqlite"
    monkeypatch.setenv("ANATOMY_STORE", str(path))
    app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not app.exception
    assert [e.value for e in app.error][0].startswith(
        f"The run store cannot be used: {path}: its directory {path.parent} does not exist.")
    assert not path.parent.exists()


@pytest.mark.parametrize("command", [["import", "-"], ["watch", "--", "true"],
                                     ["run", "--model", "tiny"]])
def test_a_store_that_cannot_be_made_says_so_not_that_it_is_gone(capsys, monkeypatch, command):
    """A new store in a folder no one may write (/sys: refused even to root): SQLite's "unable to
    open" of a file not there read as "it is gone: the file was deleted or moved while in use"."""
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    code, _, err = _main(capsys, *command[:1], "--store", "/sys/anatomy.sqlite", *command[1:])
    assert code == 2 and err.count("\n") == 1, err
    assert "/sys/anatomy.sqlite: it cannot be made: Permission denied" in err, err


@pytest.mark.parametrize("command", [["runs"], ["show", "1"], ["import", "-"], ["tag", "1", "x"],
                                     ["watch", "--", "true"], ["run", "--model", "tiny"],
                                     ["sweep", "--model", "tiny", "--vary", "batch_size=1,2"],
                                     ["dashboard"], ["$ANATOMY_STORE", "runs"]])
def test_a_store_whose_folder_does_not_exist_is_refused_and_no_folder_made(tmp_path, capsys,
                                                                           monkeypatch, command):
    """`--store /nonexistent/dir/x.sqlite` made /nonexistent/dir (and an empty store in it): a
    store's folder must exist, as `--output`'s does."""
    import anatomy.cli.dashboard

    monkeypatch.setattr("sys.stdin", open(os.devnull))
    monkeypatch.setattr(anatomy.cli.dashboard.os, "execve", _no_exec)  # the dashboard's server
    missing = tmp_path / "missing" / "dir"
    path = missing / "x.sqlite"
    if command[0] == "$ANATOMY_STORE":
        monkeypatch.setenv("ANATOMY_STORE", str(path))
        code, _, err = _main(capsys, *command[1:])
    else:
        code, _, err = _main(capsys, *command[:1], "--store", str(path), *command[1:])
    assert code == 2
    assert one_line(err) == f"error: the store {path}: its directory {missing} does not exist\n"
    assert not (tmp_path / "missing").exists()


def _no_exec(*args) -> None:
    raise AssertionError("the dashboard's server was started")


def test_the_default_stores_folder_is_made_for_it(tmp_path, monkeypatch):
    """The default location is anatomy's own: its folder is made, as ever."""
    monkeypatch.delenv("ANATOMY_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    store = Store()
    assert store.path == tmp_path / "data" / "anatomy" / "anatomy.sqlite" and store.path.exists()


def test_the_phase_api_refuses_a_store_whose_folder_does_not_exist_and_goes_on(tmp_path, capsys,
                                                                              monkeypatch):
    """`anatomy.start(store=…)` (and the Trainer callback, which starts through it) made the
    missing folders; now one line, and the training goes on unrecorded."""
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)  # not this pytest's
    path = tmp_path / "missing" / "x.sqlite"
    run = attach.start(store=path, kernel=False, baseline=False)
    _marks_go_nowhere(run)
    err = capsys.readouterr().err
    assert err == (f"anatomy: not recording: the store {path}: its directory {path.parent} does"
                   " not exist; the training goes on unrecorded\n")
    assert not path.parent.exists()


def test_the_phase_api_tells_a_store_it_cannot_use_and_the_training_goes_on(tmp_path, capsys,
                                                                           monkeypatch):
    """anatomy.start() (and so the Trainer callback) raised StoreError into the user's training:
    a stray $ANATOMY_STORE ended it. No sampler is started for a store refused."""
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)  # not this pytest's
    (tmp_path / "notes.txt").write_text("not a store")
    run = attach.start(store=tmp_path / "notes.txt", kernel=False, baseline=False)
    _marks_go_nowhere(run)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not recording: the store" in err and "notes.txt" in err
    assert attach.current() is None


def _marks_go_nowhere(run) -> None:
    """A run that records nothing takes the training's marks all the same, and ends."""
    try:
        assert run.id is None and not run.watched
        run.phase("training")
        run.step(loss=1.0)
    finally:
        run.end()


def test_the_phase_api_names_a_gpu_that_is_not_visible(tmp_path, monkeypatch):
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)
    with pytest.raises(ValueError, match=r"gpus: 3 is not a visible GPU \(none: no GPU here\)"):
        attach.start(store=tmp_path / "s.sqlite", gpus=[3], kernel=False, baseline=False)
    assert attach.current() is None


class _FullDisk:
    """Standard output redirected to a file on a full disk (as `> out.csv` there)."""

    def __init__(self, path: Path):
        self.file = open(path, "w")  # noqa: SIM115 - closed by the test

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.file.fileno()


@pytest.mark.parametrize("command", [["runs"], ["show", "1"], ["export", "1", "--format", "csv"]])
def test_output_that_cannot_be_written_is_one_line(store, seed, capsys, monkeypatch, tmp_path,
                                                   command):
    """`anatomy runs > out.txt` on a full disk was an OSError traceback."""
    seed()
    full = _FullDisk(tmp_path / "out.txt")
    monkeypatch.setattr("sys.stdout", full)
    try:
        code = cli.main([*command, "--store", str(store.path)])
    finally:
        full.file.close()
    err = capsys.readouterr().err
    assert code == 1 and err == "error: cannot write the output: No space left on device\n", err


@pytest.mark.parametrize("command", [["runs"], ["show", "1"], ["export", "1", "--format", "json"],
                                     ["--help"]], ids=" ".join)
def test_a_standard_output_closed_from_the_start_is_one_line(store, seed, capsys, monkeypatch,
                                                             command):
    """`anatomy runs >&-` (Python's sys.stdout is None) was an AttributeError traceback."""
    seed()
    monkeypatch.setattr("sys.stdout", None)
    code = cli.main([*command, "--store", str(store.path)])
    err = capsys.readouterr().err
    assert code == 1 and err == "error: cannot write the output: standard output is closed\n", err


def test_import_of_a_standard_input_closed_from_the_start_is_one_line(store, capsys,
                                                                      monkeypatch):
    """`anatomy import - <&-` was an AttributeError traceback."""
    monkeypatch.setattr("sys.stdin", None)
    code = cli.main(["import", "-", "--store", str(store.path)])
    err = capsys.readouterr().err
    assert code == 1 and err == "error: cannot read -: standard input is closed\n", err


@pytest.mark.parametrize("command", [
    ["rename", "1", "caf\udce9"], ["tag", "1", "caf\udce9"], ["runs", "--tag", "caf\udce9"],
    ["run", "--model", "m\udce9/config.json"], ["watch", "--name", "caf\udce9", "--", "true"],
    ["watch", "--", "python3", "s\udce9.py"]], ids=" ".join)
def test_an_argument_that_is_not_utf8_is_refused_in_a_line_before_anything(capsys, store,
                                                                           command):
    """Bytes of a Latin-1 terminal or file name ("caf\\xe9"), which Python keeps as lone
    surrogates. (before: UnicodeEncodeError tracebacks from SQLite for rename, runs --tag, run,
    watch --name; 'half of a UTF-16 pair' from watch's command)"""
    seed_run(store)
    assert cli.main([*command, "--store", str(store.path)] if command[0] != "watch" else
                    [command[0], "--store", str(store.path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not UTF-8 text" in err and "\\xe9" in err, err
    assert [r.id for r in store.runs()] == [1] and store.run(1).name is None


@pytest.mark.parametrize("environment", [
    {"ANATOMY_WATCH": "@anatomy-watch-nobody-listens", "ANATOMY_WATCH_KEY": "00"},
    {"ANATOMY_WATCH": "@anatomy-watch-nobody-listens"},
    {"ANATOMY_WATCH": "/nonexistent/anatomy.sock", "ANATOMY_WATCH_KEY": "zz",
     "ANATOMY_T0": "abc"}])
def test_a_watch_the_environment_names_but_is_gone_is_said_and_the_training_goes_on(
        environment, capsys, monkeypatch):
    """A script run with a watched shell's environment (the watch gone, or copied into another
    shell) raised ConnectionRefusedError, KeyError: 'ANATOMY_WATCH_KEY' or fromhex's ValueError
    from inside anatomy.start() (and so from AnatomyCallback()), ending the user's training."""
    from anatomy.engine import attach

    monkeypatch.setattr(attach, "_install_exit_hooks", lambda run: None)  # not this pytest's
    monkeypatch.delenv("ANATOMY_WATCH_KEY", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    run = attach.start(kernel=False, baseline=False)
    _marks_go_nowhere(run)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "not recording: $ANATOMY_WATCH names the socket of an `anatomy watch` that cannot be" \
           " reached" in err and "training goes on unrecorded" in err, err
    assert attach.current() is None


@pytest.mark.parametrize("given, environment, expected", [
    ("~/runs.sqlite", None, "HOME/runs.sqlite"),
    (None, "~/runs.sqlite", "HOME/runs.sqlite"),
    (None, "   ", "HOME/.local/share/anatomy/anatomy.sqlite"),
])
def test_a_store_named_with_a_tilde_is_in_the_home_folder_and_a_blank_one_is_unset(
        tmp_path, monkeypatch, given, environment, expected):
    """`anatomy.start(store="~/runs.sqlite")`, or ANATOMY_STORE="~/runs.sqlite" quoted in an
    environment file: the run went to a folder named "~" in the working directory while every
    line said "~/runs.sqlite"; ANATOMY_STORE=" " made a file named " " there."""
    from anatomy.store import Store

    (tmp_path / "home").mkdir()  # a home folder is there: only the default's folders are made
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    if environment is None:
        monkeypatch.delenv("ANATOMY_STORE", raising=False)
    else:
        monkeypatch.setenv("ANATOMY_STORE", environment)
    store = Store(given)
    assert store.path == Path(expected.replace("HOME", str(tmp_path / "home")))
    assert store.path.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_names_an_output_cannot_encode_are_written_as_escapes(store, capsys, monkeypatch):
    """`PYTHONIOENCODING=ascii anatomy runs` (or a Latin-1 terminal) over a run named "café×"
    was a UnicodeEncodeError traceback."""
    seed_run(store)
    assert cli.main(["rename", "1", "café×", "--store", str(store.path)]) == 0
    for command in (["runs"], ["show", "1"]):
        written = io.BytesIO()
        terminal = io.TextIOWrapper(written, encoding="ascii")
        monkeypatch.setattr("sys.stdout", terminal)
        assert cli.main([*command, "--store", str(store.path)]) == 0
        terminal.flush()
        assert "caf\\xe9\\xd7" in written.getvalue().decode("ascii"), command
