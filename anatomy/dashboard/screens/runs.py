"""Runs: every stored run as a table (device and key numbers first; sort, select, compare),
filtered by tag, preset and status; peak memory against speed over the runs; one run's charts
and summary; naming, tagging and deleting a run."""

from __future__ import annotations

import json

import streamlit as st

from anatomy.analysis import transfer
from anatomy.analysis.report import RunListing, RunReport, report, run_rows
from anatomy.dashboard import links, server, widgets
from anatomy.views import export, text
from anatomy.views import runs as view
from anatomy.views.figures import runs as figures
from anatomy.vocabulary import Status

ANY = "any"
RUN_CHOICE = "runs_select"  # the chooser of the run shown


def runs_table(rows: list[RunListing]) -> list[int]:
    """The table (click a heading to sort); the ids of the rows selected in it."""
    table = view.table(rows)
    event = widgets.table(
        table, fit=view.by_use(table), always=view.ALWAYS, widest=view.WIDEST,
        hide_index=True, key="runs_table", on_select="rerun", selection_mode="multi-row",
        column_config={"Time (s)": st.column_config.NumberColumn(format="%.2f"),
                       "Samples/s": st.column_config.NumberColumn(format="%.2f"),
                       view.PEAK: st.column_config.NumberColumn(format="%d"),
                       "Run": st.column_config.NumberColumn(format="%d")})
    return [rows[i].id for i in event.selection.rows]


def _selected(ids: list[int]) -> None:
    """One row newly selected: it becomes the run shown below. Two or more: Compare selected."""
    if ids != st.session_state.get("runs_selected"):
        st.session_state["runs_selected"] = ids
        if len(ids) == 1:
            st.query_params["run"] = str(ids[0])
    with st.container(horizontal=True, vertical_alignment="center"):
        if st.button("Compare selected", key="compare_selected", icon=":material/compare_arrows:",
                     disabled=len(ids) < 2, help="select two or more rows of the table"):
            st.switch_page(links.COMPARE_PAGE, query_params={"runs": ",".join(map(str, ids))})
        st.caption(f"{len(ids)} selected" if ids else
                   "Select rows (the boxes at their left) to compare them; one row shows it "
                   "below.")


def _filters(db) -> dict:
    """Tag, preset and status to narrow the list to ("any": not narrowed), from what is stored."""
    runs = db.runs()
    choices = {"tag": sorted({tag for run in runs for tag in run.tags}),
               "preset": sorted({run.preset for run in runs}),
               "status": sorted({run.status for run in runs})}
    chosen = {}
    for column, (name, values) in zip(st.columns(3), choices.items()):
        value = column.selectbox(name.capitalize(), [ANY, *values], key=f"runs_filter_{name}")
        chosen[name] = None if value == ANY else value
    return chosen


def _save_labels(run_id: int) -> None:
    db = server.store()
    name = st.session_state[f"run_name_{run_id}"].strip()
    try:
        if not db.rename_run(run_id, name or None):  # deleted meanwhile (another tab, the CLI)
            st.toast(f"Run {run_id} is not stored any more: nothing was saved",
                     icon=":material/search_off:")
            return
        db.set_tags(run_id, st.session_state[f"run_tags_{run_id}"].split(","))
    except ValueError as error:  # a name or tag that is not one line of printable text
        st.toast(f"Not saved: {error}", icon=":material/error:")
        return
    st.toast(f"Run {run_id} saved")
    # The run chosen again, by its id: the chooser's browser side still held the label of the
    # name before, which matched no run on the next click, and the newest run was shown instead.
    st.session_state[RUN_CHOICE] = run_id


def _label_controls(rep: RunReport) -> None:
    run_id = rep.id
    with st.form(f"run_labels_{run_id}", border=False):
        name, tags, save = st.columns([3, 3, 2], vertical_alignment="bottom")
        name.text_input("Name", rep.name or "", key=f"run_name_{run_id}",
                        placeholder="a name for this run")
        tags.text_input("Tags", ", ".join(rep.tags), key=f"run_tags_{run_id}",
                        placeholder="comma-separated, e.g. baseline, h200")
        save.form_submit_button("Save", on_click=_save_labels, args=(run_id,),
                                icon=":material/label:")


