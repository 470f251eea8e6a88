"""A chart on one pair of axes as an SVG picture drawn on the server, from the Plotly figure that
the interactive chart draws: its lines, markers (their symbols and colours) and their labels,
bands and rules, annotations, axes (linear or log) with their titles, and legend are read from the
figure, so the picture and the chart never say different things. What it cannot draw faithfully
(several axes, a trace that is not a scatter, a marker symbol or label position it does not know)
raises Unsupported, and the page draws the interactive chart instead.

Why a picture: a browser tab compiles Streamlit's 4.7 MB Plotly chunk before its first chart
(2.2-3.3 s of CPU on the development machine, docs/BENCHMARKS.md); an SVG element costs a fraction
of that. It has no hover or zoom: the pages draw it first, and the interactive chart a toggle away.
"""

from __future__ import annotations

import math
import re
from html import escape as html_escape
from html import unescape as html_unescape
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from anatomy.views.figures.layout import CHAR_PX, LABEL_ROW_PX
from anatomy.views.style import CURVE_COLOUR

# The picture's own width: the page scales it to its column, its text with it. About the column
# at 1,000 px (636 px with the sidebar open), so that its text is about its own size there
# (a 900 px picture drew 11 px ticks at 7 px), its plot no narrower than the labels' room
# (layout.ASSUMED_PLOT_PX); shown at most MOST_SCALE times as large in a wide window.
WIDTH_PX = 680
MOST_SCALE = 1.05
# The width a figure's height is read against: a picture keeps those proportions (a Plotly
# chart is as tall at any width).
FIGURE_WIDTH_PX = 900
FONT_PX = 12
TICK_FONT_PX = 12
# Room around the plot: the y tick labels and title at the left, the x ticks and title below.
LEFT_PX, RIGHT_PX, TOP_PX, BOTTOM_PX = 72, 16, 12, 44
LEGEND_ROW_PX = 20
LEGEND_SWATCH_PX = 24
X_TICKS, Y_TICKS = 8, 5  # about this many ticks an axis
PAD = 0.05  # an axis's room beyond its points, as a share of its span (Plotly's autorange)
GRID_COLOUR = "#E5E8EC"
AXIS_COLOUR = "#7F8C9A"
DASHES = {"dot": "2,3", "dash": "6,4", "dashdot": "6,3,2,3", "longdash": "10,4"}
FONT = "'Source Sans Pro', 'Source Sans 3', sans-serif"  # Streamlit's own
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x")
# A point's label beside its marker: (the side it is on across, up or down, the text's anchor).
TEXT_POSITIONS = {"middle right": (1, 0, "start"), "middle left": (-1, 0, "end"),
                  "top center": (0, -1, "middle"), "bottom center": (0, 1, "middle"),
                  "middle center": (0, 0, "middle")}


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


def log_ticks(low: float, high: float, count: int) -> list[float]:
    """Round values from `low` to `high` (both > 0) for a log axis: the powers of ten, with 2 and 5
    times them where a few decades leave room; linear round values within less than a decade."""
    for multiples in ((1, 2, 5), (1,)):
        ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(low)),
                                               math.ceil(math.log10(high)) + 1)
                 for m in multiples if low <= m * 10.0 ** k <= high]
        if 2 <= len(ticks) <= count + 2:
            return ticks
        if len(ticks) < 2:
            return nice_ticks(low, high, count)
    return ticks


def tick_text(value: float, ticks: list[float]) -> str:
    """A tick's number with as many decimals as its step needs, thousands separated."""
    step = min(np.diff(ticks)) if len(ticks) > 1 else 1.0
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


class Axis(NamedTuple):
    """One axis: its range (in log10 units on a log axis, as Plotly keeps it) and where it lies
    on the picture, from `start` (the low end) by `length` pixels (negative: upwards)."""
    low: float
    high: float
    log: bool
    start: float
    length: float

    def px(self, values) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.log10(np.where(values > 0, values, np.nan))
        return self.start + (values - self.low) / (self.high - self.low) * self.length

    def at(self, fraction: float) -> float:
        """A point of the axis's domain (0 its low end, 1 its high end), in pixels."""
        return self.start + fraction * self.length

    def data_range(self) -> tuple[float, float]:
        return (10 ** self.low, 10 ** self.high) if self.log else (self.low, self.high)

    def ticks(self, count: int) -> list[float]:
        low, high = self.data_range()
        return log_ticks(low, high, count) if self.log else nice_ticks(low, high, count)


def _text(value: str) -> tuple[str, bool]:
    """A Plotly label as plain text, and whether it was bold (its <b>…</b>)."""
    bold = "<b>" in value
    return re.sub(r"<[^>]+>", "", value), bold


