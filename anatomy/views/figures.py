"""Plotly figures of a run, built from store rows and `RunReport`s: no Streamlit, no browser.

The pages only pass these figures to `st.plotly_chart`; the tests read them as plain objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy.analysis import breakdown, compare
from anatomy.analysis.operations import ClassShare
from anatomy.analysis.report import PhaseReading, RunListing, RunReport
from anatomy.analysis.sweeps import SweepGrid
from anatomy.store import GpuStatus, HostStatus, Sample, Step
from anatomy.units import MIB
from anatomy.views import text as words

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
PROFILING_COLOUR = "#7F8C9A"
CEILING_SHOWN_FROM = 0.25  # of the total: the ceiling is drawn once the curve comes this close
LABEL_ROW_PX = 18  # a label that would overlap the one before it goes one row lower
# Labels are placed before the browser knows the chart's width: assume the narrowest it is drawn
# at (a 1,000 px window with the sidebar open), so they never overlap where it is wider.
ASSUMED_PLOT_PX = 560
CHAR_PX = 7.2  # a bold 12 px Source Sans character, on average
# The x axes a run's memory can be drawn on: the whole run in seconds, its training phase in
# seconds, or its training steps.
AXES = ("run", "training", "step")


def phase_colour(name: str) -> str:
    return PHASE_COLOURS.get(name, "#BBBBBB")


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


def _column(rows: Sequence[tuple], key: str, scale: float = 1.0) -> np.ndarray:
    # numpy arrays reach the browser as binary typed arrays, a far smaller message than JSON
    # numbers on every refresh. (Importing numpy here, with this module, also keeps two sessions
    # from racing to import it halfway inside plotly's serialiser.)
    return np.fromiter((getattr(r, key) for r in rows), dtype=float, count=len(rows)) / scale


def step_position(report: RunReport, steps: Sequence[Step]):
    """t (seconds since the run started) -> training step, as a fraction: 0 where training began,
    k where step k ended, linear in between. None before the first step ends."""
    training = report.training
    if training is None or not steps:
        return None
    times = np.array([training.start_s, *(s.t for s in steps)])
    numbers = np.array([0.0, *(float(s.step) for s in steps)])

    def position(t: np.ndarray) -> np.ndarray:
        return np.interp(t, times, numbers)
    return position


def training_window(report: RunReport, now: float | None) -> tuple[float, float] | None:
    """The training phase's stretch of time, a little margin either side (None before it)."""
    training = report.training
    if training is None:
        return None
    end = training.end_s if training.end_s is not None else max(now or training.start_s,
                                                                training.start_s)
    margin = max(0.05, 0.03 * (end - training.start_s))
    return training.start_s - margin, end + margin


