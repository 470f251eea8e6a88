"""One run taken apart, as the Anatomy page draws it: measured next to predicted as waterfalls,
the moments of a step, the first steps of training up close, and where the time goes by class of
operation next to the paper's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy.analysis.operations import ClassShare
from anatomy.analysis.report import RunReport
from anatomy.prediction.breakdown import CpuPeak
from anatomy.store import Sample, Step
from anatomy.units import MIB
from anatomy.views import text as words
from anatomy.views.anatomy import WATERFALL_ORDER, MomentRow, Repetition, WaterfallStep
from anatomy.views.figures.layout import (
    ASSUMED_PLOT_PX,
    CHAR_PX,
    LABEL_ROW_PX,
    column,
    label_rows,
    training_rows,
)
from anatomy.views.style import (
    ALLOCATED_COLOUR,
    CURVE_COLOUR,
    FAILED_COLOUR,
    NEUTRAL_COLOUR,
    PAPER_COLOUR,
    PHASE_COLOURS,
    PREDICTED_COLOUR,
    TOTAL_COLOUR,
)
from anatomy.vocabulary import Backend, Phase


def anatomy_waterfall_figure(sides: dict[str, list[WaterfallStep]]) -> go.Figure:
    """`views.anatomy.waterfall` as grouped waterfalls, measured next to predicted: each part adds,
    "all at once" is their sum, "never held at once" takes away what a step never holds together,
    leaving the peak."""
    colours = {"measured": CURVE_COLOUR, "predicted": PREDICTED_COLOUR}
    labels = {step.label for steps in sides.values() for step in steps}
    order = [label for label in WATERFALL_ORDER if label in labels]
    figure = go.Figure()
    for side, steps in sides.items():
        figure.add_trace(go.Waterfall(
            name=side, x=[step.label for step in steps], measure=[step.measure for step in steps],
            y=[step.bytes / MIB for step in steps], textposition="outside",
            # The totals only: the parts' figures are in the table below, and side by side
            # their labels would collide.
            texttemplate=["%{final:,.0f}" if step.measure == "total" else "" for step in steps],
            textfont={"size": 11},
            increasing={"marker": {"color": colours.get(side, NEUTRAL_COLOUR)}},
            decreasing={"marker": {"color": FAILED_COLOUR}},
            totals={"marker": {"color": TOTAL_COLOUR}},
            connector={"line": {"color": NEUTRAL_COLOUR, "width": 1}},
            hovertemplate="%{x}: %{y:+,.0f} MiB (running total %{final:,.0f})"
                          f"<extra>{side}</extra>"))
    figure.update_layout(
        waterfallmode="group", height=460, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        plot_bgcolor="white", yaxis={"title": {"text": "MiB"}, "rangemode": "tozero"},
        xaxis={"categoryorder": "array", "categoryarray": order},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0})
    return figure


def moments_figure(rows: Sequence[MomentRow], sum_of_parts: int) -> go.Figure:
    """Memory at each moment of a step (`views.anatomy.moment_rows`), predicted and measured, under
    the line of the sum of the parts: no moment reaches it."""
    labels = [r.moment for r in rows]
    figure = go.Figure()
    for key, colour in (("predicted", PREDICTED_COLOUR), ("measured", CURVE_COLOUR)):
        values = [None if getattr(r, key) is None else getattr(r, key) / MIB for r in rows]
        if any(v is not None for v in values):
            figure.add_trace(go.Bar(
                x=labels, y=values, name=key, marker={"color": colour},
                text=[None if v is None else f"{v:,.0f}" for v in values], textposition="outside",
                hovertemplate="%{x}: %{y:,.0f} MiB<extra>" + key + "</extra>"))
    figure.add_hline(y=sum_of_parts / MIB, line={"color": FAILED_COLOUR, "dash": "dash", "width": 1.5},
                     annotation_text=f"sum of the parts (predicted): {sum_of_parts / MIB:,.0f} MiB",
                     annotation_position="top left")
    figure.update_layout(
        barmode="group", height=380, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        plot_bgcolor="white", yaxis={"title": {"text": "tensor memory (MiB)"},
                                     "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0})
    return figure


FIRST_STEPS = 3


def first_steps_window(report: RunReport, steps: Sequence[Step], count: int = FIRST_STEPS
                       ) -> tuple[float, float] | None:
    """The stretch of time the first-steps chart shows: a little before the training phase
    begins to a little after step `count` ends (None without a training phase)."""
    training = report.training
    if training is None:
        return None
    start = training.start_s
    first = [s for s in steps if s.step <= count]
    end = first[-1].t if first else (training.end_s or start + 1.0)
    margin = max(0.05, 0.25 * (end - start))
    return start - margin, end + margin


def first_steps_figure(report: RunReport, samples: Sequence[Sample], steps: Sequence[Step],
                       count: int = FIRST_STEPS, expected: CpuPeak | None = None,
                       repeated: Repetition | None = None) -> go.Figure:
    """The training phase's first `count` steps up close: the memory curve, a line where each
    step ends (from the worker's step marks), and notes whose arrows end on the curve: after
    step 1 the gradients and the optimizer states exist, and from step 2 on the memory repeats,
    or not (`repeated`: `views.anatomy.repetition`; no note without it). Labels never overlap
    (`label_rows`) and notes lean towards the middle of the chart, within its edges."""
    window = first_steps_window(report, steps, count)
    figure = go.Figure()
    if window is None:
        return figure
    x0, x1 = window
    rows = [s for s in training_rows(report, samples) if x0 <= s.t <= x1]
    times, used = column(rows, "t"), column(rows, "used", MIB)
    figure.add_trace(go.Scatter(
        x=times, y=used, mode="lines+markers",
        name="CPU RSS" if report.backend == Backend.CPU_RSS else f"GPU {report.gpu}",
        line={"color": CURVE_COLOUR, "width": 2}, marker={"size": 3},
        hovertemplate="%{x:.3f} s<br>%{y:.0f} MiB<extra></extra>"))
    marked = [s for s in steps if s.step <= count]
    allocated = [s for s in marked if s.allocated is not None]
    if allocated:
        figure.add_trace(go.Scatter(
            x=[s.t for s in allocated], y=[s.allocated / MIB for s in allocated],
            mode="markers", name="torch allocated at the step's end",
            marker={"color": ALLOCATED_COLOUR, "size": 9, "symbol": "x"}))
    start = report.training.start_s
    figure.add_vline(x=start, line={"color": PHASE_COLOURS[Phase.TRAINING], "width": 2})
    texts = ["training begins", *(f"step {s.step} ends" for s in marked)]
    places = [start, *(s.t for s in marked)]
    for row, (x, label) in zip(label_rows(places, texts, x1 - x0), zip(places, texts)):
        figure.add_annotation(x=x, xref="x", y=1, yref="paper", xanchor="left", yanchor="top",
                              yshift=-LABEL_ROW_PX * row, text=label, showarrow=False,
                              font={"size": 11, "color": CURVE_COLOUR},
                              bgcolor=PHASE_COLOURS[Phase.TRAINING] if x == start
                              else "rgba(255,255,255,0.85)")
    for step in marked:
        figure.add_vline(x=step.t, line={"color": "#555555", "width": 1, "dash": "dot"})
    lines: list[tuple[float, int]] = []  # the lines drawn across: height, and where their words go
    if expected is not None:  # on the curve's own axis: what the prediction covers, and not
        before = expected.process / MIB
        figure.add_hline(y=before, line={"color": NEUTRAL_COLOUR, "dash": "dot", "width": 1.5},
                         annotation_text=f"before training, beyond the weights: {before:,.0f} MiB"
                                         " (measured; no prediction covers it)",
                         annotation_position="bottom right")
        peak = expected.rss / MIB
        figure.add_hline(y=peak, line={"color": PREDICTED_COLOUR, "dash": "dash", "width": 1.5},
                         annotation_text=f"predicted peak: {peak:,.0f} MiB (the line below + the "
                                         f"tensors' {expected.tensors / MIB:,.0f} MiB, predicted)",
                         annotation_position="top right")
        lines = [(before, -1), (peak, 1)]
    yaxis: dict = {"title": {"text": words.axis_title(report.backend)}}
    low, high = (float(used.min()), float(used.max())) if len(times) else (0.0, 0.0)
    if lines and len(times):
        # Room below the lowest line for the label written under it: with the process's line at
        # the range's foot, its words lay over the time axis's numbers.
        heights = [low, high, *(y for y, _ in lines)]
        bottom, top = min(heights), max(heights)
        span = (top - bottom) or 1.0
        yaxis["range"] = [bottom - 0.15 * span, top + 0.08 * span]
    if marked and len(times):
        notes = [(marked[0].t, "after step 1: gradients and optimizer states exist")]
        if len(marked) > 1 and repeated is not None:
            notes.append((marked[-1].t, repeated.note()))
        levels = _note_heights(yaxis.get("range", (low, high)), (low, high), lines, len(notes))
        for (x, label), level in zip(notes, levels):
            # The text sits towards the middle of the chart, each note at a height of its own
            # (on the y axis, whatever the chart's size in pixels): two notes never meet.
            leftwards = x > (x0 + x1) / 2
            figure.add_annotation(
                x=x, y=float(np.interp(x, times, used)), text=label, showarrow=True, arrowhead=2,
                arrowcolor=CURVE_COLOUR, ax=_lean(x, x0, x1, label, leftwards),
                ay=level, ayref="y",
                xanchor="right" if leftwards else "left", bgcolor="rgba(255,255,255,0.9)",
                bordercolor=PHASE_COLOURS[Phase.TRAINING], borderwidth=1,
                font={"size": 12, "color": CURVE_COLOUR})
    figure.update_layout(
        height=400, margin={"l": 10, "r": 10, "t": 30, "b": 10}, plot_bgcolor="white",
        xaxis={"title": {"text": "seconds since the run started"}, "range": [x0, x1]},
        yaxis=yaxis,
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0}, hovermode="closest")
    return figure


NOTE_LEAN_PX = 50  # how far a note's text sits across from the point its arrow shows
# The notes' heights, as a share of the curve's span in the window: the earlier one lower.
NOTE_LEVELS = (0.22, 0.45)
# A note's box (a row of 12 px text, its border), and a line's words beside it, as a share of
# the y range of a chart 400 px high.
NOTE_SHARE = 0.08
NOTE_GAP = 1.25  # between two notes' middles, in notes' heights: a little air between them


def _note_heights(shown: tuple[float, float], curve: tuple[float, float],
                  lines: list[tuple[float, int]], count: int) -> list[float]:
    """Where `count` notes sit on the y axis. Where the range is the
    curve's own, at NOTE_LEVELS of its span (below the training's plateau the notes point at).
    Where it also holds lines (`lines`: height, and +1 where their words go above, -1 below),
    the curve may lie far from the range's middle, and shares of its span put every note on
    it: the notes go where neither the curve, nor a line's words, nor the other note is,
    nearest the curve, the earlier one nearer (its arrow, at the left, then crosses no note)."""
    low, high = curve
    if not lines:
        return [low + level * (high - low) for level in NOTE_LEVELS[:count]]
    bottom, top = shown
    box = NOTE_SHARE * (top - bottom)
    taken = [(low, high), *((y, y + side * box) for y, side in lines)]
    taken = [(min(a, b), max(a, b)) for a, b in taken]
    free = [bottom + box / 2 + k * (top - bottom - box) / 100 for k in range(101)]
    chosen: list[float] = []
    for y in sorted(free, key=lambda y: min(abs(y - low), abs(y - high))):
        clear = all(y + box / 2 < a or y - box / 2 > b for a, b in taken)
        if clear and all(abs(y - other) >= NOTE_GAP * box for other in chosen):
            chosen.append(y)
            if len(chosen) == count:
                return chosen
    return [low + level * (high - low) for level in NOTE_LEVELS[:count]]


def _lean(x: float, x0: float, x1: float, label: str, leftwards: bool) -> float:
    """How far across (px) a note's text sits from its point at `x`: NOTE_LEAN_PX towards the
    middle, less where the text would then leave the plot at the narrowest it is drawn
    (ASSUMED_PLOT_PX); a wider plot only has more room."""
    at = (x - x0) / (x1 - x0) * ASSUMED_PLOT_PX
    width = len(label) * CHAR_PX + 8
    if leftwards:  # the text ends at the arrow's tail: it must begin inside
        return -min(NOTE_LEAN_PX, max(0.0, at - width))
    return min(NOTE_LEAN_PX, ASSUMED_PLOT_PX - width - at)


def operations_figure(rows: Sequence[ClassShare]) -> go.Figure:
    """`operations.comparison` as two panels, the share of FLOPs and the share of time per
    operation class: this run next to the paper's BERT figures (none for "other")."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("share of FLOPs", "share of time"),
                           shared_yaxes=True, horizontal_spacing=0.04)
    classes = [r.kind.replace(" ", "<br>", 1) for r in rows]
    for col, (ours, papers) in enumerate((("flop_share", "paper_flop_share"),
                                          ("time_share", "paper_time_share")), start=1):
        for key, name, colour in ((ours, "this run", CURVE_COLOUR),
                                  (papers, "Ivanov et al. (BERT, PyTorch)", PAPER_COLOUR)):
            values = [None if getattr(r, key) is None else getattr(r, key) * 100 for r in rows]
            figure.add_trace(go.Bar(
                x=classes, y=values, name=name, marker={"color": colour}, showlegend=col == 1,
                legendgroup=name, text=[None if v is None else f"{v:.1f}%" for v in values],
                textposition="outside", cliponaxis=False,
                hovertemplate="%{x}: %{y:.2f}%<extra>" + name + "</extra>"), row=1, col=col)
    figure.update_yaxes(title_text="%", range=[0, 112], col=1)
    figure.update_xaxes(tickangle=0)
    figure.update_layout(barmode="group", height=380, plot_bgcolor="white",
                         margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         legend={"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0})
    return figure