def _array(values) -> np.ndarray:
    return np.asarray([] if values is None else values, dtype=float)


def _drawn(trace) -> bool:
    return trace.visible in (None, True)


def _modes(trace) -> set[str]:
    return set((trace.mode or "lines").split("+")) - {"none"}


def _range(values: np.ndarray, axis, padded: bool) -> tuple[float, float, bool]:
    """An axis's range as Plotly's autorange sets it: the given range, else the values' (from
    zero where the axis says so), padded where markers sit at its ends; log10 units on a log axis."""
    log = axis.type == "log"
    values = values[np.isfinite(values)]
    if log:
        values = np.log10(values[values > 0])
    if axis.range:
        low, high = (float(v) for v in axis.range)
    elif values.size == 0:
        low, high = 0.0, 1.0
    else:
        low, high = float(values.min()), float(values.max())
        if axis.rangemode == "tozero" and not log:
            low, high = min(low, 0.0), max(high, 0.0)
        pad = (high - low) * PAD
        if padded and not (axis.rangemode == "tozero" and low == 0 and not log):
            low -= pad
        if padded:
            high += pad
    if not high > low:  # one value: a unit around it, from zero where the axis starts there
        low, high = (0.0, 1.0) if low == 0 and axis.rangemode == "tozero" else \
            (low - 0.5, high + 0.5)
    return low, high, log


def _axes(figure: go.Figure, left: float, top: float, width: float, height: float
          ) -> tuple[Axis, Axis]:
    """The x axis exactly over the points and bands (padded only for a chart of points alone);
    the y axis a little above the highest point."""
    layout = figure.layout
    drawn = [t for t in figure.data if _drawn(t)]
    xs = [_array(t.x) for t in drawn]
    xs += [_array([s.x0, s.x1]) for s in layout.shapes or () if s.xref == "x"]
    ys = [_array(t.y) for t in drawn]
    ys += [_array([s.y0, s.y1]) for s in layout.shapes or () if s.yref == "y"]
    points_only = not any("lines" in _modes(t) for t in drawn)
    x_low, x_high, x_log = _range(np.concatenate([*xs, []]), layout.xaxis, points_only)
    y_low, y_high, y_log = _range(np.concatenate([*ys, []]), layout.yaxis, True)
    return (Axis(x_low, x_high, x_log, left, width),
            Axis(y_low, y_high, y_log, top + height, -height))


def _legend(figure: go.Figure, width: float) -> list[list[tuple[str, dict]]]:
    """The legend's entries in rows that fit `width`: the drawn traces' names (one hidden until
    clicked has no place in a picture, which cannot be clicked)."""
    rows: list[list[tuple[str, dict]]] = [[]]
    used = 0.0
    if figure.layout.showlegend is False:
        return []
    for trace in figure.data:
        if not _drawn(trace) or trace.showlegend is False or not trace.name:
            continue
        name = html_unescape(trace.name)  # as Plotly draws it: its length is the drawn one
        room = int((width - LEGEND_SWATCH_PX - 24) / (CHAR_PX * 0.95))
        if len(name) > room:  # wider than the picture alone (a long run name): cut, not lost
            name = name[:room - 1].rstrip() + "…"
        entry = LEGEND_SWATCH_PX + 6 + len(name) * CHAR_PX * 0.95 + 18
        if rows[-1] and used + entry > width:
            rows.append([])
            used = 0.0
        rows[-1].append((name, _style(trace)))
        used += entry
    return [row for row in rows if row]


def _style(trace) -> dict:
    if trace.type in BAR_TYPES:
        return {"colour": _bar_colour(trace, "increasing"), "bar": True}
    line, marker = trace.line, trace.marker
    modes = _modes(trace)
    colour = marker.color if "lines" not in modes else line.color
    if not isinstance(colour, str):
        colour = marker.line.color if isinstance(marker.line.color, str) else CURVE_COLOUR
    symbol = marker.symbol if isinstance(marker.symbol, str) else "circle"
    return {"colour": colour or CURVE_COLOUR, "width": line.width or 1.5,
            "dash": DASHES.get(line.dash or "", ""),
            "markers": "lines" not in modes and "markers" in modes, "symbol": symbol}


def _bars(figure: go.Figure) -> bool:
    """Whether the figure is bars (or waterfalls) side by side on an axis of categories."""
    return any(trace.type in BAR_TYPES for trace in figure.data)


