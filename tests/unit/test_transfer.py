"""Moving runs: export → import keeps everything; a wrong file is refused whole, with its reason.
(The CLI's export and import as a subprocess: tests/e2e/test_cli_transfer.py.)"""

from __future__ import annotations

import json
import socket

import pytest

from anatomy.analysis import transfer
from anatomy.analysis.report import RunReport, report, run_rows
from anatomy.cli import main
from anatomy.store import DatabaseError, PhaseMark, Step, Store
from anatomy.views import compare as compare_view
from anatomy.views import runs as runs_view
from anatomy.views import text
from tests.apptest import open_page
from tests.conftest import USERS_SHAPES, contents, exported, seed_run, seed_users_run

MARK = 987654321012  # a number found once in a file, replaced by text json.dumps cannot write


def without_id(rep: RunReport) -> dict:
    return {k: v for k, v in rep.to_dict().items() if k != "id"}


def test_round_trip_keeps_every_sample_phase_step_and_number(source, target):
    store, ids = source
    new_ids = transfer.import_runs(target, exported(store, ids).encode())
    assert new_ids == [i + 1 for i in ids]  # new ids, after the target's own run
    for old, new in zip(ids, new_ids):
        assert target.samples(new) == store.samples(old)
        assert target.steps(new) == store.steps(old)
        assert target.messages(new) == store.messages(old)
    done, oom, running = zip(ids, new_ids)
    for old, new in (done, oom):
        assert target.phases(new) == store.phases(old)
        # the same chart and numbers: phases' memory, peak, summary, options, tags, sweep, name
        assert without_id(report(target, new)) == without_id(report(store, old))
    assert report(target, done[1]).phases[0].memory_mb == 1024
    assert target.run(done[1]).tags == ("h200", "baseline")


def test_a_run_exported_while_running_is_imported_as_stopped(source, target):
    store, ids = source
    (new,) = transfer.import_runs(target, exported(store, ids[2:]))
    rep, was = report(target, new), report(store, ids[2])
    assert rep.status == "stopped" and "still running on its machine" in rep.error
    last_sample = max(s.t for s in store.samples(ids[2]))
    assert rep.phases[-1].end_s == last_sample  # the open phase ends where recording did
    assert rep.summary.peak_mb == was.summary.peak_mb
    assert target.run(new).worker_pid is None  # another machine's pid means nothing here



def _edit(change):
    """A bad file: the exported dict changed by `change`, then written as JSON text."""
    def make(text: str) -> str:
        data = json.loads(text)
        change(data)
        return json.dumps(data).replace(str(MARK), "1e400")
    return make


