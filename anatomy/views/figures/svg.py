"""A chart of lines on one pair of axes as an SVG picture drawn on the server, from the Plotly
figure that the interactive chart draws: its lines, markers, bands, labels, axis titles and legend
are read from the figure, so the picture and the chart never say different things.

Why a picture: a browser tab compiles Streamlit's 4.7 MB Plotly chunk before its first chart
(2.2-3.3 s of CPU on the development machine, docs/BENCHMARKS.md); an SVG element costs a fraction
of that. It has no hover or zoom: the Live page draws it while a run trains (redrawn every second,
when zooming is barely possible anyway) and the interactive chart once the run has ended.
"""

from __future__ import annotations

import math
import re
from html import escape

import numpy as np
import plotly.graph_objects as go

from anatomy.views.figures.layout import CHAR_PX
from anatomy.views.style import CURVE_COLOUR

WIDTH_PX = 900  # the picture's own width; the page scales it to its column
FONT_PX = 12
TICK_FONT_PX = 11
# Room around the plot: the y tick labels and title at the left, the x ticks and title below.
LEFT_PX, RIGHT_PX, TOP_PX, BOTTOM_PX = 72, 16, 12, 44
LEGEND_ROW_PX = 20
LEGEND_SWATCH_PX = 24
X_TICKS, Y_TICKS = 8, 5  # about this many ticks an axis
GRID_COLOUR = "#E5E8EC"
AXIS_COLOUR = "#7F8C9A"
DASHES = {"dot": "2,3", "dash": "6,4", "dashdot": "6,3,2,3", "longdash": "10,4"}
FONT = "'Source Sans Pro', 'Source Sans 3', sans-serif"  # Streamlit's own


class Unsupported(ValueError):
    """A figure this renderer does not draw (several axes, a trace that is not a scatter)."""


def nice_ticks(low: float, high: float, count: int) -> list[float]:
    """About `count` round values (1, 2 or 5 times a power of ten apart) from `low` to `high`."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = min((m * power for m in (1, 2, 5, 10)), key=lambda s: abs(math.log(s / raw)))
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def tick_text(value: float, ticks: list[float]) -> str:
    """A tick's number with as many decimals as its step needs, thousands separated."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:,.{decimals}f}"