def _check(figure: go.Figure) -> None:
    bars = _bars(figure)
    for trace in figure.data:
        if (trace.xaxis or "x") != "x" or (trace.yaxis or "y") != "y":
            raise Unsupported("one pair of axes only")
        if bars:
            if trace.type not in BAR_TYPES or trace.orientation == "h" or \
                    not all(isinstance(x, str) for x in trace.x or ()):
                raise Unsupported("upright bars on categories, no other trace")
            if (trace.text is not None or trace.texttemplate is not None) and \
                    trace.textposition != "outside":
                raise Unsupported("a bar's label inside it")  # written above the bar only
            continue
        if trace.type != "scatter":
            raise Unsupported("scatter traces, or bars, only")
        symbols = trace.marker.symbol
        for symbol in [symbols] if symbols is None or isinstance(symbols, str) else symbols:
            if symbol not in (None, *SYMBOLS):
                raise Unsupported(f"the marker symbol {symbol!r}")
        positions = trace.textposition
        for position in [positions] if positions is None or isinstance(positions, str) \
                else positions:
            if position not in (None, *TEXT_POSITIONS):
                raise Unsupported(f"the label position {position!r}")
    for axis in (figure.layout.xaxis, figure.layout.yaxis):
        if axis.type not in (None, "-", "linear", "log") or (bars and axis.type == "log"):
            raise Unsupported(f"an axis of type {axis.type}")
        if axis.tickmode == "array":  # the picture's ticks are round numbers
            raise Unsupported("an axis with tick labels of its own")
    if bars and (figure.layout.barmode not in (None, "group") or
                 figure.layout.waterfallmode not in (None, "group")):
        raise Unsupported("bars side by side only, not stacked or overlaid")


# What Streamlit's Markdown reads as markup even inside the picture's HTML, which a page writes
# with st.markdown: $…$ (math), **…**, _…_, `…`, ~…~, [..](..) and :red[…] (its colon alone
# starts Streamlit's directive, brackets escaped or not). A run named
# "**v2** $x^2$" split the legend out of the picture, set in bold and as a formula. Written as
# character references, each draws the same character and is no markup.
_MARKUP = str.maketrans({c: f"&#{ord(c)};" for c in "\\`*_[]$~:"})


def escape(text: str) -> str:
    """A Plotly text as the picture's SVG holds it: Plotly reads its entities (a run's name is
    escaped for it, "&lt;b&gt;", and drawn "<b>"), so they are read first; then HTML's escapes,
    and Markdown's characters as references."""
    return plain(html_unescape(text))


def plain(text: str) -> str:
    """Text as drawn (no entity in it) as the picture's SVG holds it."""
    return html_escape(text).translate(_MARKUP)


def picture(figure: go.Figure, width: int = WIDTH_PX) -> str:
    """The figure as an SVG element: its drawn lines (decimated to the plot's pixel width),
    markers and their labels, its rectangles (phase bands), rules and annotations, its axes with
    round ticks and their titles, and its legend below. Raises Unsupported for what it cannot
    draw as the interactive chart would."""
    _check(figure)
    layout = figure.layout
    legend = _legend(figure, width - LEFT_PX - RIGHT_PX)
    top = TOP_PX + _room_above(figure)
    plot_height = round((layout.height or 440) * width / FIGURE_WIDTH_PX) - top - BOTTOM_PX - 30
    height = top + plot_height + BOTTOM_PX + LEGEND_ROW_PX * len(legend) + 8
    left, plot_width = LEFT_PX, width - LEFT_PX - RIGHT_PX
    bars = _bars(figure)
    if bars:
        columns = bar_columns(figure)
        x_axis = Categories(_categories(figure), left, plot_width)
        y_axis = _bar_axis(figure, columns, top, plot_height)
    else:
        x_axis, y_axis = _axes(figure, left, top, plot_width, plot_height)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="anatomy-chart" '
           f'viewBox="0 0 {width} {height:.0f}" width="100%" role="img" '
           f'font-family="{escape(FONT)}" font-size="{FONT_PX}" '
           f'style="max-width:{width * MOST_SCALE:.0f}px;display:block">',
           f'<rect x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
           'fill="white"/>']
    out += _bands(figure, x_axis, top, plot_height)
    y_ticks, x_ticks = y_axis.ticks(Y_TICKS), x_axis.ticks(X_TICKS)
    for value in y_ticks:
        y = float(y_axis.px(value))
        out += _tick("y-tick", (left, left + plot_width, y, y), (left - 6, y + 4), "end",
                     tick_text(value, y_ticks))
    for value in x_ticks:
        x = float(x_axis.px(value))
        out += _tick("x-tick", (x, x, top, top + plot_height), (x, top + plot_height + 16),
                     "middle", value if bars else tick_text(value, x_ticks),
                     grid=not bars, room=x_axis.step * x_axis.every if bars else None)
    out.append(f'<rect x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
               f'fill="none" stroke="{AXIS_COLOUR}"/>')
    # The lines and rules, then the markers over them; nothing drawn outside the plot but the
    # markers that Plotly lets out (cliponaxis=False).
    out.append(f'<svg x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" '
               f'viewBox="{left} {top} {plot_width} {plot_height}" overflow="hidden">')
    unclipped = []
    if bars:
        bar_out, unclipped = _bar_shapes(columns, x_axis, y_axis)
        out += bar_out
    out += _rules(figure, x_axis, y_axis)
    for trace in figure.data if not bars else ():
        if not _drawn(trace):
            continue
        modes = _modes(trace)
        if "lines" in modes:
            out += _line(trace, x_axis, y_axis, int(plot_width))
        points = _points(trace, x_axis, y_axis) if modes & {"markers", "text"} else []
        (out if trace.cliponaxis is not False else unclipped).extend(points)
    out.append("</svg>")
    out += unclipped
    out += _annotations(figure, x_axis, y_axis)
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


