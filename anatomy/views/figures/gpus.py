"""A run's memory once it trains on many GPUs: one line per GPU stops being readable at
about eight, so beyond that the memory is drawn as small multiples — a panel per host (eight GPUs
at most a panel), every panel on the same x and y ranges —, and every run of several GPUs gets a
heat strip: a row per GPU, time across, the colour its memory used (a fraction of the device), so
that a GPU that fills first, or a straggler whose training starts late, is one row unlike the
others."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import cycle

import numpy as np
import plotly.graph_objects as go

from anatomy.analysis.report import RankReading, RunReport
from anatomy.store import HOST_STRIDE, Sample, Step
from anatomy.units import MIB
from anatomy.views import text as words
from anatomy.views.figures import live
from anatomy.views.figures.layout import phase_bands
from anatomy.views.style import BAND_OPACITY, CURVE_COLOUR, RUN_COLOURS, phase_colour
from anatomy.vocabulary import Phase

LINES_AT_MOST = 8  # GPUs one chart draws as lines; beyond, a panel per host
PANEL_COLUMNS = 2
PANEL_PX = 210  # a panel's height
HEAT_COLUMNS = 400  # time bins of the heat strip: a few pixels each at the widest
HEAT_ROW_PX = 14  # a GPU's row: 64 GPUs make a strip of ~900 px, every label readable
HEAT_LEAST_PX = 90  # the rows of two or three: room for the colour bar's numbers (they overlapped)
HEAT_SCALE = "Cividis"  # a sequential scale colour-blind eyes read the same way


def devices(report: RunReport, samples: Sequence[Sample]) -> list[int]:
    """The devices the run trains on (those of its ranks), or every one sampled for a run of one
    process, in the order the store keys them (host, then NVML index)."""
    if report.ranks:
        return sorted({r.device for r in report.ranks})
    return sorted({s.gpu for s in samples})


def many(report: RunReport) -> bool:
    """More GPUs train than one chart of lines can show."""
    return len({r.device for r in report.ranks}) > LINES_AT_MOST


def buckets(report: RunReport, lines: int = 1000) -> int:
    """Time buckets to read a run's memory in (`Store.decimated`): `lines` for one chart of
    lines (a min and a max each: two points a pixel column of the widest chart), fewer for small
    multiples, whose panels are half as wide and hold 64 GPUs' lines between them."""
    return lines * 3 // 10 if many(report) else lines


def memory_chart(report: RunReport, samples: Sequence[Sample], steps: Sequence[Step] = (),
                 now: float | None = None, axis: str = "run") -> go.Figure:
    """A run's memory as every page draws it: one chart of lines (`live.memory_figure`) up to
    LINES_AT_MOST GPUs, small multiples beyond."""
    if many(report):
        return small_multiples(report, samples, steps, now, axis)
    return live.memory_figure(report, samples, steps, now, axis)


def _names(report: RunReport) -> dict[int, str]:
    """Each device as its lines are named: the ranks on it."""
    by_device: dict[int, list[RankReading]] = {}
    for rank in report.ranks:
        by_device.setdefault(rank.device, []).append(rank)
    return {device: ", ".join(r.label() for r in ranks) for device, ranks in by_device.items()}


