"""What several figures draw alike: store rows as arrays, where a phase's band lies, label rows
that never overlap, and a run's loss and step time against its steps."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from anatomy.analysis.report import PhaseReading, RunReport
from anatomy.store import Sample, Step

LABEL_ROW_PX = 18  # a label that would overlap the one before it goes one row lower
# Labels are placed before the browser knows the chart's width: assume the narrowest it is drawn
# at (a 1,000 px window with the sidebar open), so they never overlap where it is wider.
ASSUMED_PLOT_PX = 560
CHAR_PX = 7.2  # a bold 12 px Source Sans character, on average
Y_PAD = 0.05  # a y axis's room above its highest point, as a share of its span (autorange)
TITLE_CHAR_PX = 6.6  # a 12 px Source Sans character, on average


def assumed_plot_height(label_rows: int, figure_px: int = 440) -> float:
    """A chart's plot height, in the pixels its labels are moved by, at the narrowest it is
    drawn, `label_rows` rows of labels above it: the picture of a figure `figure_px` tall
    (views/figures/svg.py: 680 px wide for 900), less the room above and below the plot."""
    return figure_px * 680 / 900 - 12 - LABEL_ROW_PX * label_rows - 74


def fit_words(label: str, room: int, lines: int = 2, note: str | None = None) -> str:
    """A run's " · "-separated label in `room` characters a line, on up to `lines` lines (Plotly's
    <br>), the last cut with an ellipsis where it goes on; `note` beside its first word (the run's
    id), which is never cut. On one line a user's names ("Run 1 · user t5 ·
    T5ForConditionalGeneration") run over their neighbours'."""
    first, *rest = label.split(" · ")
    packed: list[str] = []
    for word in [first + (f" ({note})" if note else ""), *rest]:
        if packed and len(packed[-1]) + 3 + len(word) <= room:
            packed[-1] += " · " + word
        else:
            packed.append(word)
    if len(packed) > lines:
        packed = [*packed[:lines - 1], " · ".join(packed[lines - 1:])]
    return "<br>".join(line if len(line) <= room else _cut(line, room) for line in packed)


def _cut(line: str, room: int) -> str:
    """`line` in `room` characters, an ellipsis at its end; never half an escaped character
    ("&l…" of "&lt;")."""
    return re.sub(r"&[#\w]*$", "", line[:room - 1]).rstrip() + "…"


def column(rows: Sequence[tuple], key: str, scale: float = 1.0) -> np.ndarray:
    """One field of store rows as an array, divided by `scale`."""
    # numpy arrays reach the browser as binary typed arrays, a far smaller message than JSON
    # numbers on every refresh. (Importing numpy here, with this module, also keeps two sessions
    # from racing to import it halfway inside plotly's serialiser.)
    return np.fromiter((getattr(r, key) for r in rows), dtype=float, count=len(rows)) / scale


class Band(NamedTuple):
    """Where a phase's band lies on the time axis."""
    name: str
    x0: float
    x1: float
    open: bool  # the phase still lasts


def phase_bands(phases: Sequence[PhaseReading], now: float | None) -> list[Band]:
    """Where each phase's band lies: from the previous phase's end (0 for the first) to its own end,
    or to `now` while it lasts. The rise between two states (torch loading, the model loading) is
    therefore inside the band of the state it leads to."""
    bands = []
    previous_end = 0.0
    for phase in phases:
        end = phase.end_s
        if end is None:
            end = max(now if now is not None else phase.start_s, phase.start_s)
        bands.append(Band(phase.name, previous_end, end, not phase.done))
        previous_end = end
    return bands


def label_rows(starts: Sequence[float], texts: Sequence[str], span: float,
               plot_px: float = ASSUMED_PLOT_PX) -> list[int]:
    """A row for each label that starts at x = `starts[i]` (left-aligned), so that no two labels
    in one row overlap: the first row whose last label ends before this one begins."""
    ends: list[float] = []  # where each row's last label ends, in x units
    rows = []
    per_px = span / plot_px if span > 0 else 0.0
    for x, label in zip(starts, texts):
        width = (len(label) * CHAR_PX + 8) * per_px
        row = next((r for r, end in enumerate(ends) if end <= x), len(ends))
        if row == len(ends):
            ends.append(x + width)
        else:
            ends[row] = x + width
        rows.append(row)
    return rows


def training_rows(report: RunReport, samples: Sequence[Sample]) -> list[Sample]:
    """The samples of the GPU the run trains on (its RSS on a CPU)."""
    return [s for s in samples if s.gpu == report.gpu]


def step_times(report: RunReport, steps: Sequence[Step]) -> np.ndarray:
    """Seconds each step took: from the previous step's end (step 1: from training's start)."""
    training = report.training
    if training is None or not steps:
        return np.array([])
    ends = column(steps, "t")
    # To the microsecond: steps of one length differ by 1e-15 s of float noise, and an axis over
    # that noise reads 0.2999999999999933 to 0.3000000000000006.
    return np.round(np.diff(np.concatenate([[training.start_s], ends])), 6)


def steps_traces(figure: go.Figure, report: RunReport, steps: Sequence[Step], colour: str,
                 name: str, show_legend: bool) -> None:
    """A run's loss (row 1) and time a step (row 2) against its training steps."""
    numbers = column(steps, "step")
    losses = [s for s in steps if s.loss is not None]
    figure.add_trace(go.Scatter(
        x=column(losses, "step"), y=column(losses, "loss"), mode="lines+markers", name=name,
        legendgroup=name, showlegend=show_legend, line={"color": colour, "width": 1.8},
        marker={"size": 4}, hovertemplate="%{y:.4f}<extra>" + name + "</extra>"), row=1, col=1)
    figure.add_trace(go.Scatter(
        x=numbers, y=step_times(report, steps), mode="lines+markers", name=name,
        legendgroup=name, showlegend=False, line={"color": colour, "width": 1.8},
        marker={"size": 4}, hovertemplate="%{y:.3f} s<extra>" + name + "</extra>"), row=2, col=1)