BAR_TYPES = ("bar", "waterfall")
BAR_GAP = 0.2  # Plotly's bargap: the share of a category's width between its group of bars


class Categories(NamedTuple):
    """An axis of categories: each one a slot of equal width, its name under its middle."""
    names: list[str]
    start: float
    length: float

    @property
    def step(self) -> float:
        return self.length / max(1, len(self.names))

    def px(self, values) -> np.ndarray:
        """A category's middle; a number is a place among them, as Plotly reads one (0: the
        first category's middle)."""
        def one(value) -> float:
            place = self.names.index(value) if isinstance(value, str) else float(value)
            return self.start + (place + 0.5) * self.step
        if isinstance(values, (str, int, float)):
            return np.asarray(one(values))
        return np.asarray([one(v) for v in values])

    def at(self, fraction: float) -> float:
        return self.start + fraction * self.length

    def data_range(self) -> tuple[float, float]:
        return (-0.5, len(self.names) - 0.5)

    @property
    def every(self) -> int:
        """Every how many categories a name is written under its slot: each where the longest
        word of a name fits a slot (a label breaks between words, not inside one), else every
        second, third… so that no two run into one another (Plotly tilts them instead, which
        the picture's room below the plot leaves no space for)."""
        word = max((len(w) for name in self.names for w in name.split(" ")), default=0)
        return max(1, math.ceil((word * TICK_FONT_PX * 0.55 + 4) / self.step))

    def ticks(self, count: int) -> list[str]:
        """The names written: every `every`-th from the first, and the last one in place of the
        one before it where it falls between two of them (a waterfall's last bar is its total,
        the figure it is read for; a histogram's, the longest texts)."""
        picked = list(range(0, len(self.names), self.every))
        if len(picked) > 1 and picked[-1] != len(self.names) - 1:
            picked[-1] = len(self.names) - 1
        return [self.names[i] for i in picked]


class BarColumn(NamedTuple):
    """One bar as drawn: its category, the trace's place in the group, from `base` to `top`."""
    category: str
    slot: int  # the trace's place among the figure's bars, left to right in a category
    base: float
    top: float
    colour: str
    text: str
    connects: bool  # a waterfall's bar: a line joins its end to the next bar's start


def _categories(figure: go.Figure) -> list[str]:
    """The x axis's categories: in the figure's given order, else as the traces first name them."""
    axis = figure.layout.xaxis
    seen = list(dict.fromkeys(x for t in figure.data if _drawn(t) for x in t.x or ()))
    if axis.categoryorder == "array" and axis.categoryarray:
        given = [c for c in axis.categoryarray if c in seen]
        return given + [c for c in seen if c not in given]
    return seen


def _bar_colour(trace, direction: str) -> str:
    if trace.type == "waterfall":
        colour = getattr(trace, direction).marker.color
    else:
        colour = trace.marker.color
    if colour is not None and not isinstance(colour, str):
        raise Unsupported("a colour per bar")
    return colour or CURVE_COLOUR


TEMPLATE_FIELD = re.compile(r"%\{(final|y|x)(?::([^}]*))?\}")


def _filled(template: str, fields: dict[str, float | str]) -> str:
    """A Plotly text template with the fields a bar has ("%{final:,.0f}" -> "8,536"); d3's number
    formats that read as Python's, nothing else."""
    def one(match: re.Match) -> str:
        value, spec = fields[match.group(1)], match.group(2) or ""
        if not re.fullmatch(r",?(\.\d+)?[fd%]?", spec):
            raise Unsupported(f"the number format {spec!r}")
        return format(value, spec.replace("d", ".0f")) if spec else str(value)
    if "%{" in TEMPLATE_FIELD.sub("", template):
        raise Unsupported(f"the text template {template!r}")
    return TEMPLATE_FIELD.sub(one, template)