def memory_figure(report: RunReport, samples: Sequence[Sample], steps: Sequence[Step] = (),
                  now: float | None = None, axis: str = "run") -> go.Figure:
    """Memory over time for one run: a line per GPU, phase bands, the end-of-phase markers, the
    torch allocator's lines where the worker reported them, and the device's total as a ceiling.

    `samples` are store rows (`Store.decimated` keeps every peak); `now` is the time the open phase
    has reached (default: the last sample). `axis` (one of AXES): "run" draws the whole run in
    seconds; "training" the same, zoomed on the training phase (zoom out to see the rest); "step"
    draws the training phase alone against its steps (x = the step, fractions between two ends)."""
    backend = report.backend
    if now is None and samples:
        now = max(s.t for s in samples)
    by_step = step_position(report, steps) if axis == "step" else None
    if axis == "step" and by_step is None:
        axis = "training"  # no step has ended yet: seconds until one has
    window = training_window(report, now)
    if axis == "step":
        first = report.training.start_s
        last = report.training.end_s if report.training.done else steps[-1].t
        samples = [s for s in samples if first <= s.t <= last]
        steps = [s for s in steps if s.t <= last]

    def x_of(values) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        return by_step(values) if by_step is not None else values

    figure = go.Figure()
    by_gpu: dict[int, list[Sample]] = {}
    # Several GPUs (issue 12): one line per GPU the run trains on, named by its rank; the
    # machine's other GPUs are not the run's.
    rank_of = {r.gpu: r.rank for r in report.ranks if r.gpu is not None}
    for sample in samples:
        if not rank_of or sample.gpu in rank_of:
            by_gpu.setdefault(sample.gpu, []).append(sample)
    others = cycle(OTHER_GPU_COLOURS)
    x_hover = "step %{x:.2f}" if by_step is not None else "%{x:.2f} s"
    for gpu, rows in sorted(by_gpu.items()):
        trains = gpu == report.gpu or gpu in rank_of
        if backend == "cpu-rss":
            name = ("CPU RSS of the training processes" if report.ranks
                    else "CPU RSS of the training process")
        elif gpu in rank_of:
            name = f"GPU {gpu} (rank {rank_of[gpu]})"
        else:
            name = f"GPU {gpu}" + (" (training)" if trains and len(by_gpu) > 1 else "")
        # SVG, not WebGL: a decimated curve is a few thousand points, and every WebGL chart holds
        # one of the browser's few GL contexts (a live page redraws every second).
        figure.add_trace(go.Scatter(
            x=x_of(_column(rows, "t")), y=_column(rows, "used", MIB), name=name,
            mode="lines", line={"color": CURVE_COLOUR if gpu == report.gpu else next(others),
                                "width": 2 if trains else 1.2},
            hovertemplate=x_hover + "<br>%{y:.0f} MiB<extra>" + name + "</extra>"))

    allocator = [s for s in steps if s.allocated is not None]
    for key, label, colour, dash in (("allocated", "torch allocated", ALLOCATED_COLOUR, "dot"),
                                     ("reserved", "torch reserved", RESERVED_COLOUR, "dash")):
        points = [s for s in allocator if getattr(s, key) is not None]
        if points:
            figure.add_trace(go.Scatter(
                x=x_of(_column(points, "t")), y=_column(points, key, MIB), name=label,
                mode="lines", line={"color": colour, "width": 1.5, "dash": dash},
                hovertemplate="step %{customdata}<br>%{y:.0f} MiB<extra>" + label + "</extra>",
                customdata=[s.step for s in points]))

    totals = [s.total for s in by_gpu.get(report.gpu, []) if s.total]
    if totals and now is not None:
        total = totals[-1]
        peak = max(s.used for s in by_gpu[report.gpu])
        # A ceiling far above the curve would flatten it (an H200's 140 GiB over BERT's 8 GiB, a
        # machine's RAM over one process): then it waits in the legend, a click away.
        near = peak >= CEILING_SHOWN_FROM * total
        what = "RAM" if backend == "cpu-rss" else f"GPU {report.gpu}"
        ends = [0.0, now] if by_step is None else [0.0, float(steps[-1].step)]
        figure.add_trace(go.Scatter(
            x=ends, y=[total / MIB] * 2, mode="lines",
            name=f"{what} total: {total / 2**30:.1f} GiB" + ("" if near else " (click to show)"),
            line={"color": CEILING_COLOUR, "width": 1, "dash": "dashdot"},
            visible=True if near else "legendonly", hoverinfo="name"))

    ended = [p for p in report.phases if p.done and p.memory_mb is not None]
    if by_step is not None:
        ended = [p for p in ended if p.name == "training"]
    if ended:
        figure.add_trace(go.Scatter(
            x=x_of([p.end_s for p in ended]), y=[p.memory_mb for p in ended],
            name="end of phase", mode="markers", cliponaxis=False,
            text=[f"{p.memory_mb} MB" for p in ended],
            marker={"size": 10, "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": CURVE_COLOUR}},
            hovertext=[f"{words.occupied_line(p.memory_bytes, backend)} ({p.name})"
                       for p in ended],
            hoverinfo="text"))
    _other_ranks_ends(figure, report, x_of, by_step is not None)
    top = max((s.used for s in samples), default=0) / MIB
    # Shapes and annotations are set once, as lists: added one by one, plotly validates the
    # whole list again each time (a fifth of a live refresh).
    annotations = [
        # A boxed label with an arrow: readable over a noisy curve and a coloured band alike;
        # below the curve near the top, where the band labels are.
        {"name": f"end of {phase.name}", "x": float(x_of([phase.end_s])[0]),
         "y": phase.memory_mb, "text": f"<b>{phase.memory_mb} MB</b>", "showarrow": True,
         "arrowhead": 0, "ax": -28, "ay": 26 if phase.memory_mb > 0.7 * top else -26,
         "bgcolor": "rgba(255,255,255,0.85)", "bordercolor": phase_colour(phase.name),
         "borderwidth": 1.5, "font": {"color": CURVE_COLOUR, "size": 12}}
        for phase in ended]
    shapes: list[dict] = []
    if by_step is None:
        _bands(shapes, annotations, report, now, window if axis == "training" else None)
    figure.update_layout(shapes=shapes, annotations=annotations)

    x_title = {"run": "seconds since the run started",
               "training": "seconds since the run started (zoomed on training: double-click "
                           "for the whole run)",
               "step": "training step"}[axis]
    xaxis: dict = {"title": {"text": x_title}, "rangemode": "tozero"}
    if axis == "training" and window is not None:
        xaxis["range"] = list(window)
    figure.update_layout(
        uirevision=f"run-{report.id}-{axis}",  # zoom and legend clicks survive each refresh
        height=440, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis=xaxis,
        yaxis={"title": {"text": words.axis_title(backend)}, "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest", plot_bgcolor="white")
    return figure


def _other_ranks_ends(figure: go.Figure, report: RunReport, x_of, by_step: bool) -> None:
    """The phase ends of ranks other than 0 (whose phases the bands show), on their own GPU's
    line: where a rank's phase ends apart from rank 0's, the marker stands apart."""
    for rank in report.ranks[1:]:
        ended = [p for p in rank.phases if p.done and p.memory_mb is not None]
        if by_step:
            ended = [p for p in ended if p.name == "training"]
        if not ended:
            continue
        figure.add_trace(go.Scatter(
            x=x_of([p.end_s for p in ended]), y=[p.memory_mb for p in ended],
            name=f"end of phase, {rank.label()}", mode="markers", cliponaxis=False,
            marker={"size": 9, "symbol": "diamond",
                    "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": CURVE_COLOUR}},
            hovertext=[f"{rank.label()}: {p.name} ends at {p.memory_mb} MB" for p in ended],
            hoverinfo="text"))


