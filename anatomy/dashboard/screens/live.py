"""Live run: the run options, Start and Stop, and the run's memory as it happens."""

from __future__ import annotations

import streamlit as st

from anatomy.analysis import duration
from anatomy.analysis.options import (
    DATA_DECIDES,
    DATA_FIELDS,
    FIELDS,
    Checked,
    InvalidOptions,
    defaults_for,
    validated,
)
from anatomy.analysis.report import RunReport, report
from anatomy.dashboard import links, server, widgets
from anatomy.engine import cgroups
from anatomy.engine.manager import STOP_GRACE_SECONDS, DeviceBusy, live_run
from anatomy.prediction.memory import CPU_PROCESS
from anatomy.store import StoreError
from anatomy.units import MIB_NAME
from anatomy.views import live as view
from anatomy.views import text
from anatomy.views.figures import live as figures
from anatomy.vocabulary import Backend, Phase, Status

REFRESH_SECONDS = widgets.LIVE_REFRESH_SECONDS
# The form's columns: the model and its inputs' shape, the training, the dataset, then every
# other field (the sampling, the devices, what trains) in FIELDS order, so that a field added to
# the engine shows up in the form by itself. Their lengths kept near one another: the buttons
# come below the longest.
FIRST_COLUMNS = (
    ("model", "batch_size", "seq_len", "target_len", "dataset_size", "weights", "attention",
     "gradient_checkpointing"),
    ("epochs", "max_steps", "precision", "optim", "grad_accum", "label_smoothing", "seed"),
    DATA_FIELDS,
)


def _layout() -> list[tuple[str, ...]]:
    placed = {name for column in FIRST_COLUMNS for name in column}
    return [*FIRST_COLUMNS, tuple(name for name in FIELDS if name not in placed)]


def _key(name: str) -> str:
    return widgets.option_key(name)


def _form_values() -> dict:
    return {name: st.session_state[_key(name)] for name in FIELDS if _key(name) in st.session_state}


def _judged() -> Checked | None:
    """The form's options judged once for this machine; None where some are wrong (kept for the
    fields to show)."""
    try:
        checked = validated(_form_values(), server.device().gpu_count)
    except InvalidOptions as error:
        st.session_state["option_errors"] = error.errors
        return None
    st.session_state["option_errors"] = {}
    return checked


def _drawn(name: str) -> bool:
    """The options of this device and model (widgets.offered)."""
    return widgets.offered(name, st.session_state.get(_key("model")))


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _state() -> tuple[int | None, str | None]:
    """The run this tab shows and its status: a forecast holds while they do not change."""
    run_id = st.session_state.get("live_run")
    run = server.store().run(run_id) if run_id is not None else None
    return (run_id, run.status if run else None)


def _forecast() -> None:
    """The form's second button: what these options should need and how long they should take,
    without starting anything. The fields are judged again, so a fixed field's error goes."""
    checked = _judged()
    forecast = view.Forecast(None, None)
    if checked is not None:
        with st.spinner("tracing the training step on fake tensors…"):
            forecast = view.run_forecast(checked, server.device(), server.store(), _front())
    st.session_state["forecast"] = forecast
    st.session_state["forecast_for"] = _state()
    st.session_state.pop("start_refused", None)
    st.session_state["errors_from"] = "predict"


def _front() -> int:
    """This server's own memory: a run the form starts has it for its front, beside it in the
    RAM (a container's limit) that a CPU run's forecast shares out."""
    return CPU_PROCESS.dashboard_front(cgroups.anonymous_bytes())


def _what_fits() -> None:
    """The form's third button: the largest batch size predicted to fit, without running. Its
    fields are judged as Predict's are: wrong ones are marked, not left without an answer."""
    checked = _judged()
    forecast = view.Forecast(None, None)
    if checked is not None:
        with st.spinner("tracing the training step at two batch sizes…"):
            forecast = view.batch_size_forecast(checked, server.device(), _front())
    st.session_state["forecast"] = forecast
    st.session_state["forecast_for"] = _state()
    st.session_state.pop("start_refused", None)
    st.session_state["errors_from"] = "predict"


def _start() -> None:
    """The form's submit: the options judged once, here; a refusal is kept for the fields to
    show."""
    st.session_state.pop("start_refused", None)
    st.session_state["errors_from"] = "start"
    st.session_state["forecast"] = view.Forecast(None, None)
    checked = _judged()
    if checked is None:
        st.session_state["forecast_for"] = _state()
        return
    st.session_state["forecast"] = view.run_forecast(checked, server.device(), server.store(), _front())
    try:
        run_id = server.manager().start(checked)
    except InvalidOptions as error:
        st.session_state["option_errors"] = error.errors
    except DeviceBusy as error:
        st.session_state["start_refused"] = str(error)
    except StoreError as error:  # a full disk: said in one line, nothing started
        st.session_state["start_refused"] = f"the store {error}"
    else:
        st.session_state["live_run"] = run_id
        st.query_params["run"] = str(run_id)
    st.session_state["forecast_for"] = _state()