def bar_columns(figure: go.Figure) -> list[BarColumn]:
    """Every bar of the figure, as Plotly draws it: a bar from zero to its value; a waterfall's
    "relative" step from the running total by its value, its "total" from zero to the running
    total, each coloured as rising, falling or a total; their labels from `text` or
    `texttemplate`."""
    columns = []
    drawn = [t for t in figure.data if _drawn(t)]
    for slot, trace in enumerate(drawn):
        count = len(trace.x)
        values = _each(trace.y, count)
        texts = _each(trace.text, count)
        templates = _each(trace.texttemplate, count)
        measures = _each(trace.measure, count) if trace.type == "waterfall" else [None] * count
        total = 0.0
        for category, value, text, template, measure in zip(trace.x, values, texts, templates,
                                                            measures):
            if trace.type == "bar":
                if value is None:
                    continue
                base, top, colour = 0.0, float(value), _bar_colour(trace, "")
            elif measure == "total":
                base, top, colour = 0.0, total, trace.totals.marker.color or CURVE_COLOUR
            elif measure == "absolute":
                base, top, colour = 0.0, float(value or 0), _bar_colour(trace, "increasing")
                total = top
            elif measure not in (None, "relative"):
                raise Unsupported(f"the waterfall measure {measure!r}")
            else:
                base, top = total, total + float(value or 0)
                colour = _bar_colour(trace, "increasing" if top >= base else "decreasing")
                total = top
            if template is not None:
                text = _filled(template, {"final": top, "y": top - base, "x": category})
            columns.append(BarColumn(category, slot, base, top, colour,
                                     _text(str(text))[0] if text else "",
                                     trace.type == "waterfall"))
    return columns


def _bar_axis(figure: go.Figure, columns: list[BarColumn], top: float, height: float) -> Axis:
    """The y axis of bars: from zero (or the lowest bar) to the highest, with room above for the
    labels written over the bars."""
    values = [v for c in columns for v in (c.base, c.top)]
    values += [v for s in figure.layout.shapes or () if s.yref == "y" for v in (s.y0, s.y1)]
    low, high = min(0.0, *values), max(0.0, *values)
    if not high > low:
        high = low + 1
    room = (high - low) * (PAD + 20 / height)
    return Axis(low, high + room, False, top + height, -height)


def _bar_shapes(columns: list[BarColumn], x_axis: Categories, y_axis: Axis
                ) -> tuple[list[str], list[str]]:
    """The bars with the lines that join a waterfall's steps, and (apart: outside the plot's clip)
    their labels above them."""
    groups = max((c.slot for c in columns), default=0) + 1
    width = x_axis.step * (1 - BAR_GAP) / groups
    bars, labels = [], []
    previous: dict[int, tuple[float, float]] = {}  # each trace's last bar: its right edge, level
    for column in columns:
        left = float(x_axis.px(column.category)) - x_axis.step * (1 - BAR_GAP) / 2 \
            + column.slot * width
        y0, y1 = (float(v) for v in y_axis.px([column.base, column.top]))
        bars.append(f'<rect class="bar" data-category="{escape(column.category)}" '
                    f'x="{left:.1f}" y="{min(y0, y1):.1f}" width="{width:.1f}" '
                    f'height="{abs(y1 - y0):.1f}" fill="{column.colour}"/>')
        if column.connects and column.slot in previous:
            end, level = previous[column.slot]
            bars.append(f'<line class="connector" x1="{end:.1f}" x2="{left:.1f}" '
                        f'y1="{level:.1f}" y2="{level:.1f}" stroke="{AXIS_COLOUR}"/>')
        previous[column.slot] = (left + width, y1)
        if column.text:
            # No wider than its bar, as Plotly shrinks it (its constraintext): side by side,
            # two bars' labels would run into each other.
            size = min(TICK_FONT_PX, width / (len(column.text) * 0.58))
            above = min(y0, y1) - 4 if column.top >= column.base else max(y0, y1) + size + 2
            labels.append(f'<text class="bar-text" x="{left + width / 2:.1f}" y="{above:.1f}" '
                          f'text-anchor="middle" font-size="{size:.1f}" '
                          f'fill="{CURVE_COLOUR}">{escape(column.text)}</text>')
    return bars, labels