def decimated(x: np.ndarray, y: np.ndarray, low: float, high: float, columns: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """A line's points reduced to what `columns` pixel columns show: in each column its first,
    lowest, highest and last point, in time order (every peak and trough kept). Points outside
    [low, high] go, but for one each side, so that the line reaches the plot's edges."""
    keep = np.flatnonzero((x >= low) & (x <= high))
    if keep.size == 0:
        return x[:0], y[:0]
    first, last = max(keep[0] - 1, 0), min(keep[-1] + 1, len(x) - 1)
    x, y = x[first:last + 1], y[first:last + 1]
    if len(x) <= 4 * columns:
        return x, y
    column = np.clip(((x - low) / (high - low) * columns).astype(int), -1, columns)
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[starts[1:], len(x)]
    chosen = set(starts) | set(ends - 1)
    lowest = np.minimum.reduceat(y, starts)
    highest = np.maximum.reduceat(y, starts)
    for start, end, least, most in zip(starts, ends, lowest, highest):
        part = y[start:end]
        chosen.add(start + int(np.argmax(part == least)))
        chosen.add(start + int(np.argmax(part == most)))
    index = np.array(sorted(chosen))
    return x[index], y[index]


def _text(value: str) -> tuple[str, bool]:
    """A Plotly label as plain text, and whether it was bold (its <b>…</b>)."""
    bold = "<b>" in value
    return re.sub(r"<[^>]+>", "", value), bold


def _array(values) -> np.ndarray:
    return np.asarray([] if values is None else values, dtype=float)


def _drawn(trace) -> bool:
    return trace.visible in (None, True)


def _ranges(figure: go.Figure) -> tuple[tuple[float, float], tuple[float, float]]:
    """The axes' ranges as Plotly would set them: the x axis's own range, or every drawn point and
    band from zero; the y axis from zero to a little above the highest point."""
    drawn = [t for t in figure.data if _drawn(t)]
    xs = [_array(t.x) for t in drawn]
    ys = [_array(t.y) for t in drawn]
    xs += [_array([s.x0, s.x1]) for s in figure.layout.shapes or () if s.xref == "x"]
    x_values = np.concatenate([*xs, [0.0]])
    y_values = np.concatenate([*ys, [0.0]])
    x_values, y_values = x_values[np.isfinite(x_values)], y_values[np.isfinite(y_values)]
    given = figure.layout.xaxis.range
    x_range = (float(given[0]), float(given[1])) if given else (0.0, float(x_values.max()))
    if x_range[1] <= x_range[0]:
        x_range = (x_range[0], x_range[0] + 1.0)
    top = float(y_values.max()) * 1.05
    return x_range, (0.0, top if top > 0 else 1.0)


def _legend(figure: go.Figure, width: float) -> list[list[tuple[str, dict]]]:
    """The legend's entries in rows that fit `width`: the drawn traces' names (one hidden until
    clicked has no place in a picture, which cannot be clicked)."""
    rows: list[list[tuple[str, dict]]] = [[]]
    used = 0.0
    for trace in figure.data:
        if not _drawn(trace) or trace.showlegend is False or not trace.name:
            continue
        entry = LEGEND_SWATCH_PX + 6 + len(trace.name) * CHAR_PX * 0.95 + 18
        if rows[-1] and used + entry > width:
            rows.append([])
            used = 0.0
        rows[-1].append((trace.name, _style(trace)))
        used += entry
    return [row for row in rows if row]


def _style(trace) -> dict:
    line, marker = trace.line, trace.marker
    colour = marker.color if trace.mode == "markers" else line.color
    if not isinstance(colour, str):
        colour = CURVE_COLOUR  # a colour per marker: the legend shows the marker's outline
    return {"colour": colour or CURVE_COLOUR, "width": line.width or 1.5,
            "dash": DASHES.get(line.dash or "", ""), "markers": trace.mode == "markers"}


def memory_picture(figure: go.Figure, width: int = WIDTH_PX) -> str:
    """The figure as an SVG element: its drawn lines (decimated to the plot's pixel width) and
    markers, its rectangles (phase bands) and labels, its axes with round ticks and their titles,
    and its legend below. Raises Unsupported for a figure of several axes."""
    layout = figure.layout
    if any(t.type != "scatter" or (t.xaxis or "x") != "x" or (t.yaxis or "y") != "y"
           for t in figure.data):
        raise Unsupported("one pair of axes and scatter traces only")
    legend = _legend(figure, width - LEFT_PX - RIGHT_PX)
    plot_height = (layout.height or 440) - TOP_PX - BOTTOM_PX - 30
    height = TOP_PX + plot_height + BOTTOM_PX + LEGEND_ROW_PX * len(legend) + 8
    left, top, plot_width = LEFT_PX, TOP_PX, width - LEFT_PX - RIGHT_PX
    (x0, x1), (y0, y1) = _ranges(figure)

    def px(x):
        return left + (np.asarray(x, dtype=float) - x0) / (x1 - x0) * plot_width

    def py(y):
        return top + plot_height - (np.asarray(y, dtype=float) - y0) / (y1 - y0) * plot_height

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="anatomy-chart" '
           f'viewBox="0 0 {width} {height:.0f}" width="100%" role="img" '
           f'font-family="{escape(FONT)}" font-size="{FONT_PX}" '
           f'style="max-width:{width * 1.25:.0f}px;display:block">',
           f'<rect x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
           'fill="white"/>']
    # The bands (shapes on the x axis across the plot's height), under everything else.
    for shape in layout.shapes or ():
        if shape.type != "rect" or shape.xref != "x":
            continue
        a, b = (float(v) for v in px([max(shape.x0, x0), min(shape.x1, x1)]))
        if b <= a:
            continue
        out.append(f'<rect data-band="{escape(shape.name or "")}" x="{a:.1f}" y="{top}" '
                   f'width="{b - a:.1f}" height="{plot_height}" fill="{shape.fillcolor}" '
                   f'fill-opacity="{shape.opacity if shape.opacity is not None else 1}"/>')
    y_ticks, x_ticks = nice_ticks(y0, y1, Y_TICKS), nice_ticks(x0, x1, X_TICKS)
    for value in y_ticks:
        y = float(py(value))
        out += _tick("y-tick", (left, left + plot_width, y, y), (left - 6, y + 4), "end",
                     tick_text(value, y_ticks))
    for value in x_ticks:
        x = float(px(value))
        out += _tick("x-tick", (x, x, top, top + plot_height), (x, top + plot_height + 16),
                     "middle", tick_text(value, x_ticks))
    out.append(f'<rect x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
               f'fill="none" stroke="{AXIS_COLOUR}"/>')
    # The lines, then the markers over them; nothing drawn outside the plot.
    out.append(f'<svg x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
               f'viewBox="{left} {top} {plot_width} {plot_height}" overflow="hidden">')
    for trace in figure.data:
        if not _drawn(trace):
            continue
        x, y = _array(trace.x), _array(trace.y)
        style = _style(trace)
        if trace.mode == "markers":
            colours = trace.marker.color
            colours = [colours] * len(x) if isinstance(colours, str) or colours is None \
                else list(colours)
            size = (trace.marker.size or 8) / 2
            for cx, cy, colour in zip(px(x), py(y), colours):
                out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{size}" '
                           f'fill="{colour or CURVE_COLOUR}" stroke="{CURVE_COLOUR}" '
                           'stroke-width="1.5"/>')
            continue
        x, y = decimated(x, y, x0, x1, int(plot_width))
        if len(x) < 2:
            continue
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px(x), py(y)))
        dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
        out.append(f'<polyline data-name="{escape(trace.name or "")}" points="{points}" '
                   f'fill="none" stroke="{style["colour"]}" stroke-width="{style["width"]}"'
                   f'{dash} stroke-linejoin="round"/>')
    out.append("</svg>")
    out += _annotations(figure, px, py, top, x0, x1)
    x_title, _ = _text(layout.xaxis.title.text or "")
    y_title, _ = _text(layout.yaxis.title.text or "")
    out.append(f'<text class="x-title" x="{left + plot_width / 2}" '
               f'y="{top + plot_height + 36}" text-anchor="middle" fill="{CURVE_COLOUR}">'
               f'{escape(x_title)}</text>')
    out.append(f'<text class="y-title" transform="translate(16 {top + plot_height / 2}) '
               f'rotate(-90)" text-anchor="middle" fill="{CURVE_COLOUR}">'
               f'{escape(y_title)}</text>')
    out += _legend_items(legend, left, top + plot_height + BOTTOM_PX + 8)
    out.append("</svg>")
    return "".join(out)


