"""Live run: the run options, Start and Stop, and the run's memory as it happens."""

from __future__ import annotations

import streamlit as st

from anatomy.analysis.options import FIELDS, InvalidOptions, defaults_for
from anatomy.analysis.report import RunReport, report
from anatomy.engine.manager import DeviceBusy, live_run
from anatomy.views import session
from pages import common

REFRESH_SECONDS = 1.0
# The form's columns: the model and the data, the training, then every other field in FIELDS
# order, so that a field added to the engine shows up in the form by itself.
FIRST_COLUMNS = (
    ("model", "batch_size", "seq_len", "dataset_size"),
    ("epochs", "max_steps", "precision", "optim", "grad_accum"),
)


def _layout() -> list[tuple[str, ...]]:
    placed = {name for column in FIRST_COLUMNS for name in column}
    return [*FIRST_COLUMNS, tuple(name for name in FIELDS if name not in placed)]


def _key(name: str) -> str:
    return f"option_{name}"


def _form_options():
    return session.options_from_form({name: st.session_state[_key(name)] for name in FIELDS})


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _forecast() -> None:
    """The form's second button: what these options should need, without starting anything."""
    with st.spinner("tracing the training step on fake tensors…"):
        st.session_state["forecast"] = session.memory_forecast(_form_options(), common.device())


def _what_fits() -> None:
    """The form's third button: the largest batch size predicted to fit, without running."""
    with st.spinner("tracing the training step at two batch sizes…"):
        st.session_state["forecast"] = session.batch_size_forecast(_form_options(),
                                                                   common.device())


def _start() -> None:
    """The form's submit: the engine validates; a refusal is kept for the fields to show."""
    options = _form_options()
    st.session_state["forecast"] = session.memory_forecast(options, common.device())
    st.session_state.pop("start_refused", None)
    st.session_state["option_errors"] = {}
    try:
        st.session_state["live_run"] = common.manager().start(options)
    except InvalidOptions as error:
        st.session_state["option_errors"] = error.errors
    except DeviceBusy as error:
        st.session_state["start_refused"] = str(error)


def _field(name: str, default) -> None:
    common.option_widget(name, default, _key(name))
    error = st.session_state.get("option_errors", {}).get(name)
    if error:
        st.error(error)


def options_form(has_gpu: bool, expanded: bool) -> None:
    defaults = defaults_for(has_gpu).to_dict()
    errors = bool(st.session_state.get("option_errors") or st.session_state.get("start_refused"))
    with st.expander("Run options", expanded=expanded or errors, icon=":material/tune:"), \
            st.form("run_options", border=False):
        layout = _layout()
        for column, names in zip(st.columns(len(layout)), layout):
            with column:
                for name in names:
                    _field(name, defaults[name])
        start, check, fits = st.columns([1, 2, 4])
        start.form_submit_button("Start", type="primary", on_click=_start, key="start")
        check.form_submit_button("Predict memory", on_click=_forecast, key="predict",
                                 help="what these options should need, from the model config "
                                      "alone (docs/PREDICTION.md); starts nothing")
        fits.form_submit_button("What fits?", on_click=_what_fits, key="what_fits",
                                help="the largest batch size predicted to fit this device, the "
                                     "other options as they are; starts nothing")
    forecast = st.session_state.get("forecast")
    if forecast is not None and forecast.line:
        st.info(_sentence(forecast.line), icon=":material/memory:")
    if forecast is not None and forecast.warning:
        st.warning(_sentence(forecast.warning))
    refused = st.session_state.get("start_refused")
    if refused:
        st.error(f"Not started: {refused}.")
    elif st.session_state.get("option_errors"):
        st.error("Not started: fix the fields marked above.")


def _phase_metrics(rep: RunReport) -> None:
    for column, metric in zip(st.columns(4), session.phase_metrics(rep)):
        label = metric.name + (" (now)" if metric.state == "open" else "")
        value = "—" if metric.memory_mb is None else f"{metric.memory_mb} MB"
        delta = None if metric.delta_mb is None else f"{metric.delta_mb:+d} MB"
        column.metric(label, value, delta, delta_color="off", border=metric.state == "open")


def _progress(rep: RunReport) -> None:
    done = session.progress(rep, common.store().last_step(rep.id))
    if session.stage(rep) == "phase training":
        left = ("time left: measuring…" if done.seconds_left is None
                else f"time left: {done.seconds_left:.0f} s")
        text = f"training: step {done.step} / {done.total} · {left}"
    else:
        text = session.stage(rep)
    st.progress(done.fraction, text=text)


@st.fragment(run_every=REFRESH_SECONDS)
def live_view(run_id: int) -> None:
    """Redrawn every REFRESH_SECONDS from the store alone; when the run ends, the whole page reruns
    into the finished view, which does not refresh."""
    db = common.store()
    rep = report(db, run_id)
    if rep.status != "running":
        st.rerun(scope="app")
    st.subheader(rep.title())
    _phase_metrics(rep)
    progress, stop = st.columns([6, 1], vertical_alignment="bottom")
    with progress:
        _progress(rep)
    manager = common.manager()
    if manager.is_active(run_id):
        if stop.button("Stop", key="stop", icon=":material/stop:", width="stretch"):
            with st.spinner("stopping the training process…"):
                manager.stop(run_id)
            st.rerun(scope="app")
    else:
        progress.caption("Started by another process (the CLI): stop it there.")
    common.memory_chart(rep, db.last_time(run_id))


def finished_view(run_id: int) -> None:
    rep = report(common.store(), run_id)
    st.subheader(rep.title())
    _phase_metrics(rep)
    common.outcome(rep)
    common.memory_chart(rep)
    st.page_link(common.RUNS_PAGE, label=f"Run {run_id} on the Runs page",
                 query_params={"run": str(run_id)}, icon=":material/table_rows:")


def main() -> None:
    st.title("Live run")
    st.caption("The four moments of Hugging Face's *Model training anatomy*: baseline, CUDA kernels, "
               "weights, training. Start a run and watch each one appear.")
    asked = st.query_params.get("run")
    if asked and asked.isdigit() and common.store().run(int(asked)) is not None:
        st.session_state["live_run"] = int(asked)  # ?run=ID: this page's view of a stored run
    run_id = st.session_state.get("live_run")
    if run_id is None or common.store().run(run_id) is None:
        running = live_run(common.store(), common.manager())
        run_id = running.id if running else None
        # This tab follows the run to its end, though it did not start it (a reload, another tab).
        st.session_state["live_run"] = run_id
    running = run_id is not None and common.store().run(run_id).status == "running"
    # The chart is what people came for: while a run is shown, the options fold away.
    options_form(common.device().has_gpu, expanded=run_id is None)
    if run_id is None:
        st.info("No run in progress. Start one above; stored runs are on the Runs page.")
    elif running:
        live_view(run_id)
    else:
        finished_view(run_id)


main()
