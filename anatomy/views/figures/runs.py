"""The Runs page's figure: peak memory against speed, a point per completed run."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from anatomy.analysis.report import RunListing
from anatomy.views.style import PRECISION_COLOURS, TOTAL_COLOUR

DEVICE_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x")


def efficiency_figure(rows: Sequence[RunListing]) -> go.Figure:
    """Peak memory against samples/second, a point per completed run: colour for the precision,
    shape for the device, the batch size written beside it. Up and to the left costs memory
    without speed; the frontier down and to the right is where to choose."""
    figure = go.Figure()
    done = [r for r in rows if r.peak_mb is not None and r.samples_per_second is not None]
    devices = list(dict.fromkeys(r.device for r in done))
    for (precision, device), group in _grouped(done):
        figure.add_trace(go.Scatter(
            x=[r.samples_per_second for r in group], y=[r.peak_mb for r in group],
            mode="markers+text", name=f"{precision} · {device}",
            text=[f"bs {r.batch_size}" for r in group], textposition="middle right",
            cliponaxis=False,
            marker={"size": 11, "color": PRECISION_COLOURS.get(precision, TOTAL_COLOUR),
                    "symbol": DEVICE_SYMBOLS[devices.index(device) % len(DEVICE_SYMBOLS)],
                    "line": {"width": 1, "color": "white"}},
            customdata=[[r.id, r.preset, r.seq_len, "on" if r.gradient_checkpointing else "off"]
                        for r in group],
            hovertemplate="run %{customdata[0]}: %{customdata[1]}, batch %{text}, seq "
                          "%{customdata[2]}, checkpointing %{customdata[3]}<br>%{x:.2f} "
                          "samples/s, peak %{y:,} MB<extra>%{fullData.name}</extra>"))
    peaks = [r.peak_mb for r in done]
    # A batch-size ladder spans two orders of magnitude: on a linear axis its small sizes merge.
    wide = bool(peaks) and max(peaks) > 10 * max(1, min(peaks))
    figure.update_layout(
        height=380, margin={"l": 10, "r": 10, "t": 30, "b": 10}, plot_bgcolor="white",
        xaxis={"title": {"text": "samples/second (the Trainer's)"}, "rangemode": "tozero",
               "automargin": True},
        yaxis={"title": {"text": "peak memory (MB)" + (", log scale" if wide else "")},
               "type": "log" if wide else "linear", "automargin": True},
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0}, hovermode="closest")
    return figure


def _grouped(rows: Sequence[RunListing]) -> list[tuple[tuple[str, str], list[RunListing]]]:
    groups: dict[tuple[str, str], list[RunListing]] = {}
    for row in rows:
        groups.setdefault((row.precision or "?", row.device), []).append(row)
    return list(groups.items())