def _downloads(run_id: int) -> None:
    """The run's chart as a standalone page, and the run as an export file (made on the click)."""
    db = server.store()
    chart, run_file = st.columns(2)
    chart.download_button(
        "Chart (HTML)", key="download_chart", on_click="ignore", icon=":material/download:",
        data=lambda: export.runs_html(db, [run_id]), file_name=f"anatomy-run-{run_id}.html",
        mime="text/html", help="this chart on a standalone page: plotly is inside it, it opens "
                               "offline")
    run_file.download_button(
        "Run (JSON)", key="download_run", on_click="ignore", icon=":material/download:",
        data=lambda: json.dumps(transfer.export_runs(db, [run_id])),
        file_name=f"anatomy-run-{run_id}.json", mime="application/json",
        help="every recorded row of the run: the Compare page's Import, or `python -m anatomy "
             "import`, reads it back on another machine")


def _delete_controls(rep: RunReport) -> None:
    run_id = rep.id
    # In progress here or in another process (`anatomy run`, a script, watch: its recorder
    # lives): deleting it would pull the rows from under the recording.
    recording = server.manager().is_active(run_id) or rep.status == Status.RUNNING
    if st.session_state.get("confirm_delete") == run_id and not recording:
        st.warning(f"Delete run {run_id} and its {rep.samples} samples? This cannot be undone.")
        with st.container(horizontal=True):
            # Red (widgets.STYLE), not the green of Start: this one cannot be undone.
            confirmed = st.button("Yes, delete", key="delete_yes",
                                  icon=":material/delete_forever:")
            cancelled = st.button("Cancel", key="delete_no")
        if confirmed:
            server.store().delete_run(run_id)
            st.session_state.pop("confirm_delete")
            st.session_state.pop("runs_select", None)
            st.query_params.pop("run", None)
            st.toast(f"Run {run_id} deleted")
            st.rerun()
        if cancelled:
            st.session_state.pop("confirm_delete")
            st.rerun()
    elif st.button(f"Delete run {run_id}…", key="delete", icon=":material/delete:",
                   disabled=recording,
                   help="a run in progress cannot be deleted: stop it first (or wait for "
                        "its end)" if recording else None):
        st.session_state["confirm_delete"] = run_id
        st.rerun()


def main() -> None:
    st.title("Runs")
    db = server.store()
    if not db.runs():
        st.info("No runs stored yet: start one on the Live run page, or with `python -m anatomy run`.")
        return
    filters = _filters(db)
    rows = run_rows(db, **filters)
    if not rows:
        st.info("No stored run matches these filters.")
        return
    _selected(runs_table(rows))
    with st.expander("Peak memory against speed", icon=":material/scatter_plot:",
                     expanded=len(rows) > 2):
        if not view.plotted(rows):  # no point to draw: an empty pair of axes says nothing
            st.info(view.NOTHING_PLOTTED)
        else:
            widgets.chart(figures.efficiency_figure(rows), "runs_efficiency")
            st.caption("A point per completed run of the list above: colour for the precision, "
                       "shape for the device, its batch size beside it. Down and to the right is "
                       "more samples a second for less memory.")

    ids = [row.id for row in rows]
    labels = {run.id: text.run_choice(run) for run in db.find_runs(**filters)}
    links.choose_run_from_url(ids, RUN_CHOICE)
    run_id = st.selectbox("Run", ids, format_func=labels.get, key=RUN_CHOICE,
                          on_change=links.run_to_url, args=(RUN_CHOICE,))

    rep = report(db, run_id)
    st.subheader(text.literal(rep.title()))
    if rep.status == Status.RUNNING:
        st.info("In progress: the Live run page shows it as it happens.")
    else:
        widgets.outcome(rep)
    widgets.run_charts(rep, "runs")
    _downloads(rep.id)
    if not server.read_only():  # a read-only dashboard labels nothing
        _label_controls(rep)
    with st.expander("Options and environment"):
        shown = rep.to_dict()
        st.json({key: shown[key] for key in ("options", "environment", "phases", "samples",
                                             "samples_sent", "steps")}, expanded=False)
    if not server.read_only():  # nor deletes
        _delete_controls(rep)


main()
