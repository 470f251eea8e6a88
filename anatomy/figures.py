"""Plotly figures of a run, built from store rows and `report()` dicts: no Streamlit, no browser.

The pages only pass these figures to `st.plotly_chart`; the tests read them as plain objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle

import numpy as np
import plotly.graph_objects as go

from anatomy import measurement
from anatomy.store import MIB

# The one place for phase colours (Okabe-Ito: told apart by colour-blind eyes too). Bands are drawn
# at BAND_OPACITY over a light background, so the dark curve and the labels stay readable on them.
PHASE_COLOURS = {
    "baseline": "#56B4E9",
    "kernel": "#CC79A7",
    "weights": "#E69F00",
    "training": "#009E73",
}
BAND_OPACITY = 0.22
CURVE_COLOUR = "#1B2A41"
OTHER_GPU_COLOURS = ("#7F8C9A", "#A3ACB9", "#5D6D7E", "#C0C7D0")
ALLOCATED_COLOUR = "#D55E00"
RESERVED_COLOUR = "#0072B2"
CEILING_COLOUR = "#8B0000"
CEILING_SHOWN_FROM = 0.25  # of the total: the ceiling is drawn once the curve comes this close
LABEL_ROW_PX = 18  # consecutive labels alternate rows: a short phase's label cannot hide the next


def phase_colour(name: str) -> str:
    return PHASE_COLOURS.get(name, "#BBBBBB")


def phase_bands(phases: Sequence[dict], now: float | None) -> list[dict]:
    """Where each phase's band lies: from the previous phase's end (0 for the first) to its own end,
    or to `now` while it lasts. The rise between two states (torch loading, the model loading) is
    therefore inside the band of the state it leads to."""
    bands = []
    previous_end = 0.0
    for phase in phases:
        end = phase["end_s"]
        if end is None:
            end = max(now if now is not None else phase["start_s"], phase["start_s"])
        bands.append({"name": phase["name"], "x0": previous_end, "x1": end,
                      "open": phase["end_s"] is None})
        previous_end = end
    return bands


def _column(rows: Sequence[dict], key: str, scale: float = 1.0) -> np.ndarray:
    # numpy arrays reach the browser as binary typed arrays, a far smaller message than JSON
    # numbers on every refresh. (Importing numpy here, with this module, also keeps two sessions
    # from racing to import it halfway inside plotly's serialiser.)
    return np.fromiter((r[key] for r in rows), dtype=float, count=len(rows)) / scale


def memory_figure(report: dict, samples: Sequence[dict], steps: Sequence[dict] = (),
                  now: float | None = None) -> go.Figure:
    """Memory over time for one run: a line per GPU, phase bands, the end-of-phase markers, the
    torch allocator's lines where the worker reported them, and the device's total as a ceiling.

    `samples` are store rows (`Store.decimated` keeps every peak); `now` is the time the open phase
    has reached (default: the last sample)."""
    backend = report["backend"]
    if now is None and samples:
        now = max(s["t"] for s in samples)
    figure = go.Figure()

    by_gpu: dict[int, list[dict]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["gpu"], []).append(sample)
    others = cycle(OTHER_GPU_COLOURS)
    for gpu, rows in sorted(by_gpu.items()):
        trains = gpu == report["gpu"]
        name = ("CPU RSS of the training process" if backend == "cpu-rss"
                else f"GPU {gpu}" + (" (training)" if trains and len(by_gpu) > 1 else ""))
        figure.add_trace(go.Scattergl(
            x=_column(rows, "t"), y=_column(rows, "used", MIB), name=name,
            mode="lines", line={"color": CURVE_COLOUR if trains else next(others),
                                "width": 2 if trains else 1.2},
            hovertemplate="%{x:.2f} s<br>%{y:.0f} MiB<extra>" + name + "</extra>"))

    allocator = [s for s in steps if s.get("allocated") is not None]
    for key, label, colour, dash in (("allocated", "torch allocated", ALLOCATED_COLOUR, "dot"),
                                     ("reserved", "torch reserved", RESERVED_COLOUR, "dash")):
        points = [s for s in allocator if s.get(key) is not None]
        if points:
            figure.add_trace(go.Scattergl(
                x=_column(points, "t"), y=_column(points, key, MIB), name=label,
                mode="lines", line={"color": colour, "width": 1.5, "dash": dash},
                hovertemplate="step %{customdata}<br>%{y:.0f} MiB<extra>" + label + "</extra>",
                customdata=[s["step"] for s in points]))

    totals = [s["total"] for s in by_gpu.get(report["gpu"], []) if s.get("total")]
    if totals and now is not None:
        total = totals[-1]
        peak = max(s["used"] for s in by_gpu[report["gpu"]])
        # A ceiling far above the curve would flatten it (an H200's 140 GiB over BERT's 8 GiB, a
        # machine's RAM over one process): then it waits in the legend, a click away.
        near = peak >= CEILING_SHOWN_FROM * total
        what = "RAM" if backend == "cpu-rss" else f"GPU {report['gpu']}"
        figure.add_trace(go.Scattergl(
            x=[0, now], y=[total / MIB] * 2, mode="lines",
            name=f"{what} total: {total / 2**30:.1f} GiB" + ("" if near else " (click to show)"),
            line={"color": CEILING_COLOUR, "width": 1, "dash": "dashdot"},
            visible=True if near else "legendonly", hoverinfo="name"))

    ended = [p for p in report["phases"] if p["end_s"] is not None and p["memory_mb"] is not None]
    if ended:
        figure.add_trace(go.Scatter(
            x=[p["end_s"] for p in ended], y=[p["memory_mb"] for p in ended],
            name="end of phase", mode="markers", cliponaxis=False,
            text=[f"{p['memory_mb']} MB" for p in ended],
            marker={"size": 10, "color": [phase_colour(p["name"]) for p in ended],
                    "line": {"width": 1.5, "color": CURVE_COLOUR}},
            hovertext=[f"{measurement.occupied_line(p['memory_bytes'], backend)} ({p['name']})"
                       for p in ended],
            hoverinfo="text"))
    for phase in ended:
        # A boxed label with an arrow: readable over a noisy curve and a coloured band alike.
        figure.add_annotation(name=f"end of {phase['name']}", x=phase["end_s"],
                              y=phase["memory_mb"], text=f"<b>{phase['memory_mb']} MB</b>",
                              showarrow=True, arrowhead=0, ax=-28, ay=-26,
                              bgcolor="rgba(255,255,255,0.85)", bordercolor=phase_colour(phase["name"]),
                              borderwidth=1.5, font={"color": CURVE_COLOUR, "size": 12})

    for row, band in enumerate(phase_bands(report["phases"], now)):
        colour = phase_colour(band["name"])
        figure.add_shape(type="rect", name=band["name"], xref="x", yref="paper",
                         x0=band["x0"], x1=band["x1"], y0=0, y1=1, layer="below",
                         fillcolor=colour, opacity=BAND_OPACITY, line={"width": 0})
        figure.add_annotation(name=band["name"], x=band["x0"], xref="x", y=1, yref="paper",
                              xanchor="left", yanchor="top", yshift=-LABEL_ROW_PX * (row % 2),
                              text=f"<b>{band['name']}</b>" + (" …" if band["open"] else ""),
                              showarrow=False, font={"color": CURVE_COLOUR, "size": 12},
                              bgcolor=colour)

    figure.update_layout(
        uirevision=f"run-{report['id']}",  # zoom and legend clicks survive each refresh
        height=440, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis={"title": {"text": "seconds since the run started"}, "rangemode": "tozero"},
        yaxis={"title": {"text": measurement.axis_title(backend)}, "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest", plot_bgcolor="white")
    return figure

