"""Several runs side by side, as the Compare page draws them: memory aligned at a phase (overlaid,
and as small multiples), what each phase added, loss and time a step; and a sweep's grid."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy.analysis.compare import PART_ORDER, memory_parts, phase_start
from anatomy.analysis.report import RunReport
from anatomy.analysis.sweeps import SweepGrid
from anatomy.store import Sample, Step
from anatomy.units import MIB, MIB_NAME, in_mib, mib_text
from anatomy.views import text as words
from anatomy.views.compare import bar_label, run_labels
from anatomy.views.figures.layout import (
    ASSUMED_PLOT_PX,
    TITLE_CHAR_PX,
    column,
    fit_words,
    phase_bands,
    steps_traces,
    training_rows,
)
from anatomy.views.figures.live import CEILING_SHOWN_FROM
from anatomy.views.style import (
    BAND_OPACITY,
    CEILING_COLOUR,
    CURVE_COLOUR,
    FAILED_COLOUR,
    RUN_COLOURS,
    part_colour,
    phase_colour,
)
from anatomy.vocabulary import Phase, Status, phase_name, phases_name


def _memory_axis_title(reports: Sequence[RunReport]) -> str:
    backends = {r.backend for r in reports}
    if len(backends) == 1:
        return words.axis_title(backends.pop())
    return in_mib("memory used") + ": GPU runs NVML, CPU runs RSS"



def _labels(reports: Sequence[RunReport], labels: dict[int, str] | None) -> dict[int, str]:
    return labels or run_labels(reports)


def training_range(reports: Sequence[RunReport], phase: str) -> list[float] | None:
    """The x range that holds every run's training phase, each shifted as the overlay shifts it
    (its `phase` begins at 0): the "training only" zoom of the Compare page."""
    spans = []
    for rep in reports:
        start, training = phase_start(rep, phase), rep.training
        if start is None or training is None:
            continue
        end = training.end_s if training.end_s is not None else training.start_s
        spans.append((training.start_s - start, end - start))
    if not spans:
        return None
    low, high = min(a for a, _ in spans), max(b for _, b in spans)
    margin = max(0.05, 0.03 * (high - low))
    return [low - margin, high + margin]


def overlay_figure(reports: Sequence[RunReport], samples_by_run: dict[int, Sequence[Sample]],
                   phase: str = Phase.TRAINING, labels: dict[int, str] | None = None,
                   training_only: bool = False) -> go.Figure:
    """Each run's memory (its training GPU, or its RSS) on one chart, shifted so that `phase`
    begins at 0 in every run: x = t − that phase's start. A run that never reached the phase is
    left out (the page says which). Each trace's `meta` holds its run id and its shift. `labels`
    name the runs (default: `views.compare.run_labels`, the options that differ)."""
    labels = _labels(reports, labels)
    named = phases_name(phase, (r.on_gpu for r in reports))
    figure = go.Figure()
    for colour, rep in zip(cycle(RUN_COLOURS), reports):
        start = phase_start(rep, phase)
        if start is None:
            continue
        rows = training_rows(rep, samples_by_run.get(rep.id, ()))
        label = labels[rep.id]
        figure.add_trace(go.Scatter(
            x=column(rows, "t") - start, y=column(rows, "used", MIB), name=label, mode="lines",
            line={"color": colour, "width": 2}, meta={"run": rep.id, "shift": start},
            hovertemplate="%{x:+.2f} s<br>%{y:.0f} MiB<extra>" + label + "</extra>"))
        ended = [p for p in rep.phases if p.done and p.memory_mb is not None]
        figure.add_trace(go.Scatter(
            x=[p.end_s - start for p in ended], y=[p.memory_mb for p in ended],
            mode="markers", name=f"{label}: end of phase", showlegend=False,
            marker={"size": 8, "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": colour}},
            hovertext=[f"{label}<br>end of {phase_name(p.name, rep.on_gpu)}: "
                       f"{mib_text(p.memory_bytes)}" for p in ended],
            hoverinfo="text"))
    figure.add_vline(x=0, line={"color": phase_colour(phase), "width": 2, "dash": "dash"},
                     annotation_text=f"<b>{named} begins</b>", annotation_position="top right",
                     annotation_bgcolor=phase_colour(phase), annotation_font_color=CURVE_COLOUR)
    xaxis = {"title": {"text": f"seconds since the {named} phase began"}, "zeroline": False}
    if training_only and training_range(reports, phase) is not None:
        xaxis["range"] = training_range(reports, phase)
    figure.update_layout(
        height=420, margin={"l": 10, "r": 10, "t": 30, "b": 10}, plot_bgcolor="white",
        xaxis=xaxis,
        yaxis={"title": {"text": _memory_axis_title(reports)}, "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest")
    return figure


SMALL_MULTIPLES_COLUMNS = 3


def panel_title(label: str, columns: int, note: str | None = None) -> str:
    """A panel's title in the room between its neighbours' (the plot's assumed width over the
    columns), on up to two lines (`fit_words`)."""
    return fit_words(label, int(ASSUMED_PLOT_PX / columns / TITLE_CHAR_PX), 2, note)


def small_multiples_figure(reports: Sequence[RunReport],
                           samples_by_run: dict[int, Sequence[Sample]],
                           phase: str = Phase.TRAINING, labels: dict[int, str] | None = None,
                           training_only: bool = False) -> go.Figure:
    """One panel per run, side by side (three to a row), with one x range and one y range for
    all: the same alignment as `overlay_figure`, each panel with its run's phase bands."""
    labels = _labels(reports, labels)
    columns = min(len(reports), SMALL_MULTIPLES_COLUMNS)
    rows = -(-len(reports) // columns)
    named = phases_name(phase, (r.on_gpu for r in reports))
    titles = []
    for rep in reports:
        aligned = phase_start(rep, phase) is not None
        titles.append(panel_title(labels[rep.id], columns,
                                  None if aligned else
                                  f"no {phase_name(phase, rep.on_gpu)} phase"))
    figure = make_subplots(rows=rows, cols=columns, shared_yaxes="all", shared_xaxes="all",
                           subplot_titles=titles,
                           horizontal_spacing=0.03, vertical_spacing=0.12)
    shapes: list[dict] = []
    for index, (colour, rep) in enumerate(zip(cycle(RUN_COLOURS), reports)):
        row, col = index // columns + 1, index % columns + 1
        start = phase_start(rep, phase) or 0.0
        points = training_rows(rep, samples_by_run.get(rep.id, ()))
        figure.add_trace(go.Scatter(
            x=column(points, "t") - start, y=column(points, "used", MIB), mode="lines",
            name=labels[rep.id], showlegend=False, line={"color": colour, "width": 1.8},
            meta={"run": rep.id, "shift": start},
            hovertemplate="%{x:+.2f} s<br>%{y:.0f} MiB<extra>Run " + str(rep.id) + "</extra>"),
            row=row, col=col)
        now = max((s.t for s in points), default=None)
        axis = "" if index == 0 else str(index + 1)  # make_subplots numbers them row by row
        shapes += [{"type": "rect", "xref": f"x{axis}", "yref": f"y{axis} domain",
                    "x0": band.x0 - start, "x1": band.x1 - start, "y0": 0, "y1": 1,
                    "fillcolor": phase_colour(band.name), "opacity": BAND_OPACITY,
                    "line": {"width": 0}, "layer": "below", "name": band.name}
                   for band in phase_bands(rep.phases, now)]
    figure.update_layout(shapes=shapes)  # once: added one by one, each re-validates them all
    figure.update_yaxes(rangemode="tozero")
    figure.update_yaxes(title_text=_memory_axis_title(reports), col=1)
    figure.update_xaxes(title_text=f"s since {named} began", row=rows)
    figure.update_xaxes(showticklabels=True)  # shared: every panel keeps its own tick labels
    if training_only and training_range(reports, phase) is not None:
        figure.update_xaxes(range=training_range(reports, phase))
    figure.update_annotations(font_size=12)
    # Room above the first row for a title of two lines.
    figure.update_layout(height=300 * rows + 56, margin={"l": 10, "r": 10, "t": 56, "b": 10},
                         plot_bgcolor="white", hovermode="closest")
    return figure


BAR_PLOT_SHARE = 0.75  # of the assumed plot width, what the y axis and its title leave the bars
LEAST_BAR_ROOM = 10  # characters: a run's id and a few letters


def bar_room(runs: int) -> int | None:
    """Characters a line of a bar's label may take, its share of the plot; None where not even
    LEAST_BAR_ROOM fit (many runs: Plotly turns the labels aslant)."""
    room = int(ASSUMED_PLOT_PX * BAR_PLOT_SHARE / runs / TITLE_CHAR_PX)
    return room if room >= LEAST_BAR_ROOM else None


def memory_bars_figure(reports: Sequence[RunReport], labels: dict[int, str] | None = None
                       ) -> go.Figure:
    """A stacked bar per run (`analysis.compare.memory_parts`): the CUDA context, the weights, the training
    phase's increase (split into its measured components where the run has them); its peak as a
    marker, and its device's total as a line (a click away in the legend while far above)."""
    labels = _labels(reports, labels)
    room = bar_room(len(reports))
    parts = {rep.id: memory_parts(rep) for rep in reports}
    found = {p.part for rep in reports for p in parts[rep.id]}
    positions = {rep.id: index for index, rep in enumerate(reports)}
    figure = go.Figure()
    for key in (key for key in PART_ORDER if key in found):
        xs, ys, notes = [], [], []
        for rep in reports:
            for part in parts[rep.id]:
                if part.part == key:
                    xs.append(positions[rep.id])
                    ys.append(part.bytes / MIB)
                    notes.append(part.note)
        name = bar_label(key)
        figure.add_trace(go.Bar(
            x=xs, y=ys, name=name, marker={"color": part_colour(key)}, customdata=notes,
            hovertemplate="%{y:,.0f} MiB<br>%{customdata}<extra>" + name + "</extra>"))
    peaks = [(positions[r.id], r.summary.peak_mb) for r in reports
             if r.summary.peak_mb is not None]
    if peaks:
        figure.add_trace(go.Scatter(
            x=[x for x, _ in peaks], y=[y for _, y in peaks], name="peak", mode="markers+text",
            text=[f"peak {y:,} {MIB_NAME}" for _, y in peaks], textposition="top center",
            cliponaxis=False, marker={"symbol": "diamond", "size": 12, "color": CURVE_COLOUR},
            hovertemplate=f"peak %{{y:,}} {MIB_NAME}<extra></extra>"))
    totals = []
    for rep in reports:
        total = rep.device_total
        if total:
            totals.append((positions[rep.id], total / MIB, rep))
    if totals:
        near = any((r.summary.peak_mb or 0) >= CEILING_SHOWN_FROM * t for _, t, r in totals)
        xs, ys = [], []
        for x, total, _ in totals:
            xs += [x - 0.45, x + 0.45, None]
            ys += [total, total, None]
        figure.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", name="device total" + ("" if near else " (click to show)"),
            line={"color": CEILING_COLOUR, "width": 2, "dash": "dashdot"},
            visible=True if near else "legendonly", hovertemplate="total %{y:,.0f} MiB<extra></extra>"))
    figure.update_layout(
        barmode="stack", height=480, margin={"l": 10, "r": 10, "t": 70, "b": 10},
        plot_bgcolor="white", hovermode="closest",
        # Every run's place, a run without bars or peak too (Plotly's autorange covers only
        # what is drawn, and a run's label outside it is not written).
        xaxis={"tickmode": "array", "tickvals": list(positions.values()),
               # Each in its bar's room, on up to three lines, level: aslant, the last run's
               # label went past the chart's edge and was not drawn.
               "ticktext": [fit_words(labels[r.id], room, 3) if room else labels[r.id]
                            for r in reports],
               **({"tickangle": 0} if room else {}),
               "range": [-0.5, len(reports) - 0.5]},
        yaxis={"title": {"text": _memory_axis_title(reports)}, "rangemode": "tozero"},
        # Above the bars: below, it would meet tick labels of any number of lines.
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.08, "x": 0,
                "traceorder": "normal"})
    return figure


