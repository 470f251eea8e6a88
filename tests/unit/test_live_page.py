"""The Live page (and the Runs page's list) through Streamlit's AppTest (no browser), on a store
seeded per test, and the page logic of anatomy/views/live.py on its own. (A real run started
from the page: tests/e2e/test_live_page_run.py.)"""

from __future__ import annotations

import socket
import time
import xml.etree.ElementTree as ET

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis.report import report
from anatomy.dashboard.widgets import INTERACTIVE
from anatomy.store import GpuProcess, GpuStatus, HostStatus, Step
from anatomy.store.liveness import Recorder
from anatomy.views import live
from anatomy.views.live import PhaseMetric, Progress
from tests.apptest import APP, chart_spec, open_page

TIMEOUT = 30  # the first run of a test process imports plotly and the engine
SVG = "{http://www.w3.org/2000/svg}"


def _app(**state) -> AppTest:
    """The Live page; its charts interactive (the Plotly specs the tests read) unless `state`
    says otherwise."""
    app = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in {INTERACTIVE: True, **state}.items():
        app.session_state[key] = value
    return app


def _runs_page(**query) -> AppTest:
    return open_page("screens/runs.py", **query)


def _chart(app: AppTest, run_id: int) -> dict:
    """The run's memory chart."""
    return chart_spec(app, f"memory-{run_id}")


def _errors(app: AppTest) -> list[str]:
    return [e.value for e in app.error]


# --- the Live run page ---

@pytest.mark.parametrize("gpus", [0, 1])
def test_the_live_page_offers_every_run_option_with_the_machines_defaults(gpus, fake_machine):
    fake_machine(gpus)
    app = _app().run()
    assert not app.exception
    assert app.title[0].value == "Live run"
    assert app.number_input(key="option_batch_size").value == 4
    assert app.selectbox(key="option_model").value == ("bert-large-uncased" if gpus else "tiny")
    assert app.number_input(key="option_max_steps").value is None  # empty: the epochs decide
    assert app.number_input(key="option_max_steps").help.endswith(
        "(1 to 10000000; empty: the epochs decide)")
    assert app.checkbox(key="option_gradient_checkpointing").value is False
    assert "No run in progress" in app.info[0].value


def test_the_forms_values_are_kept_while_another_page_shows(fake_machine):
    """Typed into the form, predicted, then the Runs page and back: the form held its defaults
    again, under the forecast of the values gone (Start would have trained `tiny`)."""
    fake_machine(0)
    app = _app().run()
    app.number_input(key="option_batch_size").set_value(3)
    app.text_input(key="option_split").set_value("validation")
    app.selectbox(key="option_precision").set_value("bf16")
    app.button(key="predict").click().run()
    app.switch_page("screens/runs.py").run()
    app.switch_page("screens/live.py").run()
    assert not app.exception
    assert app.number_input(key="option_batch_size").value == 3
    assert app.text_input(key="option_split").value == "validation"
    assert app.selectbox(key="option_precision").value == "bf16"


@pytest.mark.parametrize("gpus", [0, 2])
def test_the_forms_widgets_log_no_warning_of_a_value_given_twice(gpus, fake_machine, caplog,
                                                                  monkeypatch):
    """`streamlit run app.py` printed, with its stack, "The widget with key "option_model" was
    created with a default value but also had its value set via the Session State API" (once a
    server: Streamlit warns once a process, hence its flag put back here): the form kept its
    values in Session State and gave each widget a value too. Each form, the Live run's and the
    Sweep's, on a first run, a second, and back from another page."""
    from streamlit.elements.lib import policies

    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    fake_machine(gpus)
    app = _app().run()
    app.number_input(key="option_batch_size").set_value(3)
    app.button(key="predict").click().run()
    app.switch_page("screens/compare.py").run()
    app.switch_page("screens/live.py").run()
    assert not app.exception
    assert app.number_input(key="option_batch_size").value == 3
    given_twice = [r.getMessage() for r in caplog.records
                   if "default value but also had its value set" in r.getMessage()]
    assert given_twice == []


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_the_forms_columns_are_of_like_lengths_so_the_buttons_come_soon(gpus, fake_machine):
    """The buttons come below the form's longest column: with every field not placed by name
    in the last one, it held 14 fields beside 4, and Start sat a laptop's screen below the
    model. Every field is drawn once, and no column holds twice another's fields."""
    fake_machine(gpus)
    app = _app().run()
    columns = [[w.key for w in column.children.values()] for column in app.columns[:4]]
    drawn = [key for column in columns for key in column]
    assert len(drawn) == len(set(drawn)) and "option_model" in columns[0]
    lengths = [len(column) for column in columns]
    assert max(lengths) <= 2 * min(lengths), columns


