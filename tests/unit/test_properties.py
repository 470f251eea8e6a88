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
from anatomy.analysis import transfer
from anatomy.analysis.operations import comparison
from anatomy.analysis.options import FIELDS, validate
from anatomy.analysis.report import report
from anatomy.engine import protocol
from anatomy.engine.collector import Collector
from anatomy.prediction import breakdown
from anatomy.store import PhaseMark, RunFacts, RunSource, Sample, Step, Store, device_key, rank_series
from anatomy.views import anatomy as anatomy_view
from anatomy.views import live
from anatomy.views.figures import anatomy as anatomy_figures
from anatomy.views.figures import live as live_figures
from anatomy.vocabulary import SourceKind
from tests.conftest import TINY, seed_run

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
    errors = validate({name: value}, gpu_count)
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
    values = cli.arguments.values_from_args(args, has_gpu=False)
    for message in validate(values, 0).values():
        _one_line(message)


def test_a_refused_option_names_its_range():
    assert validate({"batch_size": 10**5000}, 0) == {
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



# --- what the recording writes, an import reads back ---

# The phases a front marks: anatomy's worker its own, a user's training any (again and again).
WORKERS_PHASES = st.sampled_from(["baseline", "kernel", "weights", "training", "profiling"])
USERS_PHASES = st.sampled_from(["baseline", "kernel", "weights", "training", "eval", "training"])


@st.composite
def recordings(draw) -> dict:
    """A run as a front records it, message by message through the collector: anatomy's worker,
    a phase-API script, a watched command; on the GPU or the CPU; one host or several (a joined
    host's devices keyed `device_key`); each rank marking phases whose names come again and
    reporting steps whose count starts again (a second `train()`, `start()` again under watch);
    its last phase left open or not, and how it ended."""
    kind = draw(st.sampled_from([None, SourceKind.SCRIPT, SourceKind.WATCH]))
    on_gpu = draw(st.booleans())
    hosts = draw(st.integers(1, 3))
    per_host = draw(st.integers(1, 2))
    ranks = [(host, local) for host in range(hosts) for local in range(per_host)]
    t, events = 0.0, []
    for rank, _ in enumerate(ranks):
        clock = 0.0
        marked = WORKERS_PHASES if kind is None else USERS_PHASES
        for name in draw(st.lists(marked, max_size=6), label=f"rank {rank}'s phases"):
            clock += draw(st.floats(0.0, 2.0))
            events.append((clock, rank, "start", name))
            for number in draw(st.lists(st.integers(0, 5), max_size=3), label="steps"):
                clock += draw(st.floats(0.0, 1.0))
                events.append((clock, rank, "step", number))
            if draw(st.booleans(), label="ended"):
                clock += draw(st.floats(0.0, 1.0))
                events.append((clock, rank, "end", name))
        t = max(t, clock)
    devices = sorted({device_key(host, local if on_gpu else series) for host, local in ranks
                      for series in (0, rank_series(local))})
    return {"kind": kind, "on_gpu": on_gpu, "ranks": ranks, "events": sorted(events, key=str),
            "devices": devices, "last": t + 1.0,
            "status": draw(st.sampled_from(["completed", "failed", "stopped", "running"]))}


def _record(store: Store, recorded: dict) -> int:
    """The run's row as its front makes it, its messages through the collector, its ending as
    the recording writes it (open phases end at its end)."""
    ranks, on_gpu = recorded["ranks"], recorded["on_gpu"]
    environment = RunFacts.of(gpu_name="NVIDIA H200" if on_gpu else None, host="node-0")
    if len(ranks) > 1:
        environment = environment.merged(RunFacts.of(
            world_size=len(ranks), hosts=tuple(f"node-{h}" for h in range(len({h for h, _ in ranks}))),
            rank_hosts=tuple(host for host, _ in ranks),
            **({"gpus": tuple(local for _, local in ranks)} if on_gpu else {})))
    kind = recorded["kind"]
    options = TINY.to_dict() if kind is None else {}
    source = RunSource.of(kind=kind, script="/home/user/train.py") if kind else None
    run_id = store.create_run(options, "nvml" if on_gpu else "cpu-rss", "v2" if on_gpu else "rss",
                              0, environment, source=source, preset=None if kind is None else "train.py")
    collector = Collector(store, run_id)
    ticks = [i / 2 for i in range(int(recorded["last"] * 2) + 1)]
    collector.handle(protocol.Samples([Sample(t, device, (1 + device % 7) * 2**20 + int(t * 1000),
                                              None, None, None)
                                       for t in ticks for device in recorded["devices"]]))
    for t, rank, what, value in sorted(recorded["events"], key=lambda e: e[0]):
        source = protocol.Source(rank=rank)
        if what == "step":
            collector.handle(protocol.StepReport(Step(t, value, None, 0.5, None, None), source))
        else:
            collector.handle(protocol.Phase(PhaseMark(what, value, t), source))
    collector.flush()
    if recorded["status"] != "running":
        store.close_phases(run_id, recorded["last"])
        store.finish(run_id, recorded["status"], None if recorded["status"] == "completed"
                     else "it ended so")
    return run_id


def _rows(store: Store, run_id: int) -> tuple:
    return (store.phases(run_id, None), store.steps(run_id, None), store.samples(run_id),
            store.messages(run_id))


@settings(SETTINGS, max_examples=50)
@given(recorded=recordings())
def test_every_run_the_recording_writes_is_imported_as_it_was(recorded, tmp_path_factory):
    """What anatomy writes, anatomy reads back: a phase marked twice ("the training phase
    appears twice") and a joined host's devices ("must be a whole number from 0 to 63, got
    1000") were refused by every import of their export."""
    folder = tmp_path_factory.mktemp("recorded")
    source = Store(folder / "source.sqlite")
    run_id = _record(source, recorded)
    (imported,) = transfer.import_runs(Store(folder / "target.sqlite"),
                                       json.dumps(transfer.export_runs(source, [run_id])))
    target = Store(folder / "target.sqlite")
    phases, steps, samples, messages = _rows(source, run_id)
    if recorded["status"] == "running":  # imported as stopped: its open phases end at its end
        last = max(s.t for s in samples)
        phases = [p if p.end_s is not None else p._replace(end_s=max(p.start_s, last))
                  for p in phases]
    assert _rows(target, imported) == (phases, steps, samples, messages)
    numbers = [(s.rank, s.step) for s in steps]
    assert len(numbers) == len(set(numbers))  # no step stored twice
    assert [p.name for p in report(target, imported).phases] == \
        [p.name for p in report(source, run_id).phases]
