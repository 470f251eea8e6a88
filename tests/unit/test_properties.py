"""Property-based tests (hypothesis) over every run option and every field an import stores.

- Every value of every run option, from the CLI's text or as any Python value, is accepted or
  refused with one line naming the option — never an exception.
- Every field of an export file, replaced by any JSON value or removed, is refused with one line
  saying where — or imported, and then everything that reads a run (`show`, `runs`, the report,
  the Anatomy page's tables, the charts) works on it.

The number of examples is bounded (CI time); `--hypothesis-seed` reproduces a failure.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anatomy import cli
from anatomy.analysis import breakdown, transfer
from anatomy.analysis.operations import comparison
from anatomy.analysis.options import FIELDS, RunOptions, validate
from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.views import anatomy as anatomy_view
from anatomy.views import live
from anatomy.views.figures import anatomy as anatomy_figures
from anatomy.views.figures import live as live_figures
from tests.conftest import seed_run

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# Any JSON value: what a file can hold at any place.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=6)
# Any Python value a caller (the form, a script) might hand the options.
ANY = JSON | st.tuples(st.integers()) | st.just(float("nan")) | st.binary(max_size=4)


def _one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, message


# --- run options ---

@SETTINGS
@given(name=st.sampled_from(sorted(FIELDS)), value=ANY, gpu_count=st.integers(0, 8))
def test_every_option_value_is_accepted_or_refused_in_a_line(name, value, gpu_count):
    errors = validate(RunOptions(**{name: value}), gpu_count)
    for field, message in errors.items():
        _one_line(message)
        assert message.startswith(f"{field}: ")


FLAGS = {name: "--" + name.replace("_", "-") for name in FIELDS
         if name not in ("gradient_checkpointing",)}


@SETTINGS
@given(name=st.sampled_from(sorted(FLAGS)), text=st.text(max_size=30) | st.integers().map(str))
def test_every_option_as_command_line_text_is_accepted_or_refused_in_a_line(name, text, capsys):
    """What `run` does before anything starts: parse, then validate."""
    try:
        args = cli.parser().parse_args(["run", f"{FLAGS[name]}={text}"])
    except SystemExit as exited:
        assert exited.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        _one_line(error)
        assert error.startswith("anatomy run: error: ")
        return
    options = cli.arguments.options_from_args(args, has_gpu=False)
    for message in validate(options, 0).values():
        _one_line(message)


def test_a_refused_option_names_its_range():
    assert validate(RunOptions(batch_size=10**5000), 0) == {
        "batch_size": "batch_size: an integer of thousands of digits is out of range: 1 to 4096"}


# --- every field of an import ---

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """A real export of a run with every part a run can have: phases, samples, steps, messages,
    tags, a name, components with their moments, and an operation profile; cut short, so every
    field is a few steps from the root."""
    store = Store(tmp_path_factory.mktemp("properties") / "source.sqlite")
    run_id = seed_run(store)
    store.rename_run(run_id, "walkthrough")
    store.set_tags(run_id, ["h200"])
    run = store.run(run_id)
    store.update_run(run_id, summary={**run.summary.to_dict(), "loss": 0.69, "components": {
        "weights": 1338, "activations": 2000, "gradients": 1338, "optimizer_states": 2676,
        "allocator_cache": 10, "peak_allocated": 6000, "peak_reserved": 6100,
        "moments": {"after forward": 5000}, "steps_measured": 3}, "operations": {
        "device": "cuda", "time_source": "GPU kernel time", "steps": 2,
        "classes": {"tensor contraction": {"time_us": 10.5, "flops": 1000, "count": 4}},
        "operators": [{"name": "aten::mm", "class": "tensor contraction", "time_us": 10.5,
                       "flops": 1000, "count": 4}],
        "optimizer": {"time_us": 1.0, "flops": 10, "count": 1}}})
    data = transfer.export_runs(store, [run_id])
    entry = data["runs"][0]
    entry["samples"] = entry["samples"][::30]
    entry["steps"] = entry["steps"][:2]
    entry["messages"] = [{"t": 0.5, "level": "warning", "text": "eval_strategy 'no'"}]
    del entry["report"]  # for readers only: an import never reads it
    return json.loads(json.dumps(data))


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    found = [path] if path else []
    if isinstance(node, dict):
        for key, item in node.items():
            found += _paths(item, (*path, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _paths(item, (*path, index))
    return found


def _changed(data: dict, path: tuple, value: Any, remove: bool) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node[key]
    if remove:
        if isinstance(node, dict):
            del node[path[-1]]
        else:
            node.pop(path[-1])
    else:
        node[path[-1]] = value
    return data


def _reads(store: Store, run_id: int) -> None:
    """Everything that reads a stored run, as `show`, `runs` and the pages do."""
    rep = report(store, run_id)
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        for command in (["show", str(run_id)], ["show", str(run_id), "--json"], ["runs"]):
            assert cli.main([*command, "--store", str(store.path)]) == 0, quiet.getvalue()
    live.summary_lines(rep)
    live.status_line(rep)
    live.phase_metrics(rep)
    live_figures.memory_figure(rep, store.decimated(run_id), store.steps(run_id))
    anatomy_figures.first_steps_figure(rep, store.samples(run_id, rep.gpu), store.steps(run_id))
    prediction = breakdown.prediction_for(rep)
    anatomy_view.component_rows(rep, prediction)
    anatomy_figures.anatomy_waterfall_figure(anatomy_view.waterfall(rep, prediction))
    anatomy_view.peak_explanation(rep, prediction)
    anatomy_figures.moments_figure(anatomy_view.moment_rows(rep, prediction), 0)
    anatomy_view.bytes_per_parameter_rows(rep, prediction)
    if rep.operations is not None:
        anatomy_figures.operations_figure(comparison(rep.operations))
        anatomy_view.operations_explanation(rep.operations, rep.options.precision)
    transfer.export_runs(store, [run_id])


def test_the_export_itself_imports_and_reads(exported, tmp_path):
    store = Store(tmp_path / "target.sqlite")
    (run_id,) = transfer.import_runs(store, json.dumps(exported))
    _reads(store, run_id)
    assert report(store, run_id).operations.steps == 2


@SETTINGS
@given(data=st.data())
def test_every_import_field_is_refused_in_a_line_or_stored_and_read(exported, tmp_path, data):
    path = data.draw(st.sampled_from(_paths(exported)), label="field")
    remove = data.draw(st.booleans(), label="remove")
    value = None if remove else data.draw(JSON, label="value")
    text = json.dumps(_changed(exported, path, value, remove))
    store = Store(tmp_path / f"target-{abs(hash((path, text))) % 10**12}.sqlite")
    try:
        ids = transfer.import_runs(store, text, copy=True)
    except transfer.ImportRefused as refused:
        _one_line(str(refused))
        return
    for run_id in ids:
        _reads(store, run_id)