def _series(samples: Sequence[Sample], wanted: Sequence[int]
            ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each wanted device's samples as arrays (times, bytes used, its total or NaN), in time
    order: one pass over the rows, however many devices (64 GPUs' decimated rows are ~10^5)."""
    rows = np.array([(s.gpu, s.t, s.used, np.nan if s.total is None else s.total)
                     for s in samples], dtype=float).reshape(-1, 4)
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    keys, starts = np.unique(rows[:, 0], return_index=True)
    bounds = dict(zip(keys.astype(int), zip(starts, [*starts[1:], len(rows)])))
    out = {}
    for key in wanted:
        if key in bounds:
            first, last = bounds[key]
            out[key] = (rows[first:last, 1], rows[first:last, 2], rows[first:last, 3])
    return out


def _panels(report: RunReport, keys: list[int]) -> list[tuple[str, list[int]]]:
    """A panel per host, eight GPUs at most in each: (its title, its devices)."""
    hosts = report.hosts
    by_host: dict[int, list[int]] = {}
    for key in keys:
        by_host.setdefault(key // HOST_STRIDE, []).append(key)
    panels = []
    for host, members in sorted(by_host.items()):
        name = hosts[host] if host < len(hosts) else ("this host" if len(by_host) == 1
                                                      else f"host {host}")
        chunks = [members[i:i + LINES_AT_MOST] for i in range(0, len(members), LINES_AT_MOST)]
        for chunk in chunks:
            first, last = chunk[0] % HOST_STRIDE, chunk[-1] % HOST_STRIDE
            panels.append((f"{name}: GPUs {first}-{last}" if len(chunks) > 1 or first != last
                           else f"{name}: GPU {first}", chunk))
    return panels


def _grid(count: int) -> tuple[int, list[dict], list[dict]]:
    """Rows of PANEL_COLUMNS panels: their count, and each panel's x and y axis (domains, the
    first panel's ranges shared by every other). Laid out here rather than by plotly's
    make_subplots, which takes half a second for eight panels on this machine."""
    rows = math.ceil(count / PANEL_COLUMNS)
    gap_x, gap_y = 0.05, min(0.3 / rows, 0.09)
    width = (1 - gap_x * (PANEL_COLUMNS - 1)) / PANEL_COLUMNS
    height = (1 - gap_y * (rows - 1)) / rows
    xaxes, yaxes = [], []
    for index in range(count):
        row, col = divmod(index, PANEL_COLUMNS)
        suffix = "" if index == 0 else str(index + 1)
        left, top = col * (width + gap_x), 1 - row * (height + gap_y)
        shared = {} if index == 0 else {"matches": "x"}
        # Clamped: the sums' rounding put the last row's bottom a hair below 0, refused by plotly
        xaxes.append({"domain": [left, min(1.0, left + width)], "anchor": f"y{suffix}", **shared,
                      "showticklabels": row == rows - 1 or index + PANEL_COLUMNS >= count})
        yaxes.append({"domain": [max(0.0, top - height), top], "anchor": f"x{suffix}",
                      **({} if index == 0 else {"matches": "y"}),
                      "showticklabels": col == 0})
    return rows, xaxes, yaxes


def small_multiples(report: RunReport, samples: Sequence[Sample], steps: Sequence[Step] = (),
                    now: float | None = None, axis: str = "run") -> go.Figure:
    """Memory over time, a panel per host (a host's GPUs as its lines, eight at most a panel),
    on one x and one y range, rank 0's phase bands in every panel. `axis` as `memory_figure`'s:
    the whole run, zoomed on training, or against the training steps."""
    keys = devices(report, samples)
    if now is None and samples:
        now = max(s.t for s in samples)
    by_step = live.step_position(report, steps) if axis == "step" else None
    if axis == "step" and by_step is None:
        axis = Phase.TRAINING
    window = live.training_window(report, now)
    first = last = None
    if by_step is not None:
        first = report.training.start_s
        last = report.training.end_s if report.training.done else steps[-1].t

    panels = _panels(report, keys)
    rows, xaxes, yaxes = _grid(len(panels))
    names, series = _names(report), _series(samples, keys)
    x_hover = "step %{x:.2f}" if by_step is not None else "%{x:.2f} s"
    bands = [] if by_step is not None else phase_bands(report.phases, now)
    traces, shapes, titles = [], [], []
    for index, (title, members) in enumerate(panels):
        suffix = "" if index == 0 else str(index + 1)
        colours = cycle(RUN_COLOURS)
        for key in members:
            t, used, _ = series.get(key, (np.array([]),) * 3)
            if by_step is not None:
                inside = (t >= first) & (t <= last)
                t, used = by_step(t[inside]), used[inside]
            name = names.get(key, f"GPU {key % HOST_STRIDE}")
            # A dict, not go.Scatter: the figure validates each trace once, not twice.
            traces.append({
                "type": "scatter", "x": t, "y": used / MIB, "name": name, "mode": "lines",
                "showlegend": False, "xaxis": f"x{suffix}", "yaxis": f"y{suffix}",
                "line": {"color": next(colours), "width": 1.3},
                "hovertemplate": x_hover + "<br>%{y:.0f} MiB<extra>" + name + "</extra>"})
        shapes += [{"type": "rect", "name": band.name, "xref": f"x{suffix}",
                    "yref": f"y{suffix} domain", "x0": band.x0, "x1": band.x1, "y0": 0, "y1": 1,
                    "layer": "below", "fillcolor": phase_colour(band.name),
                    "opacity": BAND_OPACITY, "line": {"width": 0}} for band in bands]
        domain_x, domain_y = xaxes[index]["domain"], yaxes[index]["domain"]
        titles.append({"text": title, "x": sum(domain_x) / 2, "y": domain_y[1], "xref": "paper",
                       "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                       "showarrow": False, "font": {"size": 12, "color": CURVE_COLOUR}})
    x_title = {"run": "seconds since the run started", Phase.TRAINING: "seconds (zoomed on training)",
               "step": "training step"}[axis]
    layout: dict = {"shapes": shapes, "annotations": titles, "height": PANEL_PX * rows + 90,
                    "plot_bgcolor": "white", "margin": {"l": 10, "r": 10, "t": 30, "b": 10},
                    "hovermode": "closest", "showlegend": False,
                    "uirevision": f"run-{report.id}-{axis}-panels"}
    for index, (x, y) in enumerate(zip(xaxes, yaxes)):
        suffix = "" if index == 0 else str(index + 1)
        layout[f"xaxis{suffix}"] = {**x, "rangemode": "tozero", "showgrid": True}
        layout[f"yaxis{suffix}"] = {**y, "rangemode": "tozero"}
    layout["xaxis"]["title"] = {"text": x_title}
    layout["yaxis"]["title"] = {"text": words.axis_title(report.backend)}
    if axis == Phase.TRAINING and window is not None:
        layout["xaxis"]["range"] = list(window)
    return go.Figure(data=traces, layout=layout)


def heat_strip(report: RunReport, samples: Sequence[Sample], now: float | None = None
               ) -> go.Figure:
    """A row per GPU (its ranks' labels), time across in HEAT_COLUMNS bins, the colour each bin's
    highest reading as a fraction of the device's memory (MiB where the device's total is not
    known, and for CPU ranks); the ends of rank 0's phases as thin lines across every row."""
    keys = devices(report, samples)
    series = _series(samples, keys)
    if now is None:
        now = max((s.t for s in samples), default=0.0)
    width = max(now, 1e-9) / HEAT_COLUMNS
    totals = {key: series[key][2][-1] if key in series else np.nan for key in keys}
    # A fraction of each GPU's memory; a CPU rank's RSS in MiB (a fraction of the host's RAM is
    # a few hundredths for every rank: one colour).
    fraction = report.on_gpu and bool(keys) and all(np.isfinite(total) and total > 0
                                                    for total in totals.values())
    grid = np.full((len(keys), HEAT_COLUMNS), np.nan)
    for row, key in enumerate(keys):
        if key not in series:
            continue
        t, used, _ = series[key]
        where = np.minimum((t / width).astype(int), HEAT_COLUMNS - 1)
        highest = np.full(HEAT_COLUMNS, -np.inf)
        np.maximum.at(highest, where, used / (totals[key] if fraction else MIB))
        grid[row] = np.where(np.isfinite(highest), highest, np.nan)
    names = _names(report)
    labels = [names.get(key, f"GPU {key % HOST_STRIDE}") for key in keys]
    unit = "of the device" if fraction else "MiB"
    figure = go.Figure(go.Heatmap(
        z=grid, x=(np.arange(HEAT_COLUMNS) + 0.5) * width, y=labels, colorscale=HEAT_SCALE,
        zmin=0, zmax=1 if fraction else None, xgap=0, ygap=1,
        colorbar={"title": {"text": "used, " + ("fraction of<br>the device" if fraction
                                                 else "MiB")}, "thickness": 12},
        hovertemplate="%{y}<br>%{x:.1f} s: %{z:" + (".1%" if fraction else ".0f") + "} " + unit
                      + "<extra></extra>"))
    ends = [p for p in report.phases if p.done]
    figure.update_layout(
        shapes=[{"type": "line", "name": p.name, "xref": "x", "yref": "paper", "x0": p.end_s,
                 "x1": p.end_s, "y0": 0, "y1": 1, "line": {"color": phase_colour(p.name),
                                                           "width": 2}} for p in ends],
        height=max(HEAT_ROW_PX * len(keys), HEAT_LEAST_PX) + 110, plot_bgcolor="white",
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis={"title": {"text": "seconds since the run started (lines: rank 0's phase ends)"},
               "range": [0, now]},
        yaxis={"autorange": "reversed", "tickfont": {"size": 10, "color": CURVE_COLOUR},
               "type": "category"},
        uirevision=f"heat-{report.id}")
    return figure