def _bands(figure: go.Figure, x_axis: Axis, top: float, plot_height: float) -> list[str]:
    """The rectangles across the plot's height at a stretch of x (the phase bands), under
    everything else."""
    out = []
    low, high = x_axis.data_range()
    for shape in figure.layout.shapes or ():
        if shape.type != "rect" or shape.xref != "x":
            continue
        a, b = (float(v) for v in x_axis.px([max(shape.x0, low), min(shape.x1, high)]))
        if b <= a:
            continue
        out.append(f'<rect data-band="{escape(shape.name or "")}" x="{a:.1f}" y="{top}" '
                   f'width="{b - a:.1f}" height="{plot_height}" fill="{shape.fillcolor}" '
                   f'fill-opacity="{shape.opacity if shape.opacity is not None else 1}"/>')
    return out


def _room_above(figure: go.Figure) -> int:
    """The room the labels set above the plot need (a run's phase names, a row each)."""
    return max((round(note.yshift or 0) + 19 for note in figure.layout.annotations or ()
                if (note.yref or "y") != "y" and note.yanchor == "bottom"
                and note.y is not None and note.y >= 1), default=0)


def _position(axis: Axis, value: float, ref: str | None, own: str) -> float:
    """An x or y of a shape or annotation in pixels: in data units where it refers to the axis
    (`own`), else a fraction of the plot ("paper", "x domain", "y domain")."""
    return float(axis.px(value)) if (ref or own) == own else axis.at(float(value))


def _rules(figure: go.Figure, x_axis: Axis, y_axis: Axis) -> list[str]:
    """The figure's lines (add_vline, add_hline and the like), dashed as the figure says."""
    out = []
    for shape in figure.layout.shapes or ():
        if shape.type != "line":
            continue
        x1, x2 = (_position(x_axis, v, shape.xref, "x") for v in (shape.x0, shape.x1))
        y1, y2 = (_position(y_axis, v, shape.yref, "y") for v in (shape.y0, shape.y1))
        line = shape.line
        dash = DASHES.get(line.dash or "", "")
        out.append(f'<line class="rule" x1="{x1:.1f}" x2="{x2:.1f}" y1="{y1:.1f}" '
                   f'y2="{y2:.1f}" stroke="{line.color or CURVE_COLOUR}" '
                   f'stroke-width="{line.width or 2}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    return out


def _line(trace, x_axis: Axis, y_axis: Axis, columns: int) -> list[str]:
    low, high = x_axis.data_range()
    x, y = decimated(_array(trace.x), _array(trace.y), low, high, columns)
    if len(x) < 2:
        return []
    style = _style(trace)
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x_axis.px(x), y_axis.px(y)))
    dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
    return [f'<polyline data-name="{escape(trace.name or "")}" points="{points}" '
            f'fill="none" stroke="{style["colour"]}" stroke-width="{style["width"]}"'
            f'{dash} stroke-linejoin="round"/>']


def _each(value, count: int) -> list:
    """A trace's property given once for all points or point by point, as a list a point."""
    if value is None or isinstance(value, (str, int, float)):
        return [value] * count
    return list(value)


def _points(trace, x_axis: Axis, y_axis: Axis) -> list[str]:
    """A trace's markers (symbol, size, fill and outline as the figure has them) and the label
    beside each ("bs 4"); a point without a label has an empty text."""
    x, y = _array(trace.x), _array(trace.y)
    modes, marker = _modes(trace), trace.marker
    count = len(x)
    colours = _each(marker.color, count)
    symbols = _each(marker.symbol, count)
    texts = _each(trace.text, count)
    positions = _each(trace.textposition, count)
    radius = (marker.size or 6) / 2
    outline = marker.line.color if isinstance(marker.line.color, str) else None
    outline_width = marker.line.width if marker.line.width is not None else 0
    out = []
    for cx, cy, colour, symbol, text, position in zip(x_axis.px(x), y_axis.px(y), colours,
                                                      symbols, texts, positions):
        if not (np.isfinite(cx) and np.isfinite(cy)):
            continue
        if "markers" in modes:
            out.append(_marker(symbol or "circle", float(cx), float(cy), radius,
                               colour or CURVE_COLOUR, outline, outline_width))
        if "text" in modes and text:
            across, up, anchor = TEXT_POSITIONS[position or "middle center"]
            gap = radius + 3 if "markers" in modes else 0
            label, bold = _text(str(text))
            out.append(f'<text class="point-text" x="{cx + across * gap:.1f}" '
                       f'y="{cy + up * (gap + 4) + 4:.1f}" text-anchor="{anchor}"'
                       + (' font-weight="bold"' if bold else "")
                       + f' fill="{CURVE_COLOUR}">{escape(label)}</text>')
    return out


