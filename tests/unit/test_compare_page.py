"""The Compare page: runs side by side (alignment, differing options, differences to a reference),
sweeps and import, through AppTest on seeded stores; its logic and figures without Streamlit."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis import compare, transfer
from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.analysis.sweeps import SweepGrid, SweepRun, grid
from anatomy.store import PhaseMark, Sample, Store
from anatomy.units import MIB
from anatomy.views import compare as view
from anatomy.views import text
from anatomy.views.figures import compare as figures
from anatomy.vocabulary import Part, Phase
from tests.apptest import chart_spec, open_page
from tests.conftest import GIB_BYTES, USERS_MODEL, seed_run

GIB = GIB_BYTES


def _with_options(store, run_id: int, **changes) -> int:
    store.update_run(run_id, options={**store.run(run_id).options, **changes})
    return run_id


def _run_training_from(store, start: float, batch_size: int = 4) -> int:
    """A completed run whose training phase begins at `start` (seed_run's begins at 6.0)."""
    options = {**RunOptions(preset="bert-large-uncased", batch_size=batch_size).to_dict(),
               "max_steps": 8}
    run_id = store.create_run(options, "nvml", "v2", 0, {"gpu_name": "NVIDIA H200",
                                                        "gpu_total": 141 * GIB})
    ends = {"baseline": 1.0, "kernel": 2.0, "weights": start - 0.5, "training": start + 3.0}
    starts = {"baseline": 0.1, "kernel": 1.5, "weights": 2.5, "training": start}
    samples = [Sample(i / 10, 0, (3 if i / 10 < start else 5) * GIB, None, 141 * GIB, None)
               for i in range(int((start + 3.0) * 10) + 1)]
    marks = [m for name in ends
             for m in (PhaseMark("start", name, starts[name]), PhaseMark("end", name, ends[name]))]
    store.write(run_id, samples=samples, phases=marks)
    store.update_run(run_id, summary={"time_s": 3.0, "samples_per_second": 10.0})
    store.finish(run_id, "completed")
    return run_id


def _page(**query) -> AppTest:
    return open_page("screens/compare.py", **query)


# Dataframes carry no key in AppTest: the Compare runs tab's two tables come first, in this order.
TABLES = ("compare_table", "compare_differences")


def _table(app: AppTest, name: str):
    return app.dataframe[TABLES.index(name)].value


# --- the page ---

def test_side_by_side_writes_an_empty_option_as_a_dash_and_a_dataset_by_its_name(store, seed):
    """A LoRA run's default targets and a dataset's default split were blank cells, unlike every
    other missing value ("—"); a dataset's path was cut at 1,000 px, its folders alone shown:
    the table names it by its file name, the caption below it whole."""
    folder = "/home/me/projects/customer-support/data/2024/cleaned"
    first = _with_options(store, seed(), lora_rank=8, lora_targets="",
                          dataset=f"{folder}/reviews.jsonl", split="", text_column="")
    second = _with_options(store, seed(), lora_rank=8, lora_targets="",
                           dataset=f"{folder}/tickets.jsonl", split="", text_column="")
    app = _page(runs=f"{first},{second}")
    table = _table(app, "compare_table")
    for what in ("LoRA targets", "Split", "Text column"):
        assert table.loc[what].tolist()[1:] == ["—", "—"], what
    assert table.loc["Dataset"].tolist() == ["≠", "reviews.jsonl", "tickets.jsonl"]
    assert text.literal(f"Datasets: run {first}: {folder}/reviews.jsonl; run {second}: "
                        f"{folder}/tickets.jsonl.") in [c.value for c in app.caption]


def test_a_split_and_text_column_left_to_the_data_are_the_ones_it_read(store, seed):
    """A JSON-lines file's run left its split and text column to the data: Compare said "—" (or
    a blank) beside the "train" and "text" the run read and kept."""
    data = {"dataset": "/home/me/reviews.jsonl", "split": "train", "text_column": "text",
            "tokenizer": "/home/me/tok", "padding": "longest", "lengths": [[4, 2]]}
    runs = []
    for batch_size in (2, 4):
        run_id = _with_options(store, seed(), batch_size=batch_size, split="", text_column="",
                               dataset=data["dataset"], tokenizer=data["tokenizer"])
        store.merge_environment(run_id, {"data": data})
        runs.append(report(store, run_id))
    rows = {row["what"]: row for row in view.side_by_side(runs)}
    for what, read in (("Split", "train"), ("Text column", "text")):
        assert [rows[what][f"Run {r.id}"] for r in runs] == [read, read], what
        assert rows[what][""] == ""  # the same in both: no difference


def test_two_runs_differing_in_batch_size_side_by_side(store, seed):
    small = seed()
    large = _with_options(store, seed(), batch_size=8)
    store.write(large, samples=[Sample(8.5, 0, 6 * GIB, None, 141 * GIB, None)])  # a higher peak
    app = _page(runs=f"{small},{large}")
    assert app.multiselect(key="compare_runs").value == [small, large]

    table = _table(app, "compare_table")
    assert list(table.columns) == ["", f"Run {small}", f"Run {large}"]
    assert table.loc["Batch size"].tolist() == ["≠", "4", "8"]
    flagged = table.index[table[""] == "≠"].tolist()
    assert flagged == ["Batch size"]  # nothing else differs
    assert table.loc["peak (MiB)"].tolist() == ["", "4,096", "6,144"]
    assert any("Options that differ" in m.value and "Batch size" in m.value for m in app.markdown)

    differences = _table(app, "compare_differences")
    assert differences.loc["peak (MiB)"].tolist() == ["reference", "+2,048 MiB (+50.0%)"]
    assert differences.loc["training (MiB)"].tolist() == ["reference", "+0 MiB (+0.0%)"]

    assert [b.proto.label for b in app.get("download_button")] == [
        "This comparison (HTML)", "Each run's chart (HTML)", "Runs (JSON)", "Samples (CSV)"]

    app.selectbox(key="compare_reference").set_value(large).run()
    differences = _table(app, "compare_differences")
    assert differences.loc["peak (MiB)"].tolist() == ["-2,048 MiB (-33.3%)", "reference"]


def test_the_overlay_aligns_every_run_at_the_chosen_phase(store):
    early, late = _run_training_from(store, 4.0), _run_training_from(store, 7.0)
    app = _page(runs=f"{early},{late}")
    chart = chart_spec(app, "compare_overlay")
    curves = [t for t in chart["data"] if t.get("mode") == "lines"]
    assert [c["meta"] for c in curves] == [{"run": early, "shift": 4.0},
                                           {"run": late, "shift": 7.0}]
    for curve in curves:
        # Training begins where memory steps from 3 to 5 GiB: at x = 0 in both runs.
        xs, ys = _numbers(curve["x"]), _numbers(curve["y"])
        first_high = next(x for x, y in zip(xs, ys) if y == 5 * 1024)
        assert first_high == pytest.approx(0.0)
    assert chart["layout"]["xaxis"]["title"]["text"] == "seconds since the training phase began"

    app.selectbox(key="compare_phase").set_value("kernel").run()
    chart = chart_spec(app, "compare_overlay")
    assert [t["meta"]["shift"] for t in chart["data"] if t.get("mode") == "lines"] == [1.5, 1.5]


def test_small_multiples_share_one_y_axis_and_bars_stack_each_run(store, seed):
    first, second = seed(), seed()
    app = _page(runs=f"{first},{second}")
    multiples = chart_spec(app, "compare_multiples")
    layout = multiples["layout"]
    assert layout["yaxis2"]["matches"] == "y"  # one scale for all panels
    assert layout["xaxis2"]["matches"] == "x"  # and one time range
    # Nothing differs between the two: each is its id alone.
    assert [a["text"] for a in layout["annotations"]][:2] == [f"Run {first}", f"Run {second}"]

    bars = chart_spec(app, "compare_bars")
    stacked = {t["name"]: _numbers(t["y"]) for t in bars["data"] if t["type"] == "bar"}
    assert stacked == {"before the run": [1024, 1024], "CUDA context": [1024, 1024],
                       "weights": [1024, 1024], "training": [1024, 1024]}
    peak = next(t for t in bars["data"] if t["name"] == "peak")
    assert _numbers(peak["y"]) == [4096, 4096]
    assert bars["layout"]["barmode"] == "stack"


def test_fewer_than_two_runs_asks_for_more(store, seed):
    seed()
    app = _page()
    assert "Comparing needs two stored runs" in app.info[0].value
    seed()
    app = _page()
    app.multiselect(key="compare_runs").set_value([]).run()
    assert "Choose two or more runs to compare." in [i.value for i in app.info]


def test_an_exported_file_imports_once_and_a_truncated_one_is_refused(store, seed, tmp_path):
    elsewhere = Store(tmp_path / "elsewhere.sqlite")
    exported = json.dumps(transfer.export_runs(elsewhere, [seed_run(elsewhere)])).encode()
    seed()
    app = _page()
    app.file_uploader(key="import_file").set_value(("runs.json", exported, "application/json"))
    app.run()
    assert not app.exception
    assert [s.value for s in app.success] == ["Imported runs.json: run 2."]
    app.run()  # a rerun with the same file still there imports nothing more
    assert len(store.runs()) == 2
    assert report(store, 2).summary.peak_mb == 4096

    app.file_uploader(key="import_file").set_value(("cut.json", exported[:100], "application/json"))
    app.run()
    (error,) = [e.value for e in app.error]
    assert error.startswith("Not imported: the file is truncated") and "Nothing was stored" in error
    assert len(store.runs()) == 2


def test_a_file_imported_again_is_refused_until_copies_are_asked_for(store, seed, tmp_path):
    elsewhere = Store(tmp_path / "elsewhere.sqlite")
    exported = json.dumps(transfer.export_runs(elsewhere, [seed_run(elsewhere)])).encode()
    transfer.import_runs(store, exported)  # imported once already: run 1 here
    app = _page()
    app.file_uploader(key="import_file").set_value(("again.json", exported, "application/json"))
    app.run()
    (warning,) = [w.value for w in app.warning]
    assert "is already imported as run 1" in warning and "Nothing was stored" in warning
    assert len(store.runs()) == 1
    app.checkbox(key="import_copy").check().run()
    assert [s.value for s in app.success] == ["Imported again.json: run 2."]
    assert store.run(2).origin == store.run(1).origin  # the copy says where it came from too


def test_a_finished_sweep_shows_its_grid_and_the_largest_batch_size(store):
    sweep_id = store.create_sweep("batch_size on bert-large-uncased",
                                  RunOptions(preset="bert-large-uncased").to_dict(),
                                  {"batch_size": [4, 8, 16]}, False, 3)
    key = store.sweep(sweep_id).key
    for size, status in ((4, "completed"), (8, "completed"), (16, "oom")):
        run_id = _with_options(store, seed_run(store, status=status), batch_size=size)
        store.update_run(run_id, sweep=key)
    store.update_sweep(sweep_id, status="completed")
    app = _page()
    assert app.selectbox(key="sweep_shown").value == sweep_id
    assert any("Largest batch size that fit: **8**" in m.value for m in app.markdown)
    peak = chart_spec(app, "sweep_peak")["data"][0]
    assert peak["type"] == "bar"  # one option varied: bars from 0, not a heatmap's colours
    assert peak["x"] == ["4", "8", "16"]
    assert peak["text"] == ["4,096", "4,096", "oom"]


def test_a_running_sweep_shows_its_progress_read_from_the_store(store, seed):
    from anatomy.dashboard import server  # the server's sweep slot, where the page finds the running sweep

    sweep_id = store.create_sweep("batch_size on bert-large-uncased",
                                  RunOptions(preset="bert-large-uncased").to_dict(),
                                  {"batch_size": [1, 2, 4]}, False, 3)
    key = store.sweep(sweep_id).key
    done = _with_options(store, seed(), batch_size=1)
    running = _with_options(store, seed(status="running"), batch_size=2)
    for run_id in (done, running):
        store.update_run(run_id, sweep=key)

    class Running:  # the runner's thread, as the page sees it: alive, with its sweep's id
        id = sweep_id

        def is_alive(self) -> bool:
            return True

    slot = server.sweeps()
    slot.sweep = Running()
    try:
        app = _page()
    finally:
        slot.sweep = None
    assert f"Sweep {sweep_id} running" in [s.value for s in app.subheader]
    (progress,) = app.get("progress")
    assert progress.proto.text == f"1 of 3 runs done · now run {running}: batch size 2"
    assert app.button(key="sweep_start").disabled
    assert app.button(key="sweep_stop")


def test_a_sweep_with_a_wrong_value_is_refused_before_it_starts(store):
    app = _page()
    app.text_input(key="sweep_values_batch_size").set_value("1,two").run()
    app.button(key="sweep_start").click().run()
    assert not app.exception
    # Named by its label, as every other error of the form is (it said "batch-size:", the flag).
    assert [e.value for e in app.error] == ["Batch size: 'two' is not a whole number"]
    assert store.sweeps() == []


def test_a_sweep_of_one_run_says_one_run(store):
    """A sweep stopped during its first run said "stopped, 1 runs"."""
    sweep_id = store.create_sweep("batch_size on bert-large-uncased",
                                  RunOptions(preset="bert-large-uncased").to_dict(),
                                  {"batch_size": [1, 2]}, False, 2)
    run_id = _with_options(store, seed_run(store, status="stopped"), batch_size=1)
    store.update_run(run_id, sweep=store.sweep(sweep_id).key)
    store.update_sweep(sweep_id, status="stopped")
    app = _page()
    assert f"Sweep {sweep_id} (batch_size on bert-large-uncased): stopped, 1 run" in [
        w.value for w in app.warning]


def test_a_sweeps_wrong_option_is_named_by_its_label_not_its_code_name_or_flag(store):
    app = _page()
    app.text_input(key="sweep_option_split").set_value("validation").run()
    app.button(key="sweep_start").click().run()
    errors = [e.value for e in app.error]
    assert any(e.startswith("Split: 'validation' is a setting of a dataset's texts") and
               e.endswith("fill in “Dataset” too") for e in errors), errors
    assert store.sweeps() == []


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_sweep_starts_from_the_live_forms_options_and_offers_what_the_machine_has(
        store, fresh_nvml, gpus):
    """The Sweep's base was the defaults, not the model chosen on the Live form; it offered a
    GPU index on a CPU; and "until out of memory" did not say that on a CPU it fills the RAM."""
    from anatomy.dashboard import server
    from anatomy.engine import nvml
    from tests.fake_nvml import FakePynvml

    nvml._lib = FakePynvml(gpus=gpus) if gpus else None
    server.device.clear()
    try:
        app = open_page("screens/live.py")
        app.selectbox(key="option_model").set_value("tiny-gpt2")
        app.number_input(key="option_batch_size").set_value(2)
        app.button(key="predict").click().run()
        app.switch_page("screens/compare.py").run()
        assert not app.exception
        assert app.selectbox(key="sweep_option_model").value == "tiny-gpt2"
        assert app.number_input(key="sweep_option_batch_size").value == 2
        shown = {w.key for w in [*app.number_input, *app.selectbox]}
        assert ("sweep_option_gpu" in shown) == bool(gpus)
        assert ("sweep_option_processes" in shown) == (not gpus)
        app.checkbox(key="sweep_until_oom").check().run()
        ram = [w.value for w in app.warning if "RAM full" in w.value]
        if gpus:
            assert ram == []
        else:
            (warning,) = ram
            assert warning.startswith("Without a GPU, out of memory means this machine's ")
    finally:
        server.device.clear()


# --- the logic, without Streamlit ---

def test_differing_options_count_defaults_of_options_added_later(store, seed):
    old = seed()
    options = dict(store.run(old).options)
    del options["profile_steps"]  # recorded before the option existed: it ran with 0
    store.update_run(old, options=options)
    new = seed()
    reports = [report(store, old), report(store, new)]
    assert compare.differing_options(reports) == []
    _with_options(store, new, precision="bf16", gradient_checkpointing=True)
    assert compare.differing_options([report(store, old), report(store, new)]) == [
        "precision", "gradient_checkpointing"]


def test_difference_in_megabytes_and_percent():
    assert compare.difference(150, 100) == compare.Difference(absolute=50, percent=50.0)
    assert compare.difference(0, 0) == compare.Difference(absolute=0, percent=None)  # no % of 0
    assert compare.difference(None, 100) == compare.Difference(absolute=None, percent=None)


def test_ids_from_the_url():
    assert view.parse_ids("3, 1,x,3,,2") == [3, 1, 2]
    assert view.parse_ids(None) == []


def test_measured_components_split_the_training_increase(store, seed):
    run_id = seed()
    summary = store.run(run_id).summary
    components = {"weights": 100 * MIB, "gradients": 100 * MIB, "optimizer_states": 200 * MIB,
                  "activations": 300 * MIB, "peak_allocated": 650 * MIB,
                  "peak_reserved": 700 * MIB, "allocator_cache": 50 * MIB}
    store.update_run(run_id, summary={**summary.to_dict(), "components": components})
    parts = {p.part: p.bytes // MIB for p in compare.memory_parts(report(store, run_id))}
    # The training increase (1,024 MB) is what the allocator's peak holds plus the rest:
    # states, the larger of activations and gradients, temporary (650 − 100 − 200 − 300).
    assert parts == {Phase.BASELINE: 1024, Part.CONTEXT: 1024, Phase.WEIGHTS: 1024,
                     Part.OPTIMIZER_STATES: 200, Part.ACTIVATIONS: 300, Part.TEMPORARY: 50,
                     Part.ALLOCATOR_CACHE: 50, Part.NON_TORCH: 1024 - 600}


def test_the_rest_of_the_increase_is_named_as_the_device_measures_it(store, seed):
    """On a GPU the rest is outside PyTorch's allocator; on a CPU, where the curve is the
    process's RSS, it is the process's own memory beyond its tensors."""
    components = {"weights": 100 * MIB, "gradients": 100 * MIB, "optimizer_states": 200 * MIB,
                  "activations": 300 * MIB}
    notes = {}
    for backend in ("nvml", "rss"):
        run_id = seed(backend=backend)
        summary = store.run(run_id).summary
        store.update_run(run_id, summary={**summary.to_dict(), "components": components})
        notes[backend] = next(p.note for p in compare.memory_parts(report(store, run_id))
                              if p.part == Part.NON_TORCH)
    assert "outside PyTorch's allocator" in notes["nvml"]
    assert "PyTorch's allocator" not in notes["rss"] and "the process's own memory" in notes["rss"]


@pytest.mark.parametrize("backend", ["nvml", "cpu-rss"])
def test_a_bar_reaches_its_training_end_on_the_scale_of_its_peak_marker(store, seed, backend):
    """A CPU run's bar left out the baseline (the interpreter, ~50 MiB) while its peak diamond,
    a sample of the whole process, held it: the diamond floated that far above a bar whose
    training ended at its peak. The bar stands on what was held before the run."""
    run_id = seed(backend=backend)
    rep = report(store, run_id)
    parts = compare.memory_parts(rep)
    assert parts[0].part == Phase.BASELINE and parts[0].bytes == 1 * GIB
    assert sum(p.bytes for p in parts) == rep.phase_memory()[Phase.TRAINING] == 4 * GIB
    bars = figures.memory_bars_figure([rep]).data
    top = sum(t.y[0] for t in bars if t.type == "bar")
    (peak,) = [t for t in bars if t.name == "peak"]
    assert top == peak.y[0] == rep.summary.peak_mb


def test_an_out_of_memory_run_adds_no_negative_part(store, seed):
    run_id = seed(status="running")
    # Its memory was freed as it failed, before the training phase's end was marked.
    store.write(run_id, samples=[Sample(9.5, 0, 0, None, 141 * GIB, None)],
                phases=[PhaseMark("end", "training", 9.5)])
    store.finish(run_id, "oom", "CUDA out of memory. Tried to allocate 1.00 GiB")
    training = next(p for p in compare.memory_parts(report(store, run_id))
                    if p.part == Phase.TRAINING)
    assert training.bytes == 0 and "oom" in training.note


def test_the_bars_keep_one_order_and_show_the_total_once_near(store, seed):
    plain = seed()
    split = seed()
    summary = store.run(split).summary
    store.update_run(split, summary={**summary.to_dict(), "components": {
        "weights": 10 * MIB, "gradients": 30 * MIB, "optimizer_states": 20 * MIB,
        "activations": 5 * MIB}})
    store.merge_environment(plain, {"gpu_total": 141 * GIB})
    figure = figures.memory_bars_figure([report(store, plain), report(store, split)])
    assert [t.name for t in figure.data] == [
        "before the run", "CUDA context", "weights", "training", "optimizer states", "gradients",
        "the rest", "peak",
        "device total (click to show)"]
    assert figure.data[-1].visible == "legendonly"  # 4 GiB under 141 GiB


def test_the_sweep_heatmap_puts_batch_size_across_and_the_other_option_down():
    runs = [SweepRun(1, {"precision": "fp32", "batch_size": 1}, "completed", 100, 5.0, 1.0),
            SweepRun(2, {"precision": "fp32", "batch_size": 2}, "oom", 999, None, None),
            SweepRun(3, {"precision": "bf16", "batch_size": 1}, "completed", 80, 9.0, 1.0)]
    result = SweepGrid(sweep=1, name=None, status="completed", error=None,
                       vary={"precision": ["fp32", "bf16"], "batch_size": [1, 2]}, until_oom=False,
                       planned=4, skipped=1, runs=runs, largest_fitting={"fp32": 1, "bf16": 1})
    heatmap = figures.sweep_figure(result, "samples_per_second").data[0]
    assert isinstance(heatmap, go.Heatmap)
    assert list(heatmap.x) == ["1", "2"] and list(heatmap.y) == ["fp32", "bf16"]
    assert [list(row) for row in heatmap.z] == [[5.0, None], [9.0, None]]
    assert [list(row) for row in heatmap.text] == [["5.00", "oom"], ["9.00", "not run"]]


def _numbers(values) -> list[float]:
    """A trace's numbers as the page sent them: plain lists, or numpy's binary typed arrays."""
    if isinstance(values, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def test_labels_name_exactly_the_options_that_differ(store, seed):
    plain = seed()
    other = _with_options(store, seed(), seq_len=256, optim="adafactor")
    app = _page(runs=f"{plain},{other}")
    expected = [f"Run {plain} · seq 512 · adamw_torch", f"Run {other} · seq 256 · adafactor"]
    overlay = chart_spec(app, "compare_overlay")
    assert [t["name"] for t in overlay["data"] if t.get("mode") == "lines"] == expected
    multiples = chart_spec(app, "compare_multiples")
    assert [a["text"] for a in multiples["layout"]["annotations"]][:2] == expected
    bars = chart_spec(app, "compare_bars")
    assert bars["layout"]["xaxis"]["ticktext"] == expected  # each fits its bar's room
    steps = chart_spec(app, "compare_steps")
    assert [t["name"] for t in steps["data"] if t.get("showlegend")] == expected


def test_runs_on_different_devices_say_so(store, seed):
    gpu, cpu = seed(), seed(backend="cpu-rss")
    labels = view.run_labels([report(store, gpu), report(store, cpu)])
    assert labels == {gpu: f"Run {gpu} · NVIDIA H200", cpu: f"Run {cpu} · CPU"}


def test_ids_in_the_url_that_are_not_stored_are_said(store, seed):
    first, second = seed(), seed()
    app = _page(runs=f"{first},99999,{second},abc")
    assert [w.value for w in app.warning] == ["Runs 99999, abc not found: left out of the "
                                              "comparison."]
    assert app.multiselect(key="compare_runs").value == [first, second]
    assert app.query_params["runs"] == f"{first},{second}"


def test_ids_that_int_or_sqlite_cannot_take_are_said_not_raised(store, seed):
    """/compare?runs=1,²,… raised ValueError (int("²"): a digit to isdigit()), and 10²⁶ an
    OverflowError from SQLite, on every page that reads a run id from its URL."""
    first, second = seed(), seed()
    app = _page(runs=f"{first},²,{second},99999999999999999999999999,٣")
    assert [w.value for w in app.warning] == [
        "Runs ², 99999999999999999999999999, ٣ not found: left out of the comparison."]
    assert app.multiselect(key="compare_runs").value == [first, second]
    for page in ("screens/runs.py", "screens/live.py", "screens/anatomy.py"):
        for asked in ("²", "99999999999999999999999999"):
            app = open_page(page, interactive=False, run=asked)  # asserts no exception
            assert app.warning[0].value.startswith(f"'{asked}' is not a run id")


def test_a_sweep_in_which_nothing_ran_out_of_memory_says_so(store):
    sweep_id = store.create_sweep("batch_size on bert-large-uncased",
                                  RunOptions(preset="bert-large-uncased").to_dict(),
                                  {"batch_size": [1, 2]}, False, 2)
    key = store.sweep(sweep_id).key
    for size in (1, 2):
        store.update_run(_with_options(store, seed_run(store), batch_size=size), sweep=key)
    store.update_sweep(sweep_id, status="completed")
    app = _page()
    assert any("all fitted; the largest tried was **2**" in m.value for m in app.markdown)
    assert not any("Largest batch size that fit: **2**" in m.value for m in app.markdown)


def test_a_sweep_that_ended_before_a_value_ran_does_not_say_yet(store):
    """A sweep that failed before its first run said "Largest batch size that fit: no run yet",
    as if it were still running."""
    sweep_id = store.create_sweep("batch_size on tiny", RunOptions(model="tiny").to_dict(),
                                  {"batch_size": [1, 2]}, False, 2)
    assert view.largest_fitting(grid(store, sweep_id)) == \
        "Largest batch size that fit: no run yet"
    store.update_sweep(sweep_id, status="failed",
                       error="the process that ran it ended before the sweep did")
    assert view.largest_fitting(grid(store, sweep_id)) == \
        "Largest batch size that fit: no run (the sweep ended first)"


def test_two_varied_options_colour_from_zero():
    runs = [SweepRun(1, {"precision": "fp32", "batch_size": 1}, "completed", 554, 5.0, 1.0),
            SweepRun(2, {"precision": "bf16", "batch_size": 1}, "completed", 559, 9.0, 1.0)]
    result = SweepGrid(sweep=1, name=None, status="completed", error=None,
                       vary={"precision": ["fp32", "bf16"], "batch_size": [1]}, until_oom=False,
                       planned=2, skipped=0, runs=runs, largest_fitting={"fp32": 1, "bf16": 1})
    heatmap = figures.sweep_figure(result, "peak_mb").data[0]
    assert heatmap.zmin == 0  # 554 and 559 MB get nearly the same colour, as they should


def test_training_only_zooms_every_panel_on_the_training_phases(store):
    early, late = _run_training_from(store, 4.0), _run_training_from(store, 7.0)
    app = _page(runs=f"{early},{late}")
    assert "range" not in chart_spec(app, "compare_overlay")["layout"]["xaxis"]
    app.segmented_control(key="compare_span").set_value("training only").run()
    # Both trainings last 3 s from their aligned start: 0 to 3 s, a little margin either side.
    overlay = chart_spec(app, "compare_overlay")["layout"]["xaxis"]["range"]
    assert overlay == pytest.approx([-0.09, 3.09])
    multiples = chart_spec(app, "compare_multiples")["layout"]
    assert multiples["xaxis"]["range"] == multiples["xaxis2"]["range"] == overlay


def test_runs_without_phases_keep_their_places_and_names_under_the_bars(store):
    """Two scripts' runs that marked no phase (/compare?runs=13,14, one with a sample, one with
    none): "What each phase added" was a picture with a diamond at x = 0 on an axis from −0.5 to
    0.5 in round numbers, naming neither run."""
    with_sample = store.create_run({}, "cpu-rss", "rss", 0, {"gpu_name": None}, preset="t.py",
                                   source={"kind": "script", "script": "/x/t.py"})
    store.write(with_sample, samples=[Sample(0.0, 0, 100 * 2**20, None, None, None)])
    store.finish(with_sample, "completed")
    empty = store.create_run({}, "cpu-rss", "rss", 0, {"gpu_name": None}, preset="t.py",
                             source={"kind": "script", "script": "/x/t.py"})
    store.finish(empty, "failed", "ValueError")
    app = open_page("screens/compare.py", interactive=False, runs=f"{with_sample},{empty}")
    bars = chart_spec(app, "compare_bars")  # the chart: a picture has no tick labels of its own
    assert bars["layout"]["xaxis"]["ticktext"] == [f"Run {with_sample}", f"Run {empty}"]
    assert bars["layout"]["xaxis"]["range"] == [-0.5, 1.5]  # both places, the empty one too


def test_runs_left_out_of_the_overlay_are_said_as_they_were_recorded(store, seed, seed_users):
    """Aligned at the baseline, a Trainer's callback run (which began at the weights) and a
    watched command (no phase at all) "never reached the baseline phase"; a run still in its
    first phase "never reached the training phase"."""
    done, stopped = seed(), seed(status="stopped", phases_reached=1)
    running = seed(status="running", phases_reached=1)
    trainer, command = seed_users("trainer"), seed_users("command")
    reports = [report(store, i) for i in (done, stopped, running, trainer, command)]
    assert view.not_drawn(reports, Phase.BASELINE) == (
        f"Not drawn: run {trainer}, run {command} did not mark a baseline phase (a user's "
        "training marks the phases it chooses).")
    assert view.not_drawn(reports, Phase.TRAINING) == (
        f"Not drawn: run {stopped} never reached the training phase; run {running} has not "
        f"reached the training phase yet; run {command} did not mark a training phase (a "
        "user's training marks the phases it chooses).")
    assert view.not_drawn(reports[:1], Phase.TRAINING) is None
    app = open_page("screens/compare.py", runs=f"{done},{trainer}")
    app.selectbox(key="compare_phase").set_value(Phase.BASELINE).run()
    assert [w.value for w in app.warning] == [view.not_drawn(reports[::3], Phase.BASELINE)]


def test_titles_and_bar_labels_fit_between_their_neighbours(store, seed_users):
    """Three Trainer runs named by their users: "Run 1 · user t5 · T5ForConditionalGeneration"
    on one line ran over the next panel's title, and the third was cut at the chart's edge."""
    runs = [seed_users("trainer", name=f"user {name}") for name in ("t5", "resnet", "mixtral")]
    runs.append(seed_users("command"))  # no training phase: said beside its id, never cut
    reports = [report(store, i) for i in runs]
    figure = figures.small_multiples_figure(reports, {})
    room = 28  # characters: a 560 px plot over three panels, 6.6 px a 12 px character
    titles = [a.text for a in figure.layout.annotations if a.text.startswith("Run ")]
    assert len(titles) == 4
    for title in titles:
        assert all(len(line) <= room for line in title.split("<br>")), title
    assert titles[0].startswith(f"Run {runs[0]} · user t5")
    assert titles[3].startswith(f"Run {runs[3]} (no training phase)")
    # Under the bars, five runs: each label in its bar's room, on three lines at most (wider,
    # Plotly turned them aslant and left out the last, past the chart's edge).
    runs.append(seed_users("trainer", name="bad config"))
    reports = [report(store, i) for i in runs]
    ticks = figures.memory_bars_figure(reports).layout.xaxis.ticktext
    room = 12  # characters: three quarters of 560 px over five bars, 6.6 px a character
    assert len(ticks) == 5 and all(t.startswith(f"Run {i}") for t, i in zip(ticks, runs))
    assert figures.memory_bars_figure(reports).layout.xaxis.tickangle == 0
    for tick in ticks:
        assert tick.count("<br>") <= 2 and all(len(line) <= room for line in tick.split("<br>"))


def test_a_runs_name_is_text_in_the_charts_not_plotlys_markup(store, seed):
    """A run named '<b>bold</b> <a href="http://example.com">link</a>': Compare's legends, panel
    titles and bar labels drew a bold word and a link (Plotly reads those tags in its text)."""
    named, other = seed(), seed()
    store.rename_run(named, '<b>bold</b> <a href="http://example.com">link</a>')
    labels = view.run_labels([report(store, named), report(store, other)])
    assert labels[named] == \
        f'Run {named} · &lt;b&gt;bold&lt;/b&gt; &lt;a href="http://example.com"&gt;link&lt;/a&gt;'
    alone = view.run_labels([report(store, named)])[named]
    assert "<" not in alone and "&lt;b&gt;bold" in alone


def test_a_users_run_differs_only_in_what_it_reported(store, seed, seed_users):
    """A Trainer's run beside anatomy's own: what the Trainer never said (its sample rate, its
    processes, profiling, LoRA, the dummy dataset's size) is no difference, nor are the epochs a
    Trainer ignores where max steps are set (TrainingArguments' default 3.0)."""
    ours = seed()  # bert-large, batch 4, seq 512, 8 steps, adamw_torch, on a GPU
    theirs = _with_options(store, seed_users("trainer"), max_steps=5, epochs=3.0)
    reports = [report(store, ours), report(store, theirs)]
    assert compare.differing_options(reports) == ["model", "batch_size", "seq_len", "max_steps",
                                                  "optim"]
    model = "BertForSequenceClassification"  # a user's model built from its config: its class
    assert view.run_labels(reports) == {
        ours: f"Run {ours} · NVIDIA H200 · bert-large-uncased · bs 4 · seq 512 · 8 steps · "
              "adamw_torch",
        theirs: f"Run {theirs} · CPU · {model} · bs 8 · seq 64 · 5 steps · adamw_torch_fused"}
    marked = [row["what"] for row in view.side_by_side(reports) if row[""] == view.DIFFERS]
    assert marked == ["device", "Model", "Batch size", "Sequence length", "Max steps",
                      "Optimizer"]
    # A Trainer that trains by its epochs says so by leaving max steps out.
    by_epochs = seed_users("trainer")
    labels = view.run_labels([report(store, ours), report(store, by_epochs)])
    assert labels[by_epochs] == (f"Run {by_epochs} · CPU · {model} · bs 8 · seq 64 · by epochs · "
                                 "adamw_torch_fused")


def test_a_run_without_lora_beside_one_with_it_is_labelled_no_lora(store, seed):
    """A LoRA run compared with one that trains every weight: the other's label said "LoRA r0",
    a rank that no LoRA has."""
    full, lora = seed(), _with_options(store, seed(), lora_rank=8)
    labels = view.run_labels([report(store, full), report(store, lora)])
    assert labels[full].endswith(" · no LoRA") and labels[lora].endswith(" · LoRA r8"), labels


def test_a_model_known_by_its_config_file_or_by_its_class_is_compared_by_its_shape(
        store, seed, seed_users, tmp_path):
    """anatomy's run of my-bert.json and a user's model built from the same config (known by its
    class alone: "BertForSequenceClassification", beside a path) are one model; bert-large beside
    that user's model is another, and two runs that name their models differ by their names,
    each said by its short name (a config file's, not its path)."""
    path = tmp_path / "my-bert.json"
    path.write_text(json.dumps(USERS_MODEL))
    ours = _with_options(store, seed(), model=str(path))
    theirs = seed_users("trainer")
    assert "model" not in compare.differing_options([report(store, ours), report(store, theirs)])
    large = seed()
    assert compare.differing_options([report(store, large), report(store, theirs)])[0] == "model"
    reports = [report(store, ours), report(store, large)]
    assert compare.differing_options(reports) == ["model"]
    assert view.run_labels(reports) == {ours: f"Run {ours} · my-bert",
                                        large: f"Run {large} · bert-large-uncased"}
    (row,) = [row for row in view.side_by_side(reports) if row["what"] == "Model"]
    assert (row[""], row[f"Run {ours}"]) == (view.DIFFERS, "my-bert")
