"""Rows a store holds that this anatomy did not write as it would: a newer anatomy's option, a
JSON column damaged or edited by hand. Every reader (the CLI, the pages) still shows every run."""

from __future__ import annotations

import json
import sqlite3

from anatomy import cli
from tests.apptest import open_page


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _set_column(store, run_id: int, column: str, text: str) -> None:
    with sqlite3.connect(store.path) as db:
        db.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (text, run_id))


def test_a_run_with_an_option_a_newer_anatomy_added_is_shown_with_it(store, seed, capsys):
    run_id = seed()
    options = {**store.run(run_id).options, "future_option": 3}
    _set_column(store, run_id, "options", json.dumps(options))
    code, out, err = _main(capsys, "show", str(run_id), "--store", str(store.path))
    assert (code, err) == (0, "")
    assert "future_option=3" in out
    assert _main(capsys, "export", str(run_id), "--format", "json", "--store",
                 str(store.path))[0] == 0


def test_a_run_whose_json_columns_are_not_objects_leaves_the_others_readable(store, seed,
                                                                            capsys):
    good, damaged, other = seed(), seed(), seed()
    for column, text in (("options", "not json"), ("source", "[1, 2]"), ("origin", '"x"'),
                         ("summary", "null"), ("recorder", "{")):
        _set_column(store, damaged, column, text)
    code, out, err = _main(capsys, "runs", "--store", str(store.path))
    assert (code, err) == (0, "")
    assert [int(line.split()[0]) for line in out.splitlines()[1:]] == [other, damaged, good]
    for command in (("show", str(damaged)), ("export", str(damaged), "--format", "csv")):
        assert _main(capsys, *command, "--store", str(store.path))[0] == 0
    app = open_page("screens/runs.py")
    assert list(app.dataframe[0].value["Run"]) == [other, damaged, good]


def test_a_sweep_whose_plan_is_not_json_leaves_the_runs_readable(store, seed, capsys):
    run_id = seed()
    with sqlite3.connect(store.path) as db:
        db.execute("INSERT INTO sweeps (key, created_at, base, vary, planned, status)"
                   " VALUES ('k', 0, 'x', '[1]', 1, 'completed')")
        db.execute("UPDATE runs SET sweep = 'k' WHERE id = ?", (run_id,))
    code, out, err = _main(capsys, "runs", "--store", str(store.path))
    assert (code, err) == (0, "")
    open_page("screens/compare.py", runs=str(run_id))


def _damage_table(store, table: str) -> None:
    """The table's first page overwritten, the rest of the file as it was."""
    with sqlite3.connect(store.path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                             (table,)).fetchone()
    with open(store.path, "r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(bytes(range(256)) * (page_size // 256))


def test_a_page_reading_a_damaged_table_says_so_in_a_line(store, seed):
    run_id, other = seed(), seed()
    _damage_table(store, "samples")
    for page, query in (("screens/runs.py", {}), ("screens/anatomy.py", {"run": str(run_id)}),
                        ("screens/compare.py", {"runs": f"{run_id},{other}"})):
        app = open_page(page, **query)
        assert [e.value for e in app.error] == [
            f"The run store cannot be used: {store.path}: the file is corrupt (database disk"
            " image is malformed). Point ANATOMY_STORE at another file."]


def test_a_measuring_backend_this_anatomy_does_not_know_is_not_called_nvml(store, seed,
                                                                           capsys):
    """A newer anatomy's backend ("tpu-hbm", "v9") was shown as "NVML v1 'used'"."""
    run_id = seed()
    _set_column(store, run_id, "backend", "tpu-hbm")
    _set_column(store, run_id, "memory_api", "v9")
    code, out, err = _main(capsys, "show", str(run_id), "--store", str(store.path))
    assert (code, err) == (0, "")
    assert ("measuring: tpu-hbm (v9), which this anatomy does not know (a newer one's?)"
            in out.splitlines())