def _bands(shapes: list[dict], annotations: list[dict], report: RunReport, now: float | None,
           window: tuple[float, float] | None) -> None:
    """The phase bands with their labels (rows chosen so that no two overlap), and the profiling
    stretch's band, which the run's peak leaves out."""
    bands = phase_bands(report.phases, now)
    profiling = report.profiling
    if profiling is not None:
        end = profiling.end_s if profiling.end_s is not None else max(now or 0, profiling.start_s)
        bands.append(Band("profiling", profiling.start_s, end, not profiling.done))
    if not bands:
        return
    names = ["profiling: not in the peak" if b.name == "profiling" else b.name for b in bands]
    texts = [f"<b>{name}</b>" + (" …" if b.open else "") for name, b in zip(names, bands)]
    x0, x1 = window if window is not None else (0.0, max(b.x1 for b in bands))
    starts = [max(b.x0, x0) for b in bands]
    rows = label_rows(starts, [n + (" …" if b.open else "") for n, b in zip(names, bands)],
                      x1 - x0)
    for band, label, row in zip(bands, texts, rows):
        colour = PROFILING_COLOUR if band.name == "profiling" else phase_colour(band.name)
        shapes.append({"type": "rect", "name": band.name, "xref": "x", "yref": "paper",
                       "x0": band.x0, "x1": band.x1, "y0": 0, "y1": 1, "layer": "below",
                       "fillcolor": colour, "opacity": BAND_OPACITY, "line": {"width": 0}})
        annotations.append({"name": band.name, "x": band.x0, "xref": "x", "y": 1,
                            "yref": "paper", "xanchor": "left", "yanchor": "top",
                            "yshift": -LABEL_ROW_PX * row, "text": label, "showarrow": False,
                            "font": {"color": CURVE_COLOUR, "size": 12}, "bgcolor": colour})