def _marker(symbol: str, cx: float, cy: float, r: float, fill: str, outline: str | None,
            outline_width: float, kind: str = "marker") -> str:
    """One marker of Plotly's shapes, `r` its half size; `kind` its class (a legend's swatch)."""
    stroke = f' stroke="{outline}" stroke-width="{outline_width}"' if outline and \
        outline_width else ""
    data = f' class="{kind}" data-symbol="{symbol}" fill="{fill}"{stroke}'
    if symbol == "circle":
        return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}"{data}/>'
    if symbol == "square":
        return f'<rect x="{cx - r:.1f}" y="{cy - r:.1f}" width="{2 * r}" height="{2 * r}"{data}/>'
    if symbol == "diamond":
        d = r * 1.3
        path = f"M{cx:.1f},{cy - d:.1f}L{cx + d:.1f},{cy:.1f}L{cx:.1f},{cy + d:.1f}" \
               f"L{cx - d:.1f},{cy:.1f}Z"
    elif symbol == "triangle-up":
        d = r * 2 / math.sqrt(3)
        path = f"M{cx:.1f},{cy - d:.1f}L{cx + r * 1.15:.1f},{cy + d / 2:.1f}" \
               f"L{cx - r * 1.15:.1f},{cy + d / 2:.1f}Z"
    else:  # "x": two strokes crossed, in the marker's colour
        d = r * 0.8
        return (f'<path class="{kind}" data-symbol="x" d="M{cx - d:.1f},{cy - d:.1f}'
                f'L{cx + d:.1f},{cy + d:.1f}M{cx - d:.1f},{cy + d:.1f}L{cx + d:.1f},{cy - d:.1f}" '
                f'stroke="{fill}" stroke-width="{max(2.0, r / 2):.1f}"/>')
    return f'<path d="{path}"{data}/>'


ANCHORS = {"left": "start", "center": "middle", "right": "end"}


def _shown(figure: go.Figure, x_axis) -> list:
    """The annotations within the x axis's range (one pinned to the plot is always within)."""
    low, high = x_axis.data_range()
    return [note for note in figure.layout.annotations or ()
            if note.x is not None and not ((note.xref or "x") == "x"
                                           and isinstance(note.x, (int, float))
                                           and not low <= note.x <= high)]


def _arrowed(note) -> bool:
    return note.showarrow is not False and (note.yref or "y") == "y"


def _anchored(x: float, box: float, anchor: str | None, default: str) -> float:
    """The left of a box `box` wide whose anchor (Plotly's xanchor) is at `x`."""
    side = ANCHORS.get(anchor, ANCHORS[default])
    return {"start": x, "middle": x - box / 2, "end": x - box}[side]


# A note's box where the figure gives it no colour: the curve behind shows faintly (Plotly's own
# box would be transparent, and its text would cross the curve).
FALLBACK_NOTE_FILL = "rgba(255,255,255,0.85)"