def _set(path: tuple, value):
    def change(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return _edit(change)


BAD_FILES = {
    "empty": (lambda text: "", "the file is empty"),
    "blank": (lambda text: "\n  \n", "the file is empty"),
    "truncated": (lambda text: text[: len(text) // 2], "the file is truncated: its JSON stops early"),
    # export's other formats, imported by mistake: the page was called a truncated JSON file
    "the HTML export": (lambda text: '<!DOCTYPE html>\n<html><head><script>var a = {"x": [1,',
                        "it is an HTML page (the export for viewing, --format html); import reads"
                        " the JSON export (anatomy export RUN_ID --format json)"),
    "the CSV export": (lambda text: "run_id,t,gpu,used,reserved,total,util\n1,0.1,0,7581696,,1,\n",
                       "it is the samples as CSV (--format csv); import reads the JSON export"),
    # a store given for its export: "the file is not UTF-8 text (byte 31)"
    "a store": (lambda text: "SQLite format 3\x00\x10\x00\x02\x02" + text,
                "it is an SQLite database (a store of runs? export them with --store FILE); import"
                " reads the JSON export (anatomy export RUN_ID --format json)"),
    "not json": (lambda text: "schema: anatomy.runs\n", "the file is not valid JSON: Expecting value"
                 " at line 1, column 1"),
    "foreign object": (lambda text: '{"name": "left-pad", "version": "1.3.0"}',
                       "not an anatomy export: there is no \"schema\" (its keys: 'name', 'version')"),
    "foreign array": (lambda text: "[1, 2, 3]", "not an anatomy export: the file holds a JSON list"),
    "other schema": (_set(("schema",), "chrome.trace"), "schema: 'chrome.trace' is not an anatomy"
                     " export (expected 'anatomy.runs')"),
    "newer version": (_set(("version",), 2), "version: the file is schema version 2; this anatomy"
                      " reads version 1 (a newer anatomy wrote it: upgrade this one)"),
    "no version": (_edit(lambda d: d.pop("version")), "version: the file is schema version None"),
    "no runs": (_set(("runs",), []), "runs: the file holds no run"),
    "huge memory": (_set(("runs", 0, "samples", 12, 2), MARK), "runs[0].samples[12][2]: memory"
                    " must be a whole number of bytes from 0 to 2**50, got 1e400"),
    "memory beyond 2**50": (_set(("runs", 0, "samples", 3, 4), 2**50 + 1), "runs[0].samples[3][4]:"
                            " memory must be a whole number of bytes from 0 to 2**50, got 1125899906842625"),
    "negative memory": (_set(("runs", 1, "steps", 0, "allocated"), -1), "runs[1].steps[0].allocated:"
                        " memory must be a whole number of bytes from 0 to 2**50, got -1"),
    "integer beyond int64": (_set(("runs", 0, "steps", 2, "step"), 2**64), "runs[0].steps[2].step:"
                             " must be a whole number from 0 to 9223372036854775807,"
                             " got 18446744073709551616"),
    "huge time": (_set(("runs", 0, "phases", 1, "end_s"), MARK), "runs[0].phases[1].end_s: time must"
                  " be a finite number of seconds from 0 to 1,000,000,000, got 1e400"),
    "NaN time": (_set(("runs", 0, "samples", 3, 0), float("nan")), "runs[0].samples[3][0]: time must"
                 " be a finite number of seconds from 0 to 1,000,000,000, got NaN"),
    # A whole number beyond every float: is_number's isfinite() raised OverflowError.
    "a whole-number loss beyond every float": (
        _set(("runs", 0, "steps", 1, "loss"), 10**400),
        "runs[0].steps[1].loss: must be a finite number, got an integer of 401 digits"),
    "a whole-number time beyond every float": (
        _set(("runs", 0, "samples", 3, 0), 10**400),
        "runs[0].samples[3][0]: time must be a finite number of seconds"),
    "NaN loss": (_set(("runs", 0, "steps", 1, "loss"), float("nan")), "runs[0].steps[1].loss: must be"
                 " a finite number, got NaN"),
    "infinite summary": (_set(("runs", 0, "run", "summary", "time_s"), float("inf")),
                         "runs[0].run.summary.time_s: must be a finite number from 0, got Infinity"),
    "text for a number": (_set(("runs", 0, "run", "options", "batch_size"), "4"),
                          "runs[0].run.options: batch_size: must be a whole number from 1 to 4096,"
                          " got '4'"),
    "sample not a row": (_set(("runs", 0, "samples", 0), {"t": 0}), "runs[0].samples[0]: a sample is"
                         " [t, gpu, used, reserved, total, util], got {'t': 0}"),
    "samples not a list": (_set(("runs", 0, "samples"), "many"), "runs[0].samples: must be a JSON"
                           " array, got str 'many'"),
    "unknown phase": (_set(("runs", 0, "phases", 2, "name"), "warmup"), "runs[0].phases[2].name:"
                      " 'warmup' is not one of baseline, kernel, weights, training"),
    "unknown status": (_set(("runs", 1, "run", "status"), "exploded"), "runs[1].run.status:"
                       " 'exploded' is not one of running, completed, failed, oom, stopped"),
    "missing options": (_edit(lambda d: d["runs"][0]["run"]["options"].pop("seq_len")),
                        "runs[0].run.options: is missing 'seq_len'"),
    "a comma in a tag": (_set(("runs", 0, "run", "tags"), ["a,b"]), "runs[0].run.tags[0]: a tag is"
                         " text without commas, got 'a,b'"),
    "the second run bad": (_set(("runs", 1, "samples", 5, 1), -3), "runs[1].samples[5][1]: must be a"
                           " device's number: its index from 0 to 63, on the k-th host of a run"
                           " k × 1000 + its index, got -3"),
    # What `show` and the Anatomy page read, checked by type (issue 9: they raised afterwards).
    "text for a component": (_set(("runs", 0, "run", "summary", "components"), {"weights": "x"}),
                             "runs[0].run.summary.components.weights: memory must be a whole"
                             " number of bytes from 0 to 2**50, got 'x'"),
    "a component's moments": (_set(("runs", 0, "run", "summary", "components"),
                                   {"moments": {"after forward": -5}}),
                              "runs[0].run.summary.components.moments.after forward: memory must"
                              " be a whole number of bytes"),
    "operations without a profile": (_set(("runs", 0, "run", "summary", "operations"),
                                          {"steps": "x"}),
                                     "runs[0].run.summary.operations: is missing 'device',"
                                     " 'time_source', 'classes', 'operators', 'optimizer'"),
    "text for profiled steps": (_set(("runs", 0, "run", "summary", "operations"),
                                     {"device": "cpu", "time_source": "CPU self time",
                                      "steps": "x", "classes": {}, "operators": [],
                                      "optimizer": {"time_us": 0, "flops": 0, "count": 0}}),
                                "runs[0].run.summary.operations.steps: must be a whole number from"
                                " 0 to 9223372036854775807, got 'x'"),
    "a class's totals": (_set(("runs", 0, "run", "summary", "operations"),
                              {"device": "cpu", "time_source": "CPU self time", "steps": 1,
                               "classes": {"element-wise": {"time_us": 1.5, "flops": 2}},
                               "operators": [], "optimizer": {"time_us": 0, "flops": 0,
                                                              "count": 0}}),
                         "runs[0].run.summary.operations.classes.element-wise: is missing"
                         " 'count'"),
    "text for steps in the summary": (_set(("runs", 0, "run", "summary", "steps"), "8"),
                                      "runs[0].run.summary.steps: must be a whole number"),
    "text for the GPU's memory": (_set(("runs", 0, "run", "environment", "gpu_total"), "141 GB"),
                                  "runs[0].run.environment.gpu_total: memory must be a whole"
                                  " number of bytes"),
    "a number for the GPU's name": (_set(("runs", 0, "run", "environment", "gpu_name"), 7),
                                    "runs[0].run.environment.gpu_name: must be text, got 7"),
    "a lone surrogate in a name": (_set(("runs", 0, "run", "name"), "\ud800"),
                                   "runs[0].run.name: holds '\\ud800', half of a UTF-16 pair,"
                                   " which is not text that can be stored"),
    "a lone surrogate in a tag": (_set(("runs", 0, "run", "tags"), ["ok", "x\udfff"]),
                                  "runs[0].run.tags[1]: holds '\\udfff'"),
    "a lone surrogate in a key": (_set(("runs", 0, "run", "environment", "\ud83d"), 1),
                                  "runs[0].run.environment (a key): holds '\\ud83d'"),
    "a lone surrogate in a message": (_set(("runs", 0, "messages", 0, "text"), "a\ud800b"),
                                      "runs[0].messages[0].text: holds '\\ud800'"),
    "an origin's run id": (_set(("runs", 0, "run", "origin"), {"run": "7"}),
                           "runs[0].run.origin.run: must be a whole number"),
    # "²" is a digit to str.isdigit() and no number to int(): validate raised ValueError.
    "a superscript GPU": (_set(("runs", 0, "run", "options", "gpus"), "0,²"),
                          "runs[0].run.options: gpus: '²' is not a GPU index"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_refused_with_what_and_where_and_changes_nothing(case, source, target):
    store, ids = source
    make, message = BAD_FILES[case]
    before = contents(target)
    with pytest.raises(transfer.ImportRefused) as refused:
        transfer.import_runs(target, make(exported(store, ids)).encode())
    assert message in str(refused.value)
    assert contents(target) == before


def test_a_store_given_for_an_export_is_refused_saying_how_to_export_its_runs(tmp_path):
    from anatomy.store import Store

    store = Store(tmp_path / "runs.sqlite")  # an SQLite file, whichever store the suite runs on
    store.create_run({"model": "tiny"}, "cpu-rss", "rss", 0, {})
    with open(store.path, "rb") as file, pytest.raises(transfer.ImportRefused) as refused:
        transfer.read_file(file)
    assert str(refused.value).startswith("it is an SQLite database (a store of runs? export them"
                                         " with --store FILE)")


@pytest.mark.parametrize("world_size", ["two", [2], {"a": 1}], ids=["text", "list", "object"])
def test_a_world_size_that_is_no_number_is_refused_in_one_line_and_the_store_stays_readable(
        world_size, source, store, tmp_path, capsys):
    """The import builds the run's facts as their types: a value of the wrong type is refused at
    the door, so `runs`, `show`, `export` and the Runs page never meet it."""
    origin, ids = source
    data = transfer.export_runs(origin, ids[:1])
    data["runs"][0]["run"]["environment"]["world_size"] = world_size
    path = tmp_path / "two.json"
    path.write_text(json.dumps(data))
    assert main(["import", str(path), "--store", str(store.path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {path} is refused, nothing was imported: runs[0].run.environment"
                   f".world_size: must be a whole number from 1 to 65536, got {world_size!r}\n")
    kept = seed_run(store)
    for command in (["runs"], ["runs", "--json"], ["show", str(kept)], ["show", str(kept), "--json"],
                    ["export", str(kept), "--format", "json"]):
        assert main([*command, "--store", str(store.path)]) == 0, command
    capsys.readouterr()
    page = open_page("screens/runs.py")
    assert list(page.dataframe[0].value["Run"]) == [kept]


def test_a_parsed_dict_with_nan_is_refused_too(source, target):
    store, ids = source
    data = transfer.export_runs(store, ids[:1])
    data["runs"][0]["samples"][7][2] = float("nan")
    with pytest.raises(transfer.ImportRefused, match=r"runs\[0\]\.samples\[7\]\[2\]: memory .* got nan"):
        transfer.import_runs(target, data)


def test_a_failure_while_writing_leaves_nothing_half_imported(source, target):
    store, ids = source
    before = contents(target)
    second_id = max(r.id for r in target.runs()) + 2
    with target.connect() as db:  # the disk fills up while the second run's samples go in
        db.execute(f"CREATE TRIGGER fail BEFORE INSERT ON samples WHEN NEW.run_id = {second_id}"
                   " BEGIN SELECT RAISE(ABORT, 'disk full (injected)'); END")
    with pytest.raises(DatabaseError, match="injected"):
        transfer.import_runs(target, exported(store, ids))
    assert contents(target) == before


def test_export_html_is_a_standalone_page_of_each_runs_chart(source, tmp_path):
    store, ids = source
    path = tmp_path / "runs.html"
    assert main(["export", str(ids[0]), str(ids[1]), "--format", "html", "--output", str(path),
                 "--store", str(store.path)]) == 0
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("plotly.js v") == 1  # the library once, inside: it opens offline
    assert page.count('class="plotly-graph-div"') == 2
    assert f"Run {ids[0]}: walkthrough" in page and f"Run {ids[1]}: bert-large" in page


def test_the_html_export_of_a_run_without_a_sample_says_so_in_its_title(store, tmp_path):
    """A run that ended before its first sample was titled "…, failed, peak None MB"."""
    run_id = store.create_run({}, "cpu-rss", "rss", 0, {}, preset="train.py")
    store.finish(run_id, "failed", "the command exited with code 2")
    path = tmp_path / "run.html"
    assert main(["export", str(run_id), "--format", "html", "--output", str(path),
                 "--store", str(store.path)]) == 0
    page = path.read_text()
    assert "peak None" not in page
    assert "failed: no memory sample" in page


def test_a_file_cut_anywhere_is_called_truncated(store, tmp_path):
    """Every cut of a real export, whatever token it lands in (a number, a key, a string)."""
    text = json.dumps({"schema": "anatomy.runs", "version": 1,
                       "runs": [{"run": {"name": 'a "b" [c] {d} \\', "t": 0.5, "x": [1.25, -3e-7, None]}}]})
    for cut in range(1, len(text) - 1):
        with pytest.raises(transfer.ImportRefused, match="the file is truncated"):
            transfer.import_runs(store, text[:cut])


# --- a run imported twice (issue 13, item 9) ---

def test_a_run_records_where_it_came_from_and_a_second_import_is_refused(source, target):
    store, ids = source
    text = exported(store, ids[:2])
    first = transfer.import_runs(target, text)
    origin = target.run(first[0]).origin
    assert origin.to_dict() == {"store": store.identity(), "host": socket.gethostname(),
                                "path": str(store.path), "run": ids[0],
                                "created_at": store.run(ids[0]).created_at}
    before = contents(target)
    with pytest.raises(transfer.AlreadyImported) as refused:
        transfer.import_runs(target, text)
    assert str(refused.value) == (
        f"runs[0] (run {ids[0]} of {store.path} on {socket.gethostname()}) is already imported as"
        f" run {first[0]}; runs[1] (run {ids[1]} of {store.path} on {socket.gethostname()}) is"
        f" already imported as run {first[1]}")
    assert contents(target) == before
    copies = transfer.import_runs(target, text, copy=True)  # asked for: copies, origin and all
    assert copies == [first[1] + 1, first[1] + 2]
    assert [target.run(i).origin for i in copies] == [target.run(i).origin for i in first]


def test_a_run_keeps_its_first_origin_through_another_store(source, target, tmp_path):
    store, ids = source
    (moved,) = transfer.import_runs(target, exported(store, ids[:1]))
    third = Store(tmp_path / "third.sqlite")
    transfer.import_runs(third, exported(target, [moved]))  # re-exported from where it landed
    assert third.run(1).origin.store == store.identity()
    with pytest.raises(transfer.AlreadyImported, match=f"is already imported as run {moved}"):
        transfer.import_runs(target, exported(third, [1]))  # the same run, by another road


def test_a_run_brought_back_to_its_own_store_is_refused(source):
    store, ids = source
    with pytest.raises(transfer.AlreadyImported, match=f"is run {ids[0]} of this store already"):
        transfer.import_runs(store, exported(store, ids[:1]))


def test_a_file_written_before_exports_named_their_store_is_known_again_too(source, target):
    store, ids = source
    data = json.loads(exported(store, ids[:1]))
    del data["origin"]  # as anatomy wrote exports before
    transfer.import_runs(target, json.dumps(data))
    with pytest.raises(transfer.AlreadyImported):
        transfer.import_runs(target, json.dumps(data))




@pytest.mark.parametrize("shape", USERS_SHAPES)
def test_a_users_run_round_trips_with_only_what_it_reported(store, target, shape):
    """Every run a user's training recorded (the callback, the phase API, watch) was refused by
    the import of its own export: "options: is missing 'batch_size', 'seq_len', …" — anatomy's
    own options demanded of a training that reported none or some."""
    run_id = seed_users_run(store, shape)
    (new,) = transfer.import_runs(target, exported(store, [run_id]))
    assert target.run(new).options == store.run(run_id).options  # no default filled in
    assert target.run(new).preset == store.run(run_id).preset
    assert without_id(report(target, new)) == without_id(report(store, run_id))


def test_a_users_options_are_imported_as_the_trainer_reported_them(store, target):
    """TrainingArguments' own values, which anatomy's runs never take: epochs 3.0, an optim it
    does not run, a batch size past its own limit."""
    run_id = seed_users_run(store, "trainer")
    reported = {**store.run(run_id).options, "epochs": 3.0, "optim": "adamw_bnb_8bit",
                "batch_size": 8192}
    with store.connect() as db:
        db.execute("UPDATE runs SET options = ? WHERE id = ?", (json.dumps(reported), run_id))
    (new,) = transfer.import_runs(target, exported(store, [run_id]))
    assert report(target, new).ran_with.optim == "adamw_bnb_8bit"
    assert report(target, new).ran_with.epochs == 3.0
    # their types are checked all the same: a reader sums and words them
    text = exported(store, [run_id]).replace('"grad_accum": 1', '"grad_accum": "1"')
    with pytest.raises(transfer.ImportRefused, match=r"runs\[0\]\.run\.options\.grad_accum: "
                       "must be a whole number"):
        transfer.import_runs(target, text)


def test_what_a_store_holds_but_json_cannot_say_is_exported_so_its_import_takes_it(store, target):
    """A diverged training's loss (inf: SQLite keeps it, the import refused "Infinity"), and the
    "process" phase of a watched command that ended before it was first seen (`watch -- true`:
    closed at 0.0, before its start)."""
    run_id = seed_users_run(store, "phase api")
    store.write(run_id, steps=[Step(9.5, 9, 10, float("inf"), None, None)])
    command = seed_users_run(store, "command", status="running")
    with store.connect() as db:  # as close_phases wrote it before it kept a phase's end ≥ start
        db.execute('UPDATE phases SET start = 0.2, "end" = 0.0 WHERE run_id = ?', (command,))
    new = transfer.import_runs(target, exported(store, [run_id, command]))
    assert target.steps(new[0])[-1].loss is None
    assert [(p.start_s, p.end_s) for p in target.phases(new[1])] == [(0.2, 0.2)]


def test_a_phase_a_users_script_named_is_imported_as_named(store, target):
    """`run.phase("eval")` is stored and shown as named; its export was refused by every import
    ("'eval' is not one of baseline, kernel, …"). Anatomy's own runs keep their four."""
    run_id = seed_users_run(store, "phase api")
    store.write(run_id, phases=[PhaseMark("start", "eval", 9.2), PhaseMark("end", "eval", 9.4)])
    (new,) = transfer.import_runs(target, exported(store, [run_id]))
    assert [p.name for p in target.phases(new)][-1] == "eval"
    text = exported(store, [run_id]).replace('"name": "eval"', '"name": ""')
    with pytest.raises(transfer.ImportRefused, match=r"phases\[4\]\.name: a phase is named"):
        transfer.import_runs(target, text, copy=True)


def test_a_phase_closed_before_it_began_ends_where_it_began(store):
    run_id = seed_users_run(store, "command", status="running")
    with store.connect() as db:
        db.execute("UPDATE phases SET start = 0.2 WHERE run_id = ?", (run_id,))
    store.close_phases(run_id, 0.0)  # the command was never seen alive: its last sight is 0.0
    assert [(p.start_s, p.end_s) for p in store.phases(run_id)] == [(0.2, 0.2)]


class _Endless:
    """/dev/zero or a weights file of gigabytes, as `import -` reads standard input: any read
    of the whole is a failure here (there it filled memory until the kernel killed anatomy)."""

    def __init__(self, byte: bytes):
        self.byte, self.given = byte, 0

    def read(self, size: int = -1) -> bytes:
        assert 0 <= size <= 1 << 20, "the whole stream was read"
        self.given += size
        return self.byte * size


@pytest.mark.parametrize("byte, words", [
    (b"\0", "the file is not valid JSON: Expecting value at line 1, column 1"),
    (b"\x88", "the file is not UTF-8 text (byte 0): not an anatomy export")])
def test_a_file_that_cannot_begin_an_export_is_refused_at_its_start(byte, words, capsys,
                                                                   monkeypatch, store):
    """(before: `anatomy import /dev/zero` was killed, exit 137, after filling memory)"""
    stdin = type("Stdin", (), {"buffer": _Endless(byte)})()
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["import", "-", "--store", str(store.path)]) == 2
    assert words in capsys.readouterr().err
    assert stdin.buffer.given <= transfer.HEAD_BYTES and store.runs() == []


def _deleted_by_another_process_after(monkeypatch, store: Store, read: str, run_id: int) -> None:
    """The run deleted, as another process's `anatomy delete` would, as soon as the store's
    `read` has read its rows: between two reads of one export."""
    other, real = Store(store.path), getattr(Store, read)

    def read_then_delete(self, *args, **kwargs):
        rows = real(self, *args, **kwargs)
        if self is store and other.run(run_id) is not None:
            other.delete_run(run_id)
        return rows
    monkeypatch.setattr(Store, read, read_then_delete)


@pytest.mark.parametrize("read", ["run", "samples"])
def test_a_run_deleted_while_it_is_exported_is_exported_whole(store, seed, monkeypatch, read):
    """`anatomy export 1 --format json` while `anatomy delete 1 --yes` ran wrote the run with
    its 571,425 samples and 0 of its steps (each read its own transaction), and exit status 0."""
    run_id = seed()
    whole = transfer.export_runs(store, [run_id])["runs"][0]
    assert len(whole["steps"]) == 8
    _deleted_by_another_process_after(monkeypatch, store, read, run_id)
    exported = transfer.export_runs(store, [run_id])["runs"][0]
    assert store.run(run_id) is None
    assert {k: len(exported[k]) for k in ("samples", "steps", "phases")} == {
        k: len(whole[k]) for k in ("samples", "steps", "phases")}


def test_a_run_deleted_while_its_samples_are_exported_as_csv_is_exported_whole(store, seed,
                                                                               monkeypatch):
    run_id = seed()
    whole = transfer.samples_csv(store, [run_id])
    _deleted_by_another_process_after(monkeypatch, store, "run", run_id)
    assert transfer.samples_csv(store, [run_id]) == whole
    assert store.run(run_id) is None


@pytest.mark.parametrize("format", ["json", "csv"])
def test_a_run_named_twice_is_exported_once(source, tmp_path, capsys, format):
    """`anatomy export 1 1 --format json` wrote a file that `anatomy import` refused ("runs[1]:
    the same run as runs[0]"); the CSV held every sample twice."""
    store, run_ids = source
    once, twice = tmp_path / f"once.{format}", tmp_path / f"twice.{format}"
    for path, ids in ((once, [run_ids[0]]), (twice, [run_ids[0], run_ids[0]])):
        assert main(["export", *map(str, ids), "--format", format, "--output", str(path),
                     "--store", str(store.path)]) == 0
    assert twice.read_text() == once.read_text()


def test_a_run_deleted_while_show_reads_it_is_shown_whole(store, seed, monkeypatch, capsys):
    """`anatomy show 1` while `anatomy delete 1 --yes` ran printed the run with no phases,
    "samples: 0   steps: 0", and exit status 0."""
    run_id = seed()
    assert main(["show", str(run_id), "--store", str(store.path)]) == 0
    whole = capsys.readouterr().out
    _deleted_by_another_process_after(monkeypatch, store, "run", run_id)
    monkeypatch.setattr("anatomy.cli.show.reading", lambda path: store)  # the store deleted from
    assert main(["show", str(run_id), "--store", str(store.path)]) == 0
    assert capsys.readouterr().out == whole
    assert store.run(run_id) is None


def test_a_whole_number_loss_beyond_int64_is_imported_as_a_float(source, target):
    """A step's loss of 2**63 in the file: SQLite's OverflowError ("Python int too large to
    convert to SQLite INTEGER") went up as a traceback."""
    store, ids = source
    data = json.loads(exported(store, ids))
    data["runs"][0]["steps"][0]["loss"] = 2**63
    run_id = transfer.import_runs(target, json.dumps(data).encode())[0]
    assert target.steps(run_id)[0].loss == float(2**63)


def test_an_imported_copy_is_marked_imported_in_the_list_show_and_compare(source, capsys):
    """A run imported back beside the one it copies (`import --copy`): the same name, the same
    "started by", the same figures — and nothing told them apart."""
    store, ids = source
    done = ids[0]
    (copy,) = transfer.import_runs(store, exported(store, [done]), copy=True)
    rows = {row["Run"]: row for row in runs_view.table(run_rows(store))}
    assert rows[done]["Started by"] == "anatomy"
    assert rows[copy]["Started by"] == "anatomy (imported)"
    labels = compare_view.run_labels([report(store, done), report(store, copy)])
    assert labels == {done: f"Run {done} · walkthrough", copy: f"Run {copy} (imported) · walkthrough"}
    assert report(store, copy).title().startswith(f"Run {copy} (imported): walkthrough")
    assert text.run_choice(store.run(copy)).startswith(f"{copy} (imported) · NVIDIA H200")
    assert text.run_choice(store.run(done)).startswith(f"{done} · NVIDIA H200")  # the pickers
    assert main(["show", str(copy), "--store", str(store.path)]) == 0
    shown = capsys.readouterr().out
    assert f"imported from: run {done} of {store.path} on {socket.gethostname()}" in shown
    assert main(["show", str(done), "--store", str(store.path)]) == 0
    assert "imported" not in capsys.readouterr().out
    assert main(["runs", "--store", str(store.path)]) == 0
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert [line.endswith(" walkthrough (imported)") for line in lines].count(True) == 1
    assert [line.endswith(" walkthrough") for line in lines].count(True) == 1