def _annotations(figure: go.Figure, px, py, top: float, x0: float, x1: float) -> list[str]:
    """The figure's labels: those pinned to the plot's top (the bands' names, a row each as the
    figure placed them) and those with an arrow to a point (the memory at a phase's end)."""
    out = []
    for note in figure.layout.annotations or ():
        if note.x is None or not x0 <= note.x <= x1:
            continue
        text, bold = _text(note.text or "")
        weight = ' font-weight="bold"' if bold else ""
        box = len(text) * CHAR_PX + 8
        x = float(px(note.x))
        if note.yref == "paper":  # a band's label, its left edge at the band's start
            y = top + 2 - (note.yshift or 0)
            out.append(f'<g class="band-label" data-name="{escape(note.name or "")}">'
                       f'<rect x="{x:.1f}" y="{y:.1f}" width="{box:.0f}" height="17" '
                       f'fill="{note.bgcolor or "white"}"/>'
                       f'<text x="{x + 4:.1f}" y="{y + 13:.1f}"{weight} fill="{CURVE_COLOUR}">'
                       f'{escape(text)}</text></g>')
            continue
        y = float(py(note.y))
        tail_x, tail_y = x + (note.ax or 0), y + (note.ay or 0)
        out.append(f'<g class="point-label" data-name="{escape(note.name or "")}">'
                   f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{tail_x:.1f}" y2="{tail_y:.1f}" '
                   f'stroke="{CURVE_COLOUR}"/>'
                   f'<rect x="{tail_x - box / 2:.1f}" y="{tail_y - 9:.1f}" width="{box:.0f}" '
                   f'height="18" fill="white" fill-opacity="0.85" '
                   f'stroke="{note.bordercolor or CURVE_COLOUR}" stroke-width="1.5"/>'
                   f'<text x="{tail_x:.1f}" y="{tail_y + 4:.1f}" text-anchor="middle"{weight} '
                   f'fill="{CURVE_COLOUR}">{escape(text)}</text></g>')
    return out


def _legend_items(rows: list[list[tuple[str, dict]]], left: float, top: float) -> list[str]:
    out = []
    for index, row in enumerate(rows):
        y = top + index * LEGEND_ROW_PX
        x = left
        for name, style in row:
            if style["markers"]:
                swatch = (f'<circle cx="{x + LEGEND_SWATCH_PX / 2:.1f}" cy="{y:.1f}" r="4" '
                          f'fill="white" stroke="{style["colour"]}" stroke-width="1.5"/>')
            else:
                dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
                swatch = (f'<line x1="{x:.1f}" x2="{x + LEGEND_SWATCH_PX:.1f}" y1="{y:.1f}" '
                          f'y2="{y:.1f}" stroke="{style["colour"]}" '
                          f'stroke-width="{style["width"]}"{dash}/>')
            out.append(f'<g class="legend-item">{swatch}<text x="{x + LEGEND_SWATCH_PX + 6:.1f}" '
                       f'y="{y + 4:.1f}" fill="{CURVE_COLOUR}">{escape(name)}</text></g>')
            x += LEGEND_SWATCH_PX + 6 + len(name) * CHAR_PX * 0.95 + 18
    return out


def _tick(kind: str, line: tuple[float, float, float, float], at: tuple[float, float],
          anchor: str, text: str) -> list[str]:
    """One tick: its grid line (x1, x2, y1, y2) and its label at `at`."""
    (x1, x2, y1, y2), (x, y) = line, at
    return [f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" '
            f'stroke="{GRID_COLOUR}"/>',
            f'<text class="{kind}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" '
            f'font-size="{TICK_FONT_PX}" fill="{CURVE_COLOUR}">{text}</text>']