def steps_figure(report: RunReport, steps: Sequence[Step]) -> go.Figure:
    """Loss and time of each training step, one above the other on one step axis: what W&B and
    TensorBoard draw first. A step's time runs from the previous step's end (step 1: from the
    training phase's start, so it includes the Trainer's first-step setup)."""
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=("loss", "time a step (s)"))
    _steps_traces(figure, report, steps, CURVE_COLOUR, "loss", show_legend=False)
    figure.update_xaxes(title_text="training step", row=2, col=1)
    figure.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                         plot_bgcolor="white", hovermode="x unified", showlegend=False,
                         uirevision=f"steps-{report.id}")
    return figure


def step_times(report: RunReport, steps: Sequence[Step]) -> np.ndarray:
    """Seconds each step took: from the previous step's end (step 1: from training's start)."""
    training = report.training
    if training is None or not steps:
        return np.array([])
    ends = _column(steps, "t")
    return np.diff(np.concatenate([[training.start_s], ends]))


def _steps_traces(figure: go.Figure, report: RunReport, steps: Sequence[Step], colour: str,
                  name: str, show_legend: bool) -> None:
    numbers = _column(steps, "step")
    losses = [s for s in steps if s.loss is not None]
    figure.add_trace(go.Scatter(
        x=_column(losses, "step"), y=_column(losses, "loss"), mode="lines+markers", name=name,
        legendgroup=name, showlegend=show_legend, line={"color": colour, "width": 1.8},
        marker={"size": 4}, hovertemplate="%{y:.4f}<extra>" + name + "</extra>"), row=1, col=1)
    figure.add_trace(go.Scatter(
        x=numbers, y=step_times(report, steps), mode="lines+markers", name=name,
        legendgroup=name, showlegend=False, line={"color": colour, "width": 1.8},
        marker={"size": 4}, hovertemplate="%{y:.3f} s<extra>" + name + "</extra>"), row=2, col=1)


# --- several runs side by side (the Compare page) ---

# Runs told apart by colour (Okabe-Ito again, in an order where neighbours differ most).
RUN_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
               "#F0E442")
PART_COLOURS = {
    "CUDA context": PHASE_COLOURS["kernel"],
    "torch loaded": PHASE_COLOURS["kernel"],
    "weights": PHASE_COLOURS["weights"],
    "training": PHASE_COLOURS["training"],
    "optimizer states": "#0072B2",
    "gradients": "#D55E00",
    "activations": "#009E73",
    "temporary": "#F0E442",
    "temporary buffers": "#F0E442",
    "allocator cache": "#7F8C9A",
    "outside PyTorch": "#C0C7D0",
    "the rest": "#C0C7D0",
}


def _part_colour(name: str) -> str:
    if name.startswith("activations"):
        return PART_COLOURS["activations"]
    if name.startswith("gradients"):
        return PART_COLOURS["gradients"]
    return PART_COLOURS.get(name, "#BBBBBB")


def _memory_axis_title(reports: Sequence[RunReport]) -> str:
    backends = {r.backend for r in reports}
    if len(backends) == 1:
        return words.axis_title(backends.pop())
    return "memory used (MiB): GPU runs NVML, CPU runs RSS"


def _training_rows(report: RunReport, samples: Sequence[Sample]) -> list[Sample]:
    return [s for s in samples if s.gpu == report.gpu]


def _labels(reports: Sequence[RunReport], labels: dict[int, str] | None) -> dict[int, str]:
    return labels or compare.run_labels(reports)


