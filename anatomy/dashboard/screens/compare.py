"""Compare: stored runs side by side, sweeps of one or two options, and moving runs between
machines (export, import)."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from anatomy.analysis import transfer
from anatomy.analysis.compare import differing_options
from anatomy.analysis.options import FIELDS, InvalidOptions, Kind
from anatomy.analysis.report import PHASES, RunReport, report
from anatomy.analysis.sweeps import (
    LADDER,
    SweepGrid,
    grid,
    parse_value,
    parse_values,
    shown_value,
)
from anatomy.dashboard import server, widgets
from anatomy.engine.manager import DeviceBusy
from anatomy.units import in_mib
from anatomy.views import compare as view
from anatomy.views import export, text
from anatomy.views.figures import compare as figures
from anatomy.views.style import DIFFERS_BACKGROUND
from anatomy.vocabulary import Phase, Precision, Status, phase_name, phases_name

REFRESH_SECONDS = 1.0
# What a sweep may vary, and the values the form suggests for each.
VARIABLE = ("batch_size", "precision", "gradient_checkpointing", "grad_accum", "optim", "seq_len",
            "model")
SUGGESTED = {"batch_size": "1,2,4,8", "grad_accum": "1,2,4", "seq_len": "128,256,512"}


# --- choosing runs ---

def _labels(db) -> dict[int, str]:
    return {run.id: text.run_chip(run) for run in db.runs()}  # chips: the few words that fit


def _choose(ids: list[int]) -> None:
    """?runs=1,2 picks the runs (a shared URL, a sweep's "compare"); else the two latest. Ids that
    are not stored are said; the URL is rewritten to name the runs shown."""
    asked = st.query_params.get("runs")
    if asked is not None and asked != ",".join(map(str, st.session_state.get("compare_runs", []))):
        wanted = [i for i in view.parse_ids(asked) if i in ids]
        if wanted:
            st.session_state["compare_runs"] = wanted
        missing = [w.strip() for w in asked.split(",")
                   if w.strip() and text.run_id(w) not in ids]
        if missing:
            st.warning(view.missing_runs(missing), icon=":material/search_off:")
    chosen = [i for i in st.session_state.get("compare_runs", []) if i in ids]
    st.session_state["compare_runs"] = chosen if chosen or "compare_runs" in st.session_state \
        else ids[:2]
    _to_url()


def _to_url() -> None:
    st.query_params["runs"] = ",".join(map(str, st.session_state["compare_runs"]))


def _show_runs(run_ids: list[int]) -> None:
    st.session_state["compare_runs"] = list(run_ids)
    st.query_params["runs"] = ",".join(map(str, run_ids))


# --- the comparison ---

def _styled(rows: list[dict]) -> pd.io.formats.style.Styler:
    table = pd.DataFrame(rows).set_index("what")
    return table.style.apply(
        lambda row: [f"background-color: {DIFFERS_BACKGROUND}" if row[""] == view.DIFFERS
                     else ""] * len(row), axis=1)


def _export(reports: list[RunReport], overlay) -> None:
    db = server.store()
    ids = [r.id for r in reports]
    name = "runs-" + "-".join(map(str, ids))
    st.markdown("**Take these runs elsewhere**")
    # In a row that wraps: at 1,000 px four columns cut their labels.
    with st.container(horizontal=True):
        st.download_button(
            "This comparison (HTML)", key="download_comparison", on_click="ignore",
            data=lambda: export.figure_html(overlay, "Memory over time, aligned: runs " + ", ".join(
                map(str, ids))),
            file_name=f"anatomy-compare-{name}.html", mime="text/html", icon=":material/download:",
            help="the overlaid curves as a standalone page (plotly inside it: opens offline)")
        st.download_button(
            "Each run's chart (HTML)", key="download_html", on_click="ignore",
            data=lambda: export.runs_html(db, ids), file_name=f"anatomy-{name}.html",
            mime="text/html", icon=":material/download:",
            help="every chosen run's memory chart, as the dashboard draws it, on one standalone page")
        st.download_button(
            "Runs (JSON)", key="download_json", on_click="ignore",
            data=lambda: json.dumps(transfer.export_runs(db, ids)), file_name=f"anatomy-{name}.json",
            mime="application/json", icon=":material/download:",
            help="every recorded row of the runs, with a schema version: Import reads it back")
        st.download_button(
            "Samples (CSV)", key="download_csv", on_click="ignore",
            data=lambda: transfer.samples_csv(db, ids), file_name=f"anatomy-{name}-samples.csv",
            mime="text/csv", icon=":material/download:")


def comparison(run_ids: list[int]) -> None:
    db = server.store()
    reports = [report(db, run_id) for run_id in run_ids]
    left, right = st.columns(2, vertical_alignment="bottom")

    def named(phase: Phase) -> str:
        return phases_name(phase, (r.on_gpu for r in reports))

    phase = left.selectbox("Align the curves where this phase begins", PHASES, format_func=named,
                           index=PHASES.index(Phase.TRAINING), key="compare_phase")
    reference = right.selectbox("Reference run (differences are to this run)", run_ids,
                                format_func=lambda i: f"Run {i}", key="compare_reference")
    # A line of its own: in a third of the width its second choice was cut at 1,000 px.
    span = st.segmented_control("Show", ["whole runs", "training only"], default="whole runs",
                                required=True, key="compare_span",
                                help="training only: the x axis holds the training phases "
                                     "(zoom out with a double click)")
    training_only = span == "training only"
    samples = {r.id: db.decimated(r.id, gpu=r.gpu) for r in reports}  # the training GPU's
    labels = view.run_labels(reports)  # each run by exactly what differs

    st.subheader("Memory over time, aligned")
    overlay = figures.overlay_figure(reports, samples, phase, labels, training_only)
    widgets.chart(overlay, "compare_overlay")
    missing = view.not_drawn(reports, phase)
    if missing:
        st.warning(missing)
    st.caption(f"Time 0 is where each run's {named(phase)} phase began; a marker is the memory at a "
               "phase's end, in that phase's colour. Backends: " + ", ".join(
                   sorted({r.backend for r in reports})) + ".")
    widgets.chart(figures.small_multiples_figure(reports, samples, phase, labels,
                                                 training_only), "compare_multiples")

    st.subheader("Loss and time a step")
    steps = {r.id: db.steps(r.id) for r in reports}
    if any(steps.values()):
        widgets.chart(figures.steps_overlay_figure(reports, steps, labels), "compare_steps")
        st.caption(view.steps_caption(reports))
    else:
        st.caption("No training step recorded in these runs.")

    st.subheader("What each phase added")
    widgets.chart(figures.memory_bars_figure(reports, labels), "compare_bars")
    kernel = (f"CUDA context = {phase_name(Phase.KERNEL, True)} phase − baseline"
              if any(r.on_gpu for r in reports) else
              f"{phase_name(Phase.KERNEL, False)} = the phase that loaded it − baseline")
    st.caption("Before the run = the baseline phase's end (what the device held before the run "
               f"loaded anything), {kernel}, weights = weights phase − the one before, "
               "training = training end − weights phase. Runs with measured components split the "
               "training increase into what the allocator's peak holds: the optimizer states, the "
               "larger of activations and gradients (the two are never all there at once), "
               "temporary buffers and the allocator's cache; the rest is outside PyTorch's "
               "allocator. Hover a part for how it was computed. The diamond is the run's peak, "
               "on the bars' scale: a bar's top is its training's end."
               + "".join(f" {note}" for note in view.bars_notes(reports)))

    st.subheader("Side by side")
    differing = differing_options(reports)
    if differing:
        st.markdown("Options that differ (≠, highlighted): **" + ", ".join(
            FIELDS[name].label for name in differing) + "**")
    else:
        st.markdown("The runs have the same options.")
    widgets.table(_styled(view.side_by_side(reports)), key="compare_table", height="content",
                 column_config={"": st.column_config.Column(width=30)})
    if paths := view.datasets_line(reports):
        st.caption(text.literal(paths))
    st.markdown(f"**Difference to run {reference}**")
    widgets.table(pd.DataFrame(view.differences(reports, reference)).set_index("what"),
                 key="compare_differences", height="content")
    _export(reports, overlay)


# --- sweeps ---

def _vary_values(name: str, has_gpu: bool) -> list:
    field = FIELDS[name]
    key = f"sweep_values_{name}"
    if field.choices is not None or field.kind == Kind.FLAG:
        choices = field.choices or ("off", "on")
        default = [c for c in choices if has_gpu or c != Precision.FP16]
        chosen = st.multiselect(f"{field.label}: values", choices, default=default, key=key)
        return [parse_value(name, c) for c in chosen]
    text = st.text_input(f"{field.label}: values", SUGGESTED.get(name, ""), key=key,
                         help="comma-separated, e.g. 1,2,4,8")
    return parse_values(name, text) if text.strip() else []


def _sweep_form() -> None:
    info = server.device()
    has_gpu = info.has_gpu
    defaults = widgets.live_options(has_gpu)  # the Live form's model and options, where it has any
    slot = server.sweeps()
    with st.expander("Base configuration", icon=":material/tune:"):
        model = st.session_state.get("sweep_option_model", defaults.model)
        names = [name for name in FIELDS if widgets.offered(name, model)]
        for column, chunk in zip(st.columns(3), (names[0::3], names[1::3], names[2::3])):
            with column:
                for name in chunk:
                    widgets.option_widget(name, getattr(defaults, name), f"sweep_option_{name}")
    varied = st.multiselect("Vary (one or two options)", VARIABLE, default=["batch_size"],
                            max_selections=2, format_func=lambda n: FIELDS[n].label,
                            key="sweep_vary")
    vary, errors = {}, []
    for name in varied:
        try:
            vary[name] = _vary_values(name, has_gpu)
        except ValueError as error:  # said with the option's flag ("batch-size: …"): its label
            errors.append(f"{FIELDS[name].label}: "
                          + str(error).removeprefix(f"{name.replace('_', '-')}: "))
    until_oom = st.checkbox("Keep doubling the batch size until a run is out of memory",
                            key="sweep_until_oom", disabled=LADDER not in varied,
                            help="batch sizes run smallest first; at a batch size's first "
                                 "out-of-memory run the larger ones are skipped" + (
                                     "" if has_gpu else ". Without a GPU, out of memory is this "
                                     "machine's RAM full"))
    if until_oom and not has_gpu and LADDER in varied:
        st.warning(f"Without a GPU, out of memory means this machine's {info.ram_total / 2**30:.1f}"
                   " GiB of RAM full: each doubling takes more of it, the last run until the "
                   "kernel ends it, and every program on the machine slows or is ended meanwhile.",
                   icon=":material/warning:")
    busy = slot.running()
    if st.button("Start the sweep", key="sweep_start", type="primary", disabled=busy,
                 icon=":material/play_arrow:", help="a sweep is running" if busy else None):
        base = {name: st.session_state[f"sweep_option_{name}"] for name in names}
        base.update({name: getattr(defaults, name) for name in FIELDS if name not in names})
        if not errors:
            try:
                st.session_state["sweep_shown"] = slot.start(base, vary,
                                                             until_oom and LADDER in vary)
            except InvalidOptions as error:
                errors.extend(text.form_error(name, message, under_field=False)
                              for name, message in error.errors.items())
            except DeviceBusy as error:
                errors.append(str(error))
        st.session_state["sweep_errors"] = errors
        if not errors:
            st.rerun()
    for message in st.session_state.get("sweep_errors", []):
        st.error(message)


@st.fragment(run_every=REFRESH_SECONDS)
def sweep_progress(sweep_id: int) -> None:
    """Read from the store every second; when the sweep ends, the page reruns into its grid."""
    result = grid(server.store(), sweep_id)
    if result.status != Status.RUNNING:
        st.rerun(scope="app")
    finished = sum(r.status != Status.RUNNING for r in result.runs)
    total = max(result.planned - result.skipped, len(result.runs))
    current = next((r for r in result.runs if r.status == Status.RUNNING), None)
    text = f"{finished} of {total} runs done"
    if current:
        text += " · now run {}: {}".format(current.run, ", ".join(
            f"{FIELDS[k].label.lower()} {v}" for k, v in current.values.items()))
    if result.until_oom:
        text += " · doubling until out of memory"
    progress, stop = st.columns([6, 1], vertical_alignment="bottom")
    progress.progress(min(1.0, finished / total) if total else 0.0, text=text)
    if stop.button("Stop", key="sweep_stop", icon=":material/stop:", width="stretch",
                   help="stops the current run and drops the rest"):
        with st.spinner("stopping the current run…"):
            server.sweeps().stop()
        st.rerun(scope="app")
    _sweep_table(result)


def _sweep_table(result: SweepGrid) -> None:
    names = list(result.vary)
    widgets.table([{"Run": r.run, **{FIELDS[n].label: shown_value(n, r.values[n]) for n in names},
                   "Status": r.status, in_mib("Peak"): r.peak_mb,
                   "Samples/second": r.samples_per_second, "Time (s)": r.time_s}
                  for r in result.runs], hide_index=True, key=f"sweep_runs_{result.sweep}",
                 column_config={"Samples/second": st.column_config.NumberColumn(format="%.2f"),
                                "Time (s)": st.column_config.NumberColumn(format="%.2f")})


def sweep_results(sweep_id: int) -> None:
    result = grid(server.store(), sweep_id)
    status = result.status
    runs = len(result.runs)
    line = (f"Sweep {sweep_id} ({result.name}): {status}, {runs} run{'' if runs == 1 else 's'}"
            + (f", {result.skipped} skipped after an out-of-memory run" if result.skipped
               else ""))
    {Status.COMPLETED: st.success, Status.STOPPED: st.warning}.get(status, st.error)(line)
    if result.error:
        st.code(result.error, language=None, wrap_lines=True)
    line = view.largest_fitting(result)
    if line:
        st.markdown(line)
    if result.runs and result.vary:  # a plan that cannot be read (a damaged row) draws no grid
        widgets.chart(figures.sweep_figure(result, "peak_mb"), "sweep_peak")
        widgets.chart(figures.sweep_figure(result, "samples_per_second"), "sweep_speed")
    if result.runs:
        _sweep_table(result)
        ids = [r.run for r in result.runs]
        st.button("Compare these runs", key="sweep_compare", on_click=_show_runs, args=(ids,),
                  icon=":material/compare_arrows:",
                  help="puts them in the runs chosen above, in the Compare runs tab")


def sweeps_section() -> None:
    st.caption("One base configuration, one or two options varied; the runs queue and run one "
               "after another, each stored as a normal run tagged with its sweep.")
    slot = server.sweeps()
    if not server.read_only():  # a read-only dashboard starts no sweep
        _sweep_form()
    running = slot.running_id()
    if running is not None:
        st.subheader(f"Sweep {running} running")
        sweep_progress(running)
        return
    stored = server.store().sweeps()
    if not stored:
        return
    ids = [s.id for s in stored]
    if st.session_state.get("sweep_shown") not in ids:
        st.session_state["sweep_shown"] = ids[0]
    names = {s.id: f"{s.id}: {s.name} — {s.status}" for s in stored}
    chosen = st.selectbox("Sweep", ids, format_func=names.get, key="sweep_shown")
    sweep_results(chosen)


# --- import ---

def import_section() -> None:
    st.caption("A JSON file exported here or with `python -m anatomy export RUN_ID … --format "
               "json`, from this machine or another. The file is checked whole first: a wrong, "
               "truncated or foreign file is refused and nothing of it is stored.")
    upload = st.file_uploader("Import runs (JSON)", type=["json"], key="import_file")
    copy = st.checkbox("Import runs that are here already again, as copies", key="import_copy",
                       help="each imported run records where it came from, so the same file "
                            "imported twice is noticed; tick this to add them once more")
    done = st.session_state.setdefault("imported_files", {})
    if upload is None:
        return
    key = (upload.file_id, copy)  # ticking "as copies" after a refusal imports the file then
    if key not in done:
        try:
            done[key] = ("imported", transfer.import_runs(server.store(), upload.getvalue(),
                                                          copy=copy))
        except transfer.AlreadyImported as error:
            done[key] = ("here already", str(error))
        except transfer.ImportRefused as error:
            done[key] = ("refused", str(error))
    outcome, detail = done[key]
    if outcome == "here already":
        st.warning(f"Not imported: {detail}. Nothing was stored; tick “as copies” to import them "
                   "again.")
        return
    if outcome == "refused":
        st.error(f"Not imported: {detail}. Nothing was stored.")
        return
    runs = ", ".join(map(str, detail))
    st.success(f"Imported {upload.name}: run{'s' if len(detail) > 1 else ''} {runs}.")
    st.button("Compare them", key="import_compare", on_click=_show_runs, args=(detail,),
              disabled=len(detail) < 2, icon=":material/compare_arrows:",
              help="puts them in the runs chosen in the Compare runs tab")


def main() -> None:
    st.title("Compare")
    db = server.store()
    labels = _labels(db)
    runs_tab, sweep_tab, import_tab = st.tabs(["Compare runs", "Sweep", "Import"])
    with import_tab:
        import_section()
        labels = _labels(db)  # with what was just imported
    with runs_tab:
        if len(labels) < 2:
            st.info("Comparing needs two stored runs: start them on the Live run page, run a "
                    "sweep, or import some.")
        else:
            ids = list(labels)
            _choose(ids)
            chosen = st.multiselect("Runs", ids, format_func=labels.get, key="compare_runs",
                                    on_change=_to_url, placeholder="choose two or more runs")
            if len(chosen) < 2:
                st.info("Choose two or more runs to compare.")
            else:
                comparison(chosen)
    with sweep_tab:
        sweeps_section()


main()