def steps_overlay_figure(reports: Sequence[RunReport], steps_by_run: dict[int, Sequence[Step]],
                         labels: dict[int, str] | None = None) -> go.Figure:
    """Each run's loss and time a step against its training steps, one colour per run (the same
    as in the memory overlay)."""
    labels = _labels(reports, labels)
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=("loss", "time a step (s)"))
    for colour, rep in zip(cycle(RUN_COLOURS), reports):
        steps = steps_by_run.get(rep.id, ())
        if steps:
            steps_traces(figure, rep, steps, colour, labels[rep.id], show_legend=True)
    figure.update_xaxes(title_text="training step", row=2, col=1)
    figure.update_layout(height=480, margin={"l": 10, "r": 10, "t": 80, "b": 10},
                         plot_bgcolor="white", hovermode="x unified",
                         legend={"orientation": "h", "yanchor": "bottom", "y": 1.1, "x": 0})
    return figure


def sweep_figure(result: SweepGrid, metric: str = "peak_mb") -> go.Figure:
    """A sweep's grid (`analysis.sweeps.grid`) for `metric` ("peak_mb" or "samples_per_second"):
    one varied option as bars, two as a heatmap with batch size (or the first option) across and
    the other down; a run that did not complete says how it ended."""
    names = list(result.vary)
    across = "batch_size" if "batch_size" in names else names[0]
    down = next((n for n in names if n != across), None)

    def values(name: str) -> list:
        seen = list(result.vary[name]) + [r.values[name] for r in result.runs]
        return list(dict.fromkeys(seen))

    xs = values(across)
    ys = values(down) if down else [None]
    z = [[None] * len(xs) for _ in ys]
    cells = [["not run"] * len(xs) for _ in ys]
    for run in result.runs:
        i = ys.index(run.values[down]) if down else 0
        j = xs.index(run.values[across])
        value = getattr(run, metric)
        if run.status == Status.COMPLETED and value is not None:
            z[i][j] = value
            cells[i][j] = f"{value:,.0f}" if metric == "peak_mb" else f"{value:,.2f}"
        else:
            cells[i][j] = run.status
    title = in_mib("peak memory") if metric == "peak_mb" else "samples/second"
    if down is None:
        return _sweep_bars(xs, z[0], cells[0], across, title)
    # The colour scale starts at 0, as a bar would: 554 and 559 MB look alike, as they are.
    figure = go.Figure(go.Heatmap(
        x=[str(x) for x in xs], y=[str(y) for y in ys], z=z, text=cells,
        texttemplate="%{text}", colorscale="Viridis" if metric == "peak_mb" else "Cividis",
        zmin=0, hoverongaps=True, colorbar={"title": {"text": title}},
        hovertemplate=f"{across} %{{x}}<br>{down} %{{y}}<br>%{{text}}<extra></extra>"))
    figure.update_layout(
        height=160 + 60 * len(ys), margin={"l": 10, "r": 10, "t": 40, "b": 10},
        title={"text": title},
        xaxis={"title": {"text": across.replace("_", " ")}, "type": "category"},
        yaxis={"title": {"text": down.replace("_", " ")}, "type": "category"})
    return figure


def _sweep_bars(xs: list, values: list, cells: list[str], across: str, title: str) -> go.Figure:
    """A sweep of one option: a bar per value from 0 (a heatmap's colours would make 554 and
    559 MB look far apart); a run that did not complete is named where its bar would be."""
    labels = [str(x) for x in xs]
    figure = go.Figure(go.Bar(
        x=labels, y=[0 if v is None else v for v in values], text=cells, textposition="outside",
        cliponaxis=False, marker={"color": [CURVE_COLOUR if v is not None else FAILED_COLOUR
                                            for v in values]},
        hovertemplate=f"{across.replace('_', ' ')} %{{x}}<br>%{{text}}<extra></extra>"))
    figure.update_layout(
        height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10}, title={"text": title},
        plot_bgcolor="white", xaxis={"title": {"text": across.replace("_", " ")},
                                     "type": "category"},
        yaxis={"title": {"text": title}, "rangemode": "tozero"})
    return figure