def training_range(reports: Sequence[RunReport], phase: str) -> list[float] | None:
    """The x range that holds every run's training phase, each shifted as the overlay shifts it
    (its `phase` begins at 0): the "training only" zoom of the Compare page."""
    spans = []
    for rep in reports:
        start, training = compare.phase_start(rep, phase), rep.training
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
                   phase: str = "training", labels: dict[int, str] | None = None,
                   training_only: bool = False) -> go.Figure:
    """Each run's memory (its training GPU, or its RSS) on one chart, shifted so that `phase`
    begins at 0 in every run: x = t − that phase's start. A run that never reached the phase is
    left out (the page says which). Each trace's `meta` holds its run id and its shift. `labels`
    name the runs (default: `compare.run_labels`, the options that differ)."""
    labels = _labels(reports, labels)
    figure = go.Figure()
    for colour, rep in zip(cycle(RUN_COLOURS), reports):
        start = compare.phase_start(rep, phase)
        if start is None:
            continue
        rows = _training_rows(rep, samples_by_run.get(rep.id, ()))
        label = labels[rep.id]
        figure.add_trace(go.Scatter(
            x=_column(rows, "t") - start, y=_column(rows, "used", MIB), name=label, mode="lines",
            line={"color": colour, "width": 2}, meta={"run": rep.id, "shift": start},
            hovertemplate="%{x:+.2f} s<br>%{y:.0f} MiB<extra>" + label + "</extra>"))
        ended = [p for p in rep.phases if p.done and p.memory_mb is not None]
        figure.add_trace(go.Scatter(
            x=[p.end_s - start for p in ended], y=[p.memory_mb for p in ended],
            mode="markers", name=f"{label}: end of phase", showlegend=False,
            marker={"size": 8, "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": colour}},
            hovertext=[f"{label}<br>end of {p.name}: {p.memory_mb} MB" for p in ended],
            hoverinfo="text"))
    figure.add_vline(x=0, line={"color": phase_colour(phase), "width": 2, "dash": "dash"},
                     annotation_text=f"<b>{phase} begins</b>", annotation_position="top right",
                     annotation_bgcolor=phase_colour(phase), annotation_font_color=CURVE_COLOUR)
    xaxis = {"title": {"text": f"seconds since the {phase} phase began"}, "zeroline": False}
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


