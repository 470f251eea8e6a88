"""Runs as standalone HTML pages: each run's memory chart as the dashboard draws it."""

from __future__ import annotations

import html

from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.views import figures


def runs_html(store: Store, run_ids: list[int]) -> str:
    """Each run's memory chart, as the dashboard draws it, on one standalone page (plotly.js is
    inside it, so it opens offline)."""
    reports = []
    for run_id in run_ids:
        rep = report(store, run_id)
        if rep is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        reports.append(rep)
    charts = []
    for index, rep in enumerate(reports):
        figure = figures.memory_figure(rep, store.decimated(rep.id), store.steps(rep.id))
        o = rep.options
        figure.update_layout(title={"text": html.escape(
            f"Run {rep.id}{': ' + rep.name if rep.name else ''} — {rep.preset}, "
            f"batch size {o.batch_size}, seq len {o.seq_len}, {o.precision}, "
            f"{rep.status}, peak {rep.summary.peak_mb} MB")})
        charts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    title = html.escape("anatomy: runs " + ", ".join(str(r.id) for r in reports))
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body>\n{''.join(charts)}\n</body></html>\n")