def test_a_wrong_value_is_named_under_its_field_and_nothing_starts(store):
    app = _app().run()
    app.number_input(key="option_batch_size").set_value(0)
    app.number_input(key="option_sample_rate").set_value(5000)
    app.button(key="start").click().run()
    assert not app.exception
    errors = _errors(app)
    # Under its field, without the option's code name (batch_size:) the CLI's message leads with.
    assert "0 is out of range: 1 to 4096" in errors
    assert "5000 is out of range: 1 to 2000" in errors
    assert "Not started: fix the fields marked above." in errors
    assert store.runs() == []
    assert "No run in progress" in app.info[0].value


def test_an_error_naming_another_option_names_it_by_its_label_not_its_flag(store):
    """A dataset's split without a dataset said "… give --dataset too" under Split: a CLI flag on
    a form that has none."""
    app = _app().run()
    app.text_input(key="option_split").set_value("validation")
    app.button(key="start").click().run()
    errors = _errors(app)
    assert any(e.startswith("'validation' is a setting of a dataset's texts") and
               e.endswith("fill in “Dataset” too") for e in errors), errors
    assert not any("--" in e or "split:" in e for e in errors), errors
    assert store.runs() == []


def test_a_choice_the_machine_cannot_run_is_refused_next_to_it(store, fake_machine):
    fake_machine(0)  # fp16 is refused only on a machine without a GPU
    app = _app().run()
    app.selectbox(key="option_precision").set_value("fp16")
    app.button(key="start").click().run()
    assert any(e.startswith("fp16 needs a GPU") for e in _errors(app))
    assert store.runs() == []



@pytest.mark.parametrize("gpus", [0, 1])
def test_the_gpu_index_field_is_offered_only_on_a_machine_with_a_gpu(gpus, fake_machine):
    """A CPU machine's form asked for a GPU index."""
    fake_machine(gpus)
    app = _app().run()
    assert not app.exception
    keys = {w.key for w in app.number_input}
    assert "option_batch_size" in keys  # the form is drawn
    assert ("option_gpu" in keys) == bool(gpus)