def small_multiples_figure(reports: Sequence[RunReport],
                           samples_by_run: dict[int, Sequence[Sample]],
                           phase: str = "training", labels: dict[int, str] | None = None,
                           training_only: bool = False) -> go.Figure:
    """One panel per run, side by side (three to a row), with one x range and one y range for
    all: the same alignment as `overlay_figure`, each panel with its run's phase bands."""
    labels = _labels(reports, labels)
    columns = min(len(reports), SMALL_MULTIPLES_COLUMNS)
    rows = -(-len(reports) // columns)
    titles = []
    for rep in reports:
        aligned = compare.phase_start(rep, phase) is not None
        titles.append(labels[rep.id] + ("" if aligned else f" (no {phase} phase)"))
    figure = make_subplots(rows=rows, cols=columns, shared_yaxes="all", shared_xaxes="all",
                           subplot_titles=titles,
                           horizontal_spacing=0.03, vertical_spacing=0.12)
    shapes: list[dict] = []
    for index, (colour, rep) in enumerate(zip(cycle(RUN_COLOURS), reports)):
        row, col = index // columns + 1, index % columns + 1
        start = compare.phase_start(rep, phase) or 0.0
        points = _training_rows(rep, samples_by_run.get(rep.id, ()))
        figure.add_trace(go.Scatter(
            x=_column(points, "t") - start, y=_column(points, "used", MIB), mode="lines",
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
    figure.update_xaxes(title_text=f"s since {phase} began", row=rows)
    figure.update_xaxes(showticklabels=True)  # shared: every panel keeps its own tick labels
    if training_only and training_range(reports, phase) is not None:
        figure.update_xaxes(range=training_range(reports, phase))
    figure.update_annotations(font_size=12)
    figure.update_layout(height=300 * rows + 40, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                         plot_bgcolor="white", hovermode="closest")
    return figure


def memory_bars_figure(reports: Sequence[RunReport], labels: dict[int, str] | None = None
                       ) -> go.Figure:
    """A stacked bar per run (`compare.memory_parts`): the CUDA context, the weights, the training
    phase's increase (split into its measured components where the run has them); its peak as a
    marker, and its device's total as a line (a click away in the legend while far above)."""
    labels = _labels(reports, labels)
    parts = {rep.id: compare.memory_parts(rep) for rep in reports}
    found = {p.part for rep in reports for p in parts[rep.id]}
    names = [name for name in compare.PART_ORDER if name in found]
    positions = {rep.id: index for index, rep in enumerate(reports)}
    figure = go.Figure()
    for name in names:
        xs, ys, notes = [], [], []
        for rep in reports:
            for part in parts[rep.id]:
                if part.part == name:
                    xs.append(positions[rep.id])
                    ys.append(part.bytes / MIB)
                    notes.append(part.note)
        figure.add_trace(go.Bar(
            x=xs, y=ys, name=name, marker={"color": _part_colour(name)}, customdata=notes,
            hovertemplate="%{y:,.0f} MiB<br>%{customdata}<extra>" + name + "</extra>"))
    peaks = [(positions[r.id], r.summary.peak_mb) for r in reports
             if r.summary.peak_mb is not None]
    if peaks:
        figure.add_trace(go.Scatter(
            x=[x for x, _ in peaks], y=[y for _, y in peaks], name="peak", mode="markers+text",
            text=[f"peak {y:,} MB" for _, y in peaks], textposition="top center",
            cliponaxis=False, marker={"symbol": "diamond", "size": 12, "color": CURVE_COLOUR},
            hovertemplate="peak %{y:,} MB<extra></extra>"))
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
        xaxis={"tickmode": "array", "tickvals": list(positions.values()),
               "ticktext": [labels[r.id].replace(" · ", "<br>") for r in reports]},
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
            _steps_traces(figure, rep, steps, colour, labels[rep.id], show_legend=True)
    figure.update_xaxes(title_text="training step", row=2, col=1)
    figure.update_layout(height=480, margin={"l": 10, "r": 10, "t": 80, "b": 10},
                         plot_bgcolor="white", hovermode="x unified",
                         legend={"orientation": "h", "yanchor": "bottom", "y": 1.1, "x": 0})
    return figure


PRECISION_COLOURS = {"fp32": "#0072B2", "bf16": "#009E73", "fp16": "#D55E00"}
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
            marker={"size": 11, "color": PRECISION_COLOURS.get(precision, "#7F8C9A"),
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


def device_figure(hosts: Sequence[HostStatus], gpus: Sequence[GpuStatus]) -> go.Figure:
    """The device panel over a run, one panel a figure on one time axis: each GPU's utilisation,
    power and temperature (where the driver gave them), then the host's CPU and RAM."""
    panels: list[tuple[str, list[tuple[str, Sequence, str]]]] = []
    by_gpu: dict[int, list[GpuStatus]] = {}
    for reading in gpus:
        by_gpu.setdefault(reading.gpu, []).append(reading)
    for key, title in (("util", "GPU utilisation (%)"), ("power_w", "power (W)"),
                       ("temperature_c", "temperature (°C)")):
        lines = [(f"GPU {gpu}", [r for r in rows if getattr(r, key) is not None], key)
                 for gpu, rows in sorted(by_gpu.items())]
        if any(points for _, points, _ in lines):
            panels.append((title, lines))
    panels.append(("host CPU, all cores (%)", [("CPU", list(hosts), "cpu_percent")]))
    panels.append(("host RAM used (GiB)", [("RAM", list(hosts), "ram_used")]))
    figure = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                           subplot_titles=[title for title, _ in panels])
    colours = cycle(RUN_COLOURS)
    for row, (_, lines) in enumerate(panels, start=1):
        for name, points, key in lines:
            scale = 2**30 if key == "ram_used" else 1
            values = [None if getattr(p, key) is None else getattr(p, key) / scale
                      for p in points]
            figure.add_trace(go.Scatter(
                x=[p.t for p in points], y=values, mode="lines", name=name, showlegend=False,
                line={"color": next(colours), "width": 1.5},
                hovertemplate="%{x:.1f} s: %{y:.1f}<extra>" + name + "</extra>"), row=row, col=1)
    figure.update_yaxes(rangemode="tozero")
    figure.update_xaxes(title_text="seconds since the run started", row=len(panels), col=1)
    figure.update_layout(height=150 * len(panels) + 60, plot_bgcolor="white",
                         margin={"l": 10, "r": 10, "t": 30, "b": 10}, hovermode="x unified")
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
        if run.status == "completed" and value is not None:
            z[i][j] = value
            cells[i][j] = f"{value:,.0f}" if metric == "peak_mb" else f"{value:,.2f}"
        else:
            cells[i][j] = run.status
    title = "peak memory (MB)" if metric == "peak_mb" else "samples/second"
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
        cliponaxis=False, marker={"color": [CURVE_COLOUR if v is not None else "#D55E00"
                                            for v in values]},
        hovertemplate=f"{across.replace('_', ' ')} %{{x}}<br>%{{text}}<extra></extra>"))
    figure.update_layout(
        height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10}, title={"text": title},
        plot_bgcolor="white", xaxis={"title": {"text": across.replace("_", " ")},
                                     "type": "category"},
        yaxis={"title": {"text": title}, "rangemode": "tozero"})
    return figure


