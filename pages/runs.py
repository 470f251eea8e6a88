"""Runs: every stored run as a table; one run's chart and summary; deleting a run."""

from __future__ import annotations

import streamlit as st

from anatomy.cli import run_rows
from anatomy.store import report
from pages import common

COLUMNS = {  # run_rows() key: the table's heading
    "id": "Run", "created": "Time", "preset": "Preset", "batch_size": "Batch",
    "seq_len": "Seq len", "precision": "Precision", "gradient_checkpointing": "Checkpointing",
    "grad_accum": "Accum", "optim": "Optimizer", "status": "Status", "peak_mb": "Peak MB",
    "time_s": "Time (s)", "samples_per_second": "Samples/second",
}


def runs_table(rows: list[dict]) -> None:
    st.dataframe([{heading: row[key] for key, heading in COLUMNS.items()} for row in rows],
                 hide_index=True, key="runs_table",
                 column_config={"Time (s)": st.column_config.NumberColumn(format="%.2f"),
                                "Samples/second": st.column_config.NumberColumn(format="%.2f"),
                                "Run": st.column_config.NumberColumn(format="%d")})


def _choose(ids: list[int]) -> None:
    """?run=ID picks the run (a link from the Live page, or a shared URL); else the latest."""
    wanted = st.query_params.get("run")
    if wanted and wanted.isdigit() and int(wanted) in ids:
        st.session_state["runs_select"] = int(wanted)
    if st.session_state.get("runs_select") not in ids:
        st.session_state["runs_select"] = ids[0]


def _to_url() -> None:
    st.query_params["run"] = str(st.session_state["runs_select"])


def _delete_controls(rep: dict) -> None:
    run_id = rep["id"]
    manager = common.manager()
    if st.session_state.get("confirm_delete") == run_id:
        st.warning(f"Delete run {run_id} and its {rep['samples']} samples? This cannot be undone.")
        yes, no = st.columns([1, 6])
        if yes.button("Yes, delete", key="delete_yes", type="primary"):
            common.store().delete_run(run_id)
            st.session_state.pop("confirm_delete")
            st.session_state.pop("runs_select", None)
            st.query_params.pop("run", None)
            st.toast(f"Run {run_id} deleted")
            st.rerun()
        if no.button("Cancel", key="delete_no"):
            st.session_state.pop("confirm_delete")
            st.rerun()
    elif st.button(f"Delete run {run_id}…", key="delete", icon=":material/delete:",
                   disabled=manager.is_active(run_id),
                   help="a run in progress cannot be deleted: stop it first"
                   if manager.is_active(run_id) else None):
        st.session_state["confirm_delete"] = run_id
        st.rerun()


def main() -> None:
    st.title("Runs")
    db = common.store()
    rows = run_rows(db)
    if not rows:
        st.info("No runs stored yet: start one on the Live run page, or with `python -m anatomy run`.")
        return
    runs_table(rows)

    ids = [row["id"] for row in rows]
    labels = {row["id"]: f"{row['id']}: {row['preset']}, batch {row['batch_size']}, "
                         f"{row['precision']} — {row['status']} ({row['created']})" for row in rows}
    _choose(ids)
    run_id = st.selectbox("Run", ids, format_func=labels.get, key="runs_select", on_change=_to_url)

    rep = report(db, run_id)
    st.subheader(common.run_title(rep))
    if rep["status"] == "running":
        st.info("In progress: the Live run page shows it as it happens.")
    else:
        common.outcome(rep)
    common.memory_chart(rep)
    with st.expander("Options and environment"):
        st.json({"options": rep["options"], "environment": rep["environment"],
                 "phases": rep["phases"], "samples": rep["samples"],
                 "samples_sent": rep["samples_sent"], "steps": rep["steps"]}, expanded=False)
    _delete_controls(rep)


main()