@pytest.mark.parametrize("gpus", [0, 1])
def test_the_sidebar_names_what_is_measured_and_why_in_words(gpus, fresh_nvml):
    """Without a driver it showed NVML's own "NVML: NVML Shared Library Not Found"."""
    import pynvml

    from anatomy.dashboard import server
    from anatomy.engine import nvml
    from tests.fake_nvml import FakePynvml

    nvml._lib = FakePynvml(gpus=gpus, init_error=None if gpus else
                           pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    server.device.clear()  # the server asks the machine once: ask this one
    try:
        app = _app().run()
    finally:
        server.device.clear()
    text = " ".join(m.value for m in [*app.sidebar.markdown, *app.sidebar.caption])
    if gpus:
        assert "GPU 0: NVIDIA H200" in text
    else:
        assert "No NVIDIA driver here: measuring the CPU's RAM (RSS)" in text
        assert "NVML" not in text  # NVML's own words are the caption's help, a hover away


def test_a_running_run_opens_live_with_its_open_phase(store, seed):
    run_id = seed(status="running", phases_reached=3)
    app = _app(**{INTERACTIVE: False}).run()  # a fresh session: a reload, another tab
    assert not app.exception
    assert app.subheader[0].value.startswith(f"Run {run_id}: bert-large-uncased")
    metrics = {m.label: m.value for m in app.metric}
    assert metrics == {"baseline": "1,024 MiB", "CUDA kernels": "2,048 MiB", "weights (now)": "3,072 MiB",
                       "training": "—"}
    assert app.get("progress")[0].proto.text == "phase weights"
    # While it trains, its memory is a picture (no Plotly to load in a new tab) of the figure
    # the interactive chart draws: the same bands.
    assert app.get("plotly_chart") == []
    (picture,) = [ET.fromstring(m.value) for m in app.markdown if "anatomy-chart" in m.value]
    assert [r.get("data-band") for r in picture.iter(f"{SVG}rect") if r.get("data-band")] == [
        "baseline", "kernel", "weights"]
    assert any(c.value.startswith("A picture, redrawn every 1 s while the run trains")
               for c in app.caption)
    # Its worker is not this server's (as with a run from the CLI): no Stop, a word instead.
    assert "Started by another process (the CLI): stop it there." in [c.value for c in app.caption]
    app.toggle(key=INTERACTIVE).set_value(True).run()
    chart = _chart(app, run_id)
    assert [s["name"] for s in chart["layout"]["shapes"]] == ["baseline", "kernel", "weights"]
    assert not [m for m in app.markdown if "anatomy-chart" in m.value]


def test_a_run_left_running_by_a_dead_server_is_not_shown_live(store, seed):
    run_id = seed(status="running")
    store.update_run(run_id, recorder=Recorder(2**22 + 1, time.time(), socket.gethostname()))
    app = _app().run()
    assert "No run in progress" in app.info[0].value


def test_a_finished_run_shows_the_walkthroughs_summary_and_a_link_to_it(store, seed):
    run_id = seed()
    app = _app(live_run=run_id).run()
    assert not app.exception
    assert app.success[0].value == "completed: peak 4,096 MiB"
    assert app.code[0].value == "Time: 3.21 s\nSamples/second: 9.97\nGPU memory occupied: 4,096 MiB."
    metrics = [(m.label, m.value) for m in app.metric]
    assert metrics[-1] == ("training", "4,096 MiB")
    link = app.get("page_link")[0].proto
    assert (link.page, link.query_string) == ("runs", f"run={run_id}")
    chart = _chart(app, run_id)
    assert [s["name"] for s in chart["layout"]["shapes"]] == ["baseline", "kernel", "weights",
                                                              "training"]
    assert [t["name"] for t in chart["data"]] == ["GPU 0", "torch allocated", "torch reserved",
                                                  "GPU 0 total: 141.0 GiB (click to show)", "end of phase"]
    assert chart["data"][0]["type"] == "scatter"  # SVG: no WebGL context per chart
    assert chart["layout"]["uirevision"] == f"run-{run_id}-run"
    assert app.query_params["run"] == str(run_id)  # the URL names the run shown


def test_an_out_of_memory_run_says_so_with_its_message_and_peak(store, seed):
    run_id = seed(status="oom", error="CUDA out of memory. Tried to allocate 1.00 GiB")
    app = _app(live_run=run_id).run()
    assert _errors(app) == ["out of memory: peak 4,096 MiB before it failed"]
    assert app.code[0].value == "CUDA out of memory. Tried to allocate 1.00 GiB"



# --- the Runs page ---

def test_the_runs_page_lists_every_stored_run(store, seed):
    first = seed()
    second = seed(status="oom", error="CUDA out of memory")
    app = _runs_page()
    table = app.dataframe[0].value
    # What tells runs apart comes first: at 1,400 px the table is cut after a dozen columns.
    assert list(table.columns[:9]) == ["Run", "Name", "Model", "Data", "Device", "Status",
                                       "Peak (MiB)", "Samples/s", "Time (s)"]
    assert list(table["Run"]) == [second, first]
    assert list(table["Device"]) == ["H200"] * 2
    assert list(table["Status"]) == ["oom", "completed"]
    assert list(table["Peak (MiB)"]) == [4096, 4096]
    assert list(table["Model"]) == ["bert-large-uncased"] * 2
    assert table["Samples/s"].iloc[1] == 9.97
    assert {"Started", "Batch", "Precision", "Time (s)"} <= set(table.columns)
    # How many processes trained, and LoRA: runs of both kinds side by side.
    assert list(table["Processes"]) == [1, 1] and list(table["LoRA rank"]) == [0, 0]


def test_the_runs_page_opens_the_run_in_the_url(store, seed):
    first, _ = seed(), seed(status="stopped")
    app = _runs_page(run=str(first))
    assert app.selectbox(key="runs_select").value == first
    assert app.subheader[0].value.startswith(f"Run {first}:")
    assert [s["name"] for s in _chart(app, first)["layout"]["shapes"]] == [
        "baseline", "kernel", "weights", "training"]


def test_the_runs_page_without_runs_says_how_to_make_one():
    app = _runs_page()
    assert "No runs stored yet" in app.info[0].value


def test_deleting_a_run_asks_first(store, seed):
    keep, doomed = seed(), seed()
    app = _runs_page(run=str(doomed))
    app.button(key="delete").click().run()
    assert store.run(doomed) is not None
    assert app.warning[0].value.startswith(f"Delete run {doomed} and its")
    app.button(key="delete_no").click().run()
    assert store.run(doomed) is not None and not app.warning
    app.button(key="delete").click().run()
    app.button(key="delete_yes").click().run()
    assert store.run(doomed) is None and store.run(keep) is not None
    assert list(app.dataframe[0].value["Run"]) == [keep]


# --- the page logic, without Streamlit ---

def test_phase_metrics_give_each_phase_its_increase(store, seed):
    metrics = live.phase_metrics(report(store, seed(status="running", phases_reached=3)))
    assert metrics == [
        PhaseMetric("baseline", "done", 1024, None), PhaseMetric("CUDA kernels", "done", 2048, 1024),
        PhaseMetric("weights", "open", 3072, 1024), PhaseMetric("training", "pending", None, None)]


def test_progress_counts_steps_and_the_time_left(store, seed):
    run_id = seed(status="running")
    rep = report(store, run_id)
    assert live.progress(rep, None) == Progress(step=0, total=8, fraction=0.0,
                                                   seconds_left=None)
    step = Step(t=8.0, step=4, total=8, loss=None, allocated=None, reserved=None)
    # training began at 6.0: 0.5 s a step
    assert live.progress(rep, step) == Progress(step=4, total=8, fraction=0.5,
                                                   seconds_left=2.0)


# --- a run's charts, one at a time, and the device panel ---

def _with_device_readings(store, run_id: int) -> None:
    """What the sampler stores every 0.5 s on an H200: the host, the GPU, and two processes on
    it, the run's own (its worker's pid) and someone else's."""
    store.update_run(run_id, worker_pid=store.run(run_id).worker_pid or 4242)
    worker = store.run(run_id).worker_pid
    for k in range(19):
        t = k / 2
        store.write(run_id, hosts=[HostStatus(t, 10.0 + k, 12 * 2**30, 125 * 2**30)],
                    gpus=[GpuStatus(t, 0, 90 + k % 5, 400.0 + k, 700.0, 40 + k // 3)],
                    processes=[GpuProcess(t, 0, worker, "python", 4 * 2**30),
                               GpuProcess(t, 0, 999, "jupyter", 2**30)])


def test_a_finished_run_shows_one_chart_at_a_time(store, seed):
    run_id = seed()
    _with_device_readings(store, run_id)
    app = _runs_page(run=str(run_id))
    charts = [c.proto.id for c in app.get("plotly_chart")]
    assert any(c.endswith(f"-memory-{run_id}") for c in charts)
    assert not any(f"steps-{run_id}" in c or "device_history" in c for c in charts)
    app.segmented_control(key="runs_view").set_value("steps").run()
    assert chart_spec(app, f"steps-{run_id}")["data"][0]["name"] == "loss"
    app.segmented_control(key="runs_view").set_value("device").run()
    device = chart_spec(app, f"device_history_{run_id}")
    titles = [a["text"] for a in device["layout"]["annotations"]]
    assert titles == ["GPU utilisation (%)", "power (W)", "temperature (°C)",
                      "host CPU, all cores (%)", "host RAM used (GiB)"]
    table = app.dataframe[-1].value
    assert list(table["PID"]) == [4242, 999]  # every process on the GPU, not only the run's
    assert list(table["Run"]) == ["this run", ""]


def test_a_live_run_shows_the_device_as_nvitop_does(store, seed):
    run_id = seed(status="running", phases_reached=3)
    _with_device_readings(store, run_id)
    app = _app().run()
    app.segmented_control(key="live_view").set_value("device").run()
    assert not app.exception
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["GPU utilisation"] == "93 %"  # the last reading
    # The limits in the labels: a value fits its card at 1,000 px ("2.1 / 2…" was cut).
    assert metrics["Power (of 700 W)"] == "418 W"
    assert metrics["Temperature"] == "46 °C"
    assert metrics["Memory (of 141.0 GiB)"] == "3.0 GiB"  # the last sample
    assert metrics["CPU (all cores)"] == "28 %" and metrics["RAM (of 125.0 GiB)"] == "12.0 GiB"
    assert list(app.dataframe[-1].value["Process"]) == ["python", "jupyter"]
