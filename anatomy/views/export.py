"""Runs as standalone HTML pages: each run's memory chart as the dashboard draws it."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from anatomy.analysis.report import reports
from anatomy.store import Store
from anatomy.views.figures.gpus import buckets, memory_chart
from anatomy.views.live import status_line

# In the dashboard Streamlit's theme makes room for the axes' tick labels; a standalone page
# has plotly's defaults alone: room for the title above and the ticks beside, made here.
STANDALONE_MARGIN = {"l": 80, "r": 30, "t": 90, "b": 70}


def standalone(figure: go.Figure, title: str | None = None) -> go.Figure:
    """`figure` fitted for a page of its own: margins that hold its title and tick labels."""
    figure.update_layout(margin=STANDALONE_MARGIN, font={"family": "sans-serif"})
    figure.update_xaxes(automargin=True)
    figure.update_yaxes(automargin=True)
    if title is not None:
        figure.update_layout(title={"text": title, "x": 0, "xref": "paper", "y": 0.98,
                                    "yanchor": "top", "font": {"size": 15}})
    return figure


def figure_html(figure: go.Figure, title: str | None = None) -> str:
    """One figure as a standalone page (plotly.js inside it: it opens offline)."""
    return standalone(figure, title).to_html(include_plotlyjs=True, full_html=True)


def runs_html(store: Store, run_ids: list[int]) -> str:
    """Each run's memory chart, as the dashboard draws it, on one standalone page (plotly.js is
    inside it, so it opens offline)."""
    with store.snapshot():  # one moment's rows: a delete under way cuts none
        runs = reports(store, run_ids)
        read = [(store.decimated(rep.id, buckets(rep, 2000)), store.steps(rep.id))
                for rep in runs]
    charts = []
    for index, (rep, (samples, steps)) in enumerate(zip(runs, read)):
        figure = memory_chart(rep, samples, steps)
        standalone(figure, html.escape(f"{rep.title()}, {status_line(rep)}"))
        figure.update_layout(height=520)
        charts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    title = html.escape("anatomy: runs " + ", ".join(str(r.id) for r in runs))
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body>\n{''.join(charts)}\n</body></html>\n")