# Labels that a form column 170 px wide at 1,000 px holds (the field's help says the rest).
SHORT_LABELS = {"gradient_checkpointing": "Checkpointing"}


def _field(name: str, default) -> None:
    # A dataset (as the form was last sent) decides the sequence length and the dataset size.
    ignored = name in DATA_DECIDES and bool(str(st.session_state.get(_key("dataset"), "")).strip())
    widgets.option_widget(name, default, _key(name), label=SHORT_LABELS.get(name),
                          disabled=ignored)
    if ignored:
        st.caption(view.DATASET_DECIDES[name])
    error = st.session_state.get("option_errors", {}).get(name)
    if error:
        st.error(text.form_error(name, error, under_field=True))


def options_form(has_gpu: bool, expanded: bool) -> None:
    defaults = defaults_for(has_gpu)
    # What the form holds, for the Sweep's base (its widgets' state goes when the page is left).
    st.session_state[widgets.LIVE_OPTIONS] = _form_values()
    errors = bool(st.session_state.get("option_errors") or st.session_state.get("start_refused"))
    # Enter in a field keeps its value and sends nothing: a form sends itself with its first
    # button, which here starts a run (and takes the device).
    with st.expander("Run options", expanded=expanded or errors, icon=":material/tune:"), \
            st.form("run_options", border=False, enter_to_submit=False):
        layout = _layout()
        for column, names in zip(st.columns(len(layout)), layout):
            with column:
                for name in names:
                    if _drawn(name):
                        _field(name, getattr(defaults, name))
        with st.container(horizontal=True):
            st.form_submit_button("Start", type="primary", on_click=_start, key="start",
                                  icon=":material/play_arrow:")
            st.form_submit_button("Predict memory and time", on_click=_forecast, key="predict",
                                  help="what these options should need, from the model config "
                                       "alone (docs/PREDICTION.md), and how long they should "
                                       "take, from the runs stored here; starts nothing")
            st.form_submit_button("What fits?", on_click=_what_fits, key="what_fits",
                                  help="the largest batch size predicted to fit this device, the "
                                       "other options as they are, for one training process; "
                                       "starts nothing")
    # A forecast belongs to the moment it was made: it goes once the run shown has changed (a
    # run it was made for has ended, another run is shown).
    forecast = st.session_state.get("forecast")
    if forecast is not None and st.session_state.get("forecast_for") == _state():
        if forecast.line:
            st.info(_sentence(forecast.line), icon=":material/memory:")
        if forecast.data is not None:
            _lengths(forecast.data)
        if forecast.duration:
            st.info(_sentence(forecast.duration), icon=":material/timer:")
        if forecast.warning:
            st.warning(_sentence(forecast.warning))
    # A refusal, like a forecast, belongs to the moment it was made (the busy run has ended).
    refused = st.session_state.get("start_refused")
    if refused and st.session_state.get("forecast_for") == _state():
        st.error(f"Not started: {refused}.")
    elif st.session_state.get("option_errors"):
        for line in view.refusal(st.session_state["option_errors"], _drawn,
                                 started=st.session_state.get("errors_from") == "start"):
            st.error(line)


def _lengths(batches) -> None:
    """A dataset's texts by length, and the batches the forecast was made at."""
    st.caption(f"The dataset: {batches.lengths.words()}.")
    widgets.chart(figures.lengths_figure(batches.lengths, batches.longest, batches.typical),
                  key="lengths")


def _phase_metrics(rep: RunReport) -> None:
    with st.container(horizontal=True):
        for metric in view.phase_metrics(rep):
            label = metric.name + (" (now)" if metric.state == view.PhaseState.OPEN else "")
            value = "—" if metric.memory_mb is None else f"{metric.memory_mb:,} {MIB_NAME}"
            delta = None if metric.delta_mb is None else f"{metric.delta_mb:+,d} {MIB_NAME}"
            st.metric(label, value, delta, delta_color="off",
                      border=metric.state == view.PhaseState.OPEN)


def _progress(rep: RunReport) -> None:
    done = view.progress(rep, server.store().last_step(rep.id))
    stage = view.stage(rep)
    if stage.phase == Phase.TRAINING:
        if done.seconds_left is not None:
            left = f"time left: {duration.words(done.seconds_left)}"
        else:  # before the first step: the estimate made before the start
            estimate = duration.estimate(server.store(), rep.options, rep.backend,
                                         rep.environment.gpu_name, rep.environment.data)
            left = ("time left: measuring…" if estimate.step_s is None else
                    f"time left: about {duration.words(estimate.steps * estimate.step_s)} "
                    "(estimated before the first step)")
        text = f"training: step {done.step} / {done.total} · {left}"
    else:
        text = stage.words
    st.progress(done.fraction, text=text)