# --- one run taken apart (the Anatomy page) ---

def anatomy_waterfall_figure(sides: dict[str, list[tuple[str, str, int]]]) -> go.Figure:
    """`breakdown.waterfall` as grouped waterfalls, measured next to predicted: each part adds,
    "all at once" is their sum, "never held at once" takes away what a step never holds together,
    leaving the peak."""
    colours = {"measured": CURVE_COLOUR, "predicted": "#0072B2"}
    labels = [label for steps in sides.values() for label, _, _ in steps]
    order = [label for label in breakdown.WATERFALL_ORDER if label in labels]
    figure = go.Figure()
    for side, steps in sides.items():
        figure.add_trace(go.Waterfall(
            name=side, x=[label for label, _, _ in steps], measure=[m for _, m, _ in steps],
            y=[value / MIB for _, _, value in steps], textposition="outside",
            # The totals only: the parts' figures are in the table below, and side by side
            # their labels would collide.
            texttemplate=["%{final:,.0f}" if measure == "total" else "" for _, measure, _
                          in steps], textfont={"size": 11},
            increasing={"marker": {"color": colours.get(side, "#888888")}},
            decreasing={"marker": {"color": "#D55E00"}},
            totals={"marker": {"color": "#7F8C9A"}},
            connector={"line": {"color": "#BBBBBB", "width": 1}},
            hovertemplate="%{x}: %{y:+,.0f} MiB (running total %{final:,.0f})"
                          f"<extra>{side}</extra>"))
    figure.update_layout(
        waterfallmode="group", height=460, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        plot_bgcolor="white", yaxis={"title": {"text": "MiB"}, "rangemode": "tozero"},
        xaxis={"categoryorder": "array", "categoryarray": order},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0})
    return figure