def _annotations(figure: go.Figure, x_axis: Axis, y_axis: Axis) -> list[str]:
    """The figure's labels: those with an arrow to a point (the memory at a phase's end, a note on
    the curve), then those set at a height of the plot (the bands' names, a row each as the figure
    placed them; a rule's name), each a row lower where it would cover one placed before it."""
    out = []
    right_edge = x_axis.at(1)
    placed: list[tuple[float, float, float]] = []  # the labels so far: left, right, top
    notes = _shown(figure, x_axis)
    for note in [n for n in notes if _arrowed(n)]:
        text, bold = _text(note.text or "")
        weight = ' font-weight="bold"' if bold else ""
        box = len(text) * CHAR_PX + 8
        x = _position(x_axis, note.x, note.xref, "x") + (note.xshift or 0)
        y = _position(y_axis, note.y, note.yref, "y") - (note.yshift or 0)
        # The text's place: pixels away from the point, or a height on the y axis (ayref).
        tail_x = x + (note.ax or 0)
        tail_y = float(y_axis.px(note.ay)) if note.ayref == "y" else y + (note.ay or 0)
        # Inside the plot: a picture cuts nothing, and the ticks beside it stay readable.
        left = min(max(_anchored(tail_x, box, note.xanchor, "center"), x_axis.at(0)),
                   right_edge - box)
        tail_x = min(max(tail_x, left), left + box)
        placed.append((left, left + box, tail_y - 9))
        out.append(f'<g class="point-label" data-name="{escape(note.name or "")}">'
                   f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{tail_x:.1f}" y2="{tail_y:.1f}" '
                   f'stroke="{CURVE_COLOUR}"/>'
                   f'<rect x="{left:.1f}" y="{tail_y - 9:.1f}" width="{box:.0f}" '
                   f'height="18" fill="{note.bgcolor or FALLBACK_NOTE_FILL}" '
                   f'stroke="{note.bordercolor or CURVE_COLOUR}" stroke-width="1.5"/>'
                   f'<text x="{left + box / 2:.1f}" y="{tail_y + 4:.1f}" text-anchor="middle"'
                   f'{weight} fill="{CURVE_COLOUR}">{escape(text)}</text></g>')
    for note in [n for n in notes if not _arrowed(n)]:
        text, bold = _text(note.text or "")
        weight = ' font-weight="bold"' if bold else ""
        box = len(text) * CHAR_PX + 8
        x = _position(x_axis, note.x, note.xref, "x") + (note.xshift or 0)
        y = _position(y_axis, note.y, note.yref, "y") - (note.yshift or 0)
        # A label that would leave the plot at its right is moved in: a picture cuts it.
        left = min(_anchored(x, box, note.xanchor, "left"), right_edge - box)
        y += {"top": 0, "middle": -8.5, "bottom": -17}.get(note.yanchor, -8.5)
        if (note.yref or "y") != "y" and note.yanchor == "top":
            y += 2  # a band's label, just inside the plot's top
        # One moved in at the right, or one the figure placed without knowing where the notes'
        # boxes fall, can meet another: it goes a row further from the plot's edge, as the
        # figure's own rows do (up, above the plot).
        above = (note.yref or "y") != "y" and note.yanchor == "bottom"
        while any(a < left + box and left < b and abs(y - c) < LABEL_ROW_PX - 1
                  for a, b, c in placed):
            y += -LABEL_ROW_PX if above else LABEL_ROW_PX
        placed.append((left, left + box, y))
        kind = "label" if (note.yref or "y") == "y" else "band-label"
        out.append(f'<g class="{kind}" data-name="{escape(note.name or "")}">'
                   + (f'<rect x="{left:.1f}" y="{y:.1f}" width="{box:.0f}" height="17" '
                      f'fill="{note.bgcolor}"/>' if note.bgcolor else "")
                   + f'<text x="{left + 4:.1f}" y="{y + 13:.1f}"{weight} '
                     f'fill="{CURVE_COLOUR}">{escape(text)}</text></g>')
    return out


def _legend_items(rows: list[list[tuple[str, dict]]], left: float, top: float) -> list[str]:
    out = []
    for index, row in enumerate(rows):
        y = top + index * LEGEND_ROW_PX
        x = left
        for name, style in row:
            if style.get("bar"):
                swatch = (f'<rect x="{x + 6:.1f}" y="{y - 6:.1f}" width="12" height="12" '
                          f'fill="{style["colour"]}"/>')
            elif style["markers"]:
                swatch = _marker(style["symbol"], x + LEGEND_SWATCH_PX / 2, y, 4,
                                 style["colour"], "white", 1, kind="swatch")
            else:
                dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
                swatch = (f'<line x1="{x:.1f}" x2="{x + LEGEND_SWATCH_PX:.1f}" y1="{y:.1f}" '
                          f'y2="{y:.1f}" stroke="{style["colour"]}" '
                          f'stroke-width="{style["width"]}"{dash}/>')
            out.append(f'<g class="legend-item">{swatch}<text x="{x + LEGEND_SWATCH_PX + 6:.1f}" '
                       f'y="{y + 4:.1f}" fill="{CURVE_COLOUR}">{plain(name)}</text></g>')
            x += LEGEND_SWATCH_PX + 6 + len(name) * CHAR_PX * 0.95 + 18
    return out


def _tick(kind: str, line: tuple[float, float, float, float], at: tuple[float, float],
          anchor: str, text: str, grid: bool = True, room: float | None = None) -> list[str]:
    """One tick: its grid line (x1, x2, y1, y2) and its label at `at`; a label wider than its
    `room` (a category's) goes on as many lines as it needs, broken between words."""
    (x1, x2, y1, y2), (x, y) = line, at
    lines = [text]
    if room is not None:
        per_line = max(1, int(room / (TICK_FONT_PX * 0.55)))
        lines = [""]
        for word in text.split(" "):
            if lines[-1] and len(lines[-1]) + 1 + len(word) > per_line:
                lines.append(word)
            else:
                lines[-1] = f"{lines[-1]} {word}".strip()
    label = "".join(f'<tspan x="{x:.1f}" dy="{0 if i == 0 else 13}">{escape(part)}</tspan>'
                    for i, part in enumerate(lines)) if len(lines) > 1 else escape(text)
    return ([f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" '
             f'stroke="{GRID_COLOUR}"/>'] if grid else []) + \
        [f'<text class="{kind}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" '
         f'font-size="{TICK_FONT_PX}" fill="{CURVE_COLOUR}">{label}</text>']