def _controls(run_id: int, progress) -> None:
    """Stop, or what it is doing. Drawn before the store is read (a Stop click's answer is the
    first thing this refresh sends); `progress` is the slot beside it, filled later."""
    manager = server.manager()
    with st.container(horizontal=True, vertical_alignment="bottom"):
        progress.append(st.empty())
        if widgets.stopping(run_id):
            st.button("Stopping…", key="stop", icon=":material/hourglass_top:", disabled=True)
        elif manager.is_active(run_id):
            st.button("Stop", key="stop", icon=":material/stop:", on_click=widgets.request_stop,
                      args=(run_id,))
    if widgets.stopping(run_id):
        st.warning("Stopping: the training process is told to end (SIGTERM; SIGKILL after "
                   f"{STOP_GRACE_SECONDS:.0f} s). What it recorded is kept.",
                   icon=":material/stop_circle:")
    elif not manager.is_active(run_id):
        origin = server.store().run(run_id).source.words()
        st.caption(f"Started by another process ({origin}): stop it there.")


@st.fragment(run_every=REFRESH_SECONDS)
def live_view(run_id: int) -> None:
    """Redrawn every REFRESH_SECONDS from the store alone; when the run ends, the whole page reruns
    into the finished view, which does not refresh."""
    db = server.store()
    if db.run(run_id).status != Status.RUNNING:
        st.rerun(scope="app")
    heading, metrics = st.empty(), st.container()
    progress: list = []
    _controls(run_id, progress)
    rep = report(db, run_id, counted=False)  # every second: the count is not shown here
    heading.subheader(text.literal(rep.title()))
    with metrics:
        _phase_metrics(rep)
    with progress[0].container():
        _progress(rep)
    widgets.run_charts(rep, "live", now=db.last_time(run_id), live=True)


def finished_view(run_id: int) -> None:
    rep = report(server.store(), run_id)
    st.subheader(text.literal(rep.title()))
    _phase_metrics(rep)
    # The chart first, how the run ended and the walkthrough's summary after it (at 1280 x 800
    # the chart began below the window's edge); a run that failed says so first.
    failed = rep.status not in (Status.COMPLETED, Status.STOPPED)
    if failed:
        widgets.outcome(rep)
    widgets.run_charts(rep, "live")
    if not failed:
        widgets.outcome(rep)
    st.page_link(links.RUNS_PAGE, label=f"Run {run_id} on the Runs page",
                 query_params={"run": str(run_id)}, icon=":material/table_rows:")


def _shown_run() -> int | None:
    """The run this page shows: ?run=ID (a stored run, by its link), else the run in progress,
    else the one this tab showed last. An id that is not stored is said; the URL is rewritten to
    name the run shown."""
    db = server.store()
    asked = st.query_params.get("run")
    missing = None
    if asked is not None and asked != str(st.session_state.get("live_run")):
        wanted = text.run_id(asked)
        if wanted is not None and db.run(wanted) is not None:
            st.session_state["live_run"] = wanted
        else:
            missing = asked
    if asked is None or missing is not None:
        # This tab follows the run in progress, though it did not start it (a reload, another
        # tab, a run from the CLI).
        running = live_run(db)
        if running is not None:
            st.session_state["live_run"] = running.id
    run_id = st.session_state.get("live_run")
    if run_id is not None and db.run(run_id) is None:  # deleted meanwhile: said, not dropped
        st.warning(text.missing_run(str(run_id), None, gone=True), icon=":material/delete:")
        run_id = st.session_state["live_run"] = None
    if missing is not None:
        st.warning(text.missing_run(missing, run_id), icon=":material/search_off:")
    if run_id is None:
        st.query_params.pop("run", None)
    else:
        st.query_params["run"] = str(run_id)
    return run_id


def main() -> None:
    st.title("Live run")
    caption = st.empty()
    run_id = _shown_run()
    shown = None if run_id is None else server.store().run(run_id)
    # The phases by the names of the run shown (a GPU's run imported on a laptop: CUDA kernels).
    on_gpu = server.device().has_gpu if shown is None else shown.backend == Backend.NVML
    caption.caption("The four moments of Hugging Face's *Model training anatomy*: "
                    f"{text.phase_names(on_gpu)}. Start a run and watch each one appear.")
    running = shown is not None and shown.status == Status.RUNNING
    # The chart is what people came for: while a run is shown, the options fold away.
    if not server.read_only():  # a read-only dashboard starts nothing
        options_form(server.device().has_gpu, expanded=run_id is None)
    if run_id is None:
        st.info("No run in progress. Start one above; stored runs are on the Runs page.")
    elif running:
        live_view(run_id)
    else:
        finished_view(run_id)


main()