def moments_figure(rows: Sequence[breakdown.MomentRow], sum_of_parts: int) -> go.Figure:
    """Memory at each moment of a step (`breakdown.moment_rows`), predicted and measured, under
    the line of the sum of the parts: no moment reaches it."""
    labels = [r.moment for r in rows]
    figure = go.Figure()
    for key, colour in (("predicted", "#0072B2"), ("measured", CURVE_COLOUR)):
        values = [None if getattr(r, key) is None else getattr(r, key) / MIB for r in rows]
        if any(v is not None for v in values):
            figure.add_trace(go.Bar(
                x=labels, y=values, name=key, marker={"color": colour},
                text=[None if v is None else f"{v:,.0f}" for v in values], textposition="outside",
                hovertemplate="%{x}: %{y:,.0f} MiB<extra>" + key + "</extra>"))
    figure.add_hline(y=sum_of_parts / MIB, line={"color": "#D55E00", "dash": "dash", "width": 1.5},
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
                       count: int = FIRST_STEPS) -> go.Figure:
    """The training phase's first `count` steps up close: the memory curve, a line where each
    step ends (from the worker's step marks), and two notes whose arrows end on the curve: after
    step 1 the gradients and the optimizer states exist, and from step 2 on the memory repeats.
    Labels never overlap (`label_rows`) and notes lean towards the middle of the chart, so none
    is cut at an edge."""
    window = first_steps_window(report, steps, count)
    figure = go.Figure()
    if window is None:
        return figure
    x0, x1 = window
    rows = [s for s in _training_rows(report, samples) if x0 <= s.t <= x1]
    times, used = _column(rows, "t"), _column(rows, "used", MIB)
    figure.add_trace(go.Scatter(
        x=times, y=used, mode="lines+markers",
        name="CPU RSS" if report.backend == "cpu-rss" else f"GPU {report.gpu}",
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
    figure.add_vline(x=start, line={"color": PHASE_COLOURS["training"], "width": 2})
    texts = ["training begins", *(f"step {s.step} ends" for s in marked)]
    places = [start, *(s.t for s in marked)]
    for row, (x, label) in zip(label_rows(places, texts, x1 - x0), zip(places, texts)):
        figure.add_annotation(x=x, xref="x", y=1, yref="paper", xanchor="left", yanchor="top",
                              yshift=-LABEL_ROW_PX * row, text=label, showarrow=False,
                              font={"size": 11, "color": CURVE_COLOUR},
                              bgcolor=PHASE_COLOURS["training"] if x == start
                              else "rgba(255,255,255,0.85)")
    for step in marked:
        figure.add_vline(x=step.t, line={"color": "#555555", "width": 1, "dash": "dot"})
    if marked and len(times):
        low, high = float(used.min()), float(used.max())
        notes = [(marked[0].t, "after step 1: the gradients and the optimizer states exist")]
        if len(marked) > 1:
            notes.append((marked[-1].t, "from step 2 on, the memory repeats"))
        for index, (x, label) in enumerate(notes):
            y = float(np.interp(x, times, used))
            # The text sits towards the middle of the chart, and below the curve where it is
            # high; the earlier note one line further, so that two notes never meet.
            leftwards = x > (x0 + x1) / 2
            away = 45 + 40 * (len(notes) - 1 - index)
            figure.add_annotation(
                x=x, y=y, text=label, showarrow=True, arrowhead=2, arrowcolor=CURVE_COLOUR,
                ax=-50 if leftwards else 50, ay=away if y > (low + high) / 2 else -away,
                xanchor="right" if leftwards else "left", bgcolor="rgba(255,255,255,0.9)",
                bordercolor=PHASE_COLOURS["training"], borderwidth=1,
                font={"size": 12, "color": CURVE_COLOUR})
    figure.update_layout(
        height=400, margin={"l": 10, "r": 10, "t": 30, "b": 10}, plot_bgcolor="white",
        xaxis={"title": {"text": "seconds since the run started"}, "range": [x0, x1]},
        yaxis={"title": {"text": words.axis_title(report.backend)}},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0}, hovermode="closest")
    return figure


def operations_figure(rows: Sequence[ClassShare]) -> go.Figure:
    """`operations.comparison` as two panels, the share of FLOPs and the share of time per
    operation class: this run next to the paper's BERT figures (none for "other")."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("share of FLOPs", "share of time"),
                           shared_yaxes=True, horizontal_spacing=0.04)
    classes = [r.kind.replace(" ", "<br>", 1) for r in rows]
    for col, (ours, papers) in enumerate((("flop_share", "paper_flop_share"),
                                          ("time_share", "paper_time_share")), start=1):
        for key, name, colour in ((ours, "this run", CURVE_COLOUR),
                                  (papers, "Ivanov et al. (BERT, PyTorch)", "#E69F00")):
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
