"""The Runs page's figure: peak memory against speed, a point per completed run."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from anatomy.analysis.report import RunListing
from anatomy.units import MIB_NAME, in_mib
from anatomy.views.figures.layout import ASSUMED_PLOT_PX, CHAR_PX, LABEL_ROW_PX
from anatomy.views.runs import plotted
from anatomy.views.style import PRECISION_COLOURS, TOTAL_COLOUR

DEVICE_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x")
HEIGHT_PX = 380
ASSUMED_PLOT_HEIGHT_PX = 260  # the figure's height less its title, axis and legend
MARKER_PX = 11


def efficiency_figure(rows: Sequence[RunListing]) -> go.Figure:
    """Peak memory against samples/second, a point per completed run: colour for the precision,
    shape for the device, the batch size written beside it. Up and to the left costs memory
    without speed; the frontier down and to the right is where to choose."""
    figure = go.Figure()
    done = plotted(rows)
    devices = list(dict.fromkeys(r.device for r in done))
    peaks = [r.peak_mb for r in done]
    # A batch-size ladder spans two orders of magnitude: on a linear axis its small sizes merge.
    wide = bool(peaks) and max(peaks) > 10 * max(1, min(peaks))
    labels = batch_labels(done, wide)
    for (precision, device), group in _grouped(done):
        figure.add_trace(go.Scatter(
            x=[r.samples_per_second for r in group], y=[r.peak_mb for r in group],
            mode="markers+text", name=f"{precision} · {device}",
            text=[labels[r.id][0] for r in group],
            textposition=[labels[r.id][1] for r in group], cliponaxis=False,
            marker={"size": MARKER_PX, "color": PRECISION_COLOURS.get(precision, TOTAL_COLOUR),
                    "symbol": DEVICE_SYMBOLS[devices.index(device) % len(DEVICE_SYMBOLS)],
                    "line": {"width": 1, "color": "white"}},
            customdata=[[r.id, r.preset, r.batch_size, r.seq_len,
                         "on" if r.gradient_checkpointing else "off"] for r in group],
            hovertemplate="run %{customdata[0]}: %{customdata[1]}, batch %{customdata[2]}, seq "
                          "%{customdata[3]}, checkpointing %{customdata[4]}<br>%{x:.2f} "
                          f"samples/s, peak %{{y:,}} {MIB_NAME}<extra>%{{fullData.name}}</extra>"))
    figure.update_layout(
        height=HEIGHT_PX, margin={"l": 10, "r": 10, "t": 30, "b": 10}, plot_bgcolor="white",
        xaxis={"title": {"text": "samples/second (the Trainer's)"}, "rangemode": "tozero",
               "automargin": True},
        yaxis={"title": {"text": in_mib("peak memory") + (", log scale" if wide else "")},
               "type": "log" if wide else "linear", "automargin": True},
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0}, hovermode="closest")
    return figure


def batch_labels(rows: Sequence[RunListing], log: bool) -> dict[int, tuple[str, str]]:
    """Each run's label ("bs 4") and its place beside the marker, so that no label covers another
    label or a marker (at the narrowest the chart is drawn): at the right, else at the left,
    above or below. A run whose marker covers one already labelled with the same words (two runs
    of one batch size at about the same speed and peak) gets none: the one label names both."""
    if not rows:
        return {}
    x_per_px = max(r.samples_per_second for r in rows) * 1.05 / ASSUMED_PLOT_PX
    peaks = [math.log10(max(r.peak_mb, 1)) if log else r.peak_mb for r in rows]
    y_per_px = ((max(peaks) - min(peaks)) * 1.1 or 1) / ASSUMED_PLOT_HEIGHT_PX
    half_x, half_y = MARKER_PX / 2 * x_per_px, MARKER_PX / 2 * y_per_px
    row_y = LABEL_ROW_PX / 2 * y_per_px
    # What is taken, as boxes (left, right, middle y, half height, text): every marker ("")
    # first, then each label where it is placed.
    taken = [(r.samples_per_second - half_x, r.samples_per_second + half_x, y, half_y, "")
             for r, y in zip(rows, peaks)]
    labels: dict[int, tuple[str, str]] = {}
    spots: list[tuple[float, float, str]] = []  # each label's point and words
    for row, y in zip(rows, peaks):
        text = f"bs {row.batch_size}" if row.batch_size is not None else ""
        x, width = row.samples_per_second, len(text) * CHAR_PX * x_per_px
        if any(abs(x - a) < 2 * half_x and abs(y - b) < 2 * half_y and words == text
               for a, b, words in spots):
            labels[row.id] = ("", "middle right")
            continue
        above = half_y + row_y
        places = {"middle right": (x + half_x, x + half_x + width, y),
                  "middle left": (x - half_x - width, x - half_x, y),
                  "top center": (x - width / 2, x + width / 2, y + above),
                  "bottom center": (x - width / 2, x + width / 2, y - above)}
        free = [name for name, (left, right, middle) in places.items()
                if not any(a < right and left < b and abs(middle - c) < h + row_y
                           for a, b, c, h, _ in taken)]
        chosen = free[0] if free else "middle right"
        labels[row.id] = (text, chosen)
        taken.append((*places[chosen], row_y, text))
        spots.append((x, y, text))
    return labels


def _grouped(rows: Sequence[RunListing]) -> list[tuple[tuple[str, str], list[RunListing]]]:
    groups: dict[tuple[str, str], list[RunListing]] = {}
    for row in rows:
        groups.setdefault((row.precision or "?", row.device), []).append(row)
    return list(groups.items())
