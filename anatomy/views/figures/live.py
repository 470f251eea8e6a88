"""A run's charts, as the Live page draws them (and the Runs page for a stored run, and an
export): its memory over time with the phase bands, its loss and time a step, its device panel
over the whole run; a dataset's lengths before a run on it."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy.analysis.lengths import Lengths, TextBatch
from anatomy.analysis.report import RunReport
from anatomy.store import HOST_STRIDE, GpuStatus, HostStatus, Sample, Step, series_rank
from anatomy.units import MIB, gib_text, mib_text
from anatomy.views import text as words
from anatomy.views.figures.layout import (
    ASSUMED_PLOT_PX,
    CHAR_PX,
    LABEL_ROW_PX,
    Y_PAD,
    Band,
    assumed_plot_height,
    column,
    label_rows,
    phase_bands,
    steps_traces,
)
from anatomy.views.style import (
    ALLOCATED_COLOUR,
    BAND_OPACITY,
    CEILING_COLOUR,
    CURVE_COLOUR,
    OTHER_GPU_COLOURS,
    PROFILING_COLOUR,
    RESERVED_COLOUR,
    RUN_COLOURS,
    phase_colour,
)
from anatomy.vocabulary import Backend, Phase, phase_name

CEILING_SHOWN_FROM = 0.25  # of the total: the ceiling is drawn once the curve comes this close
# The x axes a run's memory can be drawn on: the whole run in seconds, its training phase in
# seconds, or its training steps.
AXES = ("run", Phase.TRAINING, "step")


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
    seconds; Phase.TRAINING the same, zoomed on the training phase (zoom out to see the rest); "step"
    draws the training phase alone against its steps (x = the step, fractions between two ends)."""
    backend = report.backend
    if now is None and samples:
        now = max(s.t for s in samples)
    by_step = step_position(report, steps) if axis == "step" else None
    if axis == "step" and by_step is None:
        axis = Phase.TRAINING  # no step has ended yet: seconds until one has
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
    # Several GPUs: one line per GPU the run trains on, named by its rank; the
    # machine's other GPUs are not the run's.
    # On several hosts a GPU is the device its samples are stored under (store.device_key).
    rank_of = {r.device: r for r in report.ranks if r.gpu is not None}
    for sample in samples:
        if not rank_of or sample.gpu in rank_of:
            by_gpu.setdefault(sample.gpu, []).append(sample)
    others = cycle(OTHER_GPU_COLOURS)
    x_hover = "step %{x:.2f}" if by_step is not None else "%{x:.2f} s"
    for gpu, rows in sorted(by_gpu.items()):
        trains = gpu == report.gpu or gpu in rank_of
        if backend == Backend.CPU_RSS:
            rank = series_rank(gpu)  # a rank's own processes, or the whole tree (None)
            name = (f"rank {rank}: its processes' RSS" if rank is not None else
                    "CPU RSS of the training processes, together" if report.ranks
                    else "CPU RSS of the training process")
            if len(report.hosts) > 1:  # a line per host: each host's own processes
                name = f"{report.hosts[min(gpu // HOST_STRIDE, len(report.hosts) - 1)]}: {name}"
        elif gpu in rank_of:
            name = rank_of[gpu].label()
        else:
            name = words.panel_gpu(report.hosts, gpu) + (" (training)" if trains and len(by_gpu) > 1
                                                          else "")
        # SVG, not WebGL: a decimated curve is a few thousand points, and every WebGL chart holds
        # one of the browser's few GL contexts (a live page redraws every second).
        figure.add_trace(go.Scatter(
            x=x_of(column(rows, "t")), y=column(rows, "used", MIB), name=name,
            mode="lines", line={"color": CURVE_COLOUR if gpu == report.gpu else next(others),
                                "width": 2 if trains else 1.2},
            hovertemplate=x_hover + "<br>%{y:.0f} MiB<extra>" + name + "</extra>"))

    allocator = [s for s in steps if s.allocated is not None]
    for key, label, colour, dash in (("allocated", "torch allocated", ALLOCATED_COLOUR, "dot"),
                                     ("reserved", "torch reserved", RESERVED_COLOUR, "dash")):
        points = [s for s in allocator if getattr(s, key) is not None]
        if points:
            figure.add_trace(go.Scatter(
                x=x_of(column(points, "t")), y=column(points, key, MIB), name=label,
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
        what = "RAM" if backend == Backend.CPU_RSS else f"GPU {report.gpu}"
        ends = [0.0, now] if by_step is None else [0.0, float(steps[-1].step)]
        figure.add_trace(go.Scatter(
            x=ends, y=[total / MIB] * 2, mode="lines",
            name=f"{what} total: {gib_text(total)}" + ("" if near else " (click to show)"),
            line={"color": CEILING_COLOUR, "width": 1, "dash": "dashdot"},
            visible=True if near else "legendonly", hoverinfo="name"))

    ended = [p for p in report.phases if p.done and p.memory_mb is not None]
    if by_step is not None:
        ended = [p for p in ended if p.name == Phase.TRAINING]
    if ended:
        figure.add_trace(go.Scatter(
            x=x_of([p.end_s for p in ended]), y=[p.memory_mb for p in ended],
            name="end of phase", mode="markers", cliponaxis=False,
            text=[mib_text(p.memory_bytes) for p in ended],
            marker={"size": 10, "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": CURVE_COLOUR}},
            hovertext=[f"{words.occupied_line(p.memory_bytes, backend)} "
                       f"({phase_name(p.name, report.on_gpu)})"
                       for p in ended],
            hoverinfo="text"))
    _other_ranks_ends(figure, report, x_of, by_step is not None)
    top = max((s.used for s in samples), default=0) / MIB
    if axis == Phase.TRAINING and window is not None:
        shown = window
    else:
        shown = (0.0, float(x_of([now or 0.0])[0]) if by_step is None else float(steps[-1].step))
    # Shapes and annotations are set once, as lists: added one by one, plotly validates the
    # whole list again each time (a fifth of a live refresh).
    shapes: list[dict] = []
    band_notes: list[dict] = []
    rows = 0
    if by_step is None:
        rows = _bands(shapes, band_notes, report, now, window if axis == Phase.TRAINING else None)
    places = [(float(x_of([p.end_s])[0]), p.memory_mb, mib_text(p.memory_bytes)) for p in ended]
    annotations = [
        # A boxed label with an arrow: readable over a noisy curve and a coloured band alike;
        # below the curve near the top, where the band labels are; to the right of a point at
        # the plot's left edge, where it covered the axis's ticks; clear of the labels before it.
        {"name": f"end of {phase.name}", "x": x, "y": phase.memory_mb, "text": f"<b>{label}</b>",
         "showarrow": True, "arrowhead": 0, "ax": ax, "ay": ay,
         "bgcolor": "rgba(255,255,255,0.85)", "bordercolor": phase_colour(phase.name),
         "borderwidth": 1.5, "font": {"color": CURVE_COLOUR, "size": 12}}
        for phase, (x, _, label), (ax, ay) in zip(
            ended, places, _note_offsets(places, shown, top, assumed_plot_height(rows)))]
    figure.update_layout(shapes=shapes, annotations=annotations + band_notes)

    x_title = {"run": "seconds since the run started",
               Phase.TRAINING: "seconds since the run started (zoomed on training: double-click "
                           "for the whole run)",
               "step": "training step"}[axis]
    xaxis: dict = {"title": {"text": x_title}, "rangemode": "tozero"}
    if axis == Phase.TRAINING and window is not None:
        xaxis["range"] = list(window)
    figure.update_layout(
        uirevision=f"run-{report.id}-{axis}",  # zoom and legend clicks survive each refresh
        height=440, margin={"l": 10, "r": 10, "t": 12 + LABEL_ROW_PX * rows, "b": 10},
        xaxis=xaxis,
        yaxis={"title": {"text": words.axis_title(backend)}, "rangemode": "tozero"},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest", plot_bgcolor="white")
    return figure


MARKER_LEAN_PX = 28  # how far an end-of-phase label sits from its marker, leftwards


def _marker_lean(x: float, shown: tuple[float, float], text: str) -> float:
    """An end-of-phase label's offset across: to the left of its marker, less where the label
    would then leave the plot at its left (at the narrowest it is drawn), over the axis's ticks;
    a marker at the very edge has its label to its right."""
    low, high = shown
    at = (x - low) / (high - low) * ASSUMED_PLOT_PX if high > low else 0.0
    half = (len(text) * CHAR_PX + 8) / 2
    return max(at - MARKER_LEAN_PX, half + 2) - at


MARKER_NOTE_PX = 26  # how far an end-of-phase label sits from its marker, up or down
NOTE_HEIGHT_PX = 20  # a boxed label's height, its border in


def note_box(at_px: float, y_px: float, ax: float, ay: float, text: str
             ) -> tuple[float, float, float, float]:
    """Where an end-of-phase label lies, in pixels (left, right, top, bottom), its marker at
    (`at_px`, `y_px`) of the plot and the label moved by (`ax`, `ay`) from it."""
    half = (len(text) * CHAR_PX + 8) / 2
    return (at_px + ax - half, at_px + ax + half, y_px + ay - NOTE_HEIGHT_PX / 2,
            y_px + ay + NOTE_HEIGHT_PX / 2)


def plot_px(x: float, y: float, shown: tuple[float, float], top: float, height: float
            ) -> tuple[float, float]:
    """A point's place in the plot at the narrowest it is drawn (ASSUMED_PLOT_PX wide, `height`
    tall), y down from the plot's top as a browser has it; the y axis from 0 to a little over
    `top`, the curve's highest."""
    low, high = shown
    at = (x - low) / (high - low) * ASSUMED_PLOT_PX if high > low else 0.0
    return at, height * (1 - y / (top * (1 + Y_PAD))) if top > 0 else height


def _note_offsets(places: list[tuple[float, float, str]], shown: tuple[float, float],
                  top: float, height: float) -> list[tuple[float, float]]:
    """Each end-of-phase label's offset from its marker (x, y, its text): to the left
    (`_marker_lean`), below the marker near the top of the plot and above it elsewhere, unless
    that box meets a label placed before it: then the other side, or twice or thrice as far,
    whichever is clear and inside the plot. Short phases at a long run's start put their markers
    a few pixels apart; their labels, all pushed right of the axis, lay over one another."""
    placed: list[tuple[float, float, float, float]] = []
    offsets = []
    for x, y, text in places:
        at, y_px = plot_px(x, y, shown, top, height)
        ax = _marker_lean(x, shown, text)
        near = MARKER_NOTE_PX if y > 0.7 * top else -MARKER_NOTE_PX
        tried = [near * k for far in (1, 2, 3) for k in (far, -far)]
        inside = [ay for ay in tried
                  if 0 <= note_box(at, y_px, ax, ay, text)[2]
                  and note_box(at, y_px, ax, ay, text)[3] <= height]
        ay = next((ay for ay in inside if not any(
            _meet(note_box(at, y_px, ax, ay, text), box) for box in placed)), near)
        placed.append(note_box(at, y_px, ax, ay, text))
        offsets.append((ax, ay))
    return offsets


def _meet(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _other_ranks_ends(figure: go.Figure, report: RunReport, x_of, by_step: bool) -> None:
    """The phase ends of ranks other than 0 (whose phases the bands show), on their own GPU's
    line: where a rank's phase ends apart from rank 0's, the marker stands apart."""
    for rank in report.ranks[1:]:
        ended = [p for p in rank.phases if p.done and p.memory_mb is not None]
        if by_step:
            ended = [p for p in ended if p.name == Phase.TRAINING]
        if not ended:
            continue
        figure.add_trace(go.Scatter(
            x=x_of([p.end_s for p in ended]), y=[p.memory_mb for p in ended],
            name=f"end of phase, {rank.label()}", mode="markers", cliponaxis=False,
            marker={"size": 9, "symbol": "diamond",
                    "color": [phase_colour(p.name) for p in ended],
                    "line": {"width": 1.5, "color": CURVE_COLOUR}},
            hovertext=[f"{rank.label()}: {phase_name(p.name, report.on_gpu)} ends at "
                       f"{mib_text(p.memory_bytes)}" for p in ended],
            hoverinfo="text"))


def _bands(shapes: list[dict], annotations: list[dict], report: RunReport, now: float | None,
           window: tuple[float, float] | None) -> int:
    """The phase bands with their labels, and the profiling stretch's band, which the run's peak
    leaves out. The labels sit above the plot, each band's at its start, in rows chosen so that
    no two overlap: short phases at the run's start stacked their labels over the curve. The
    number of rows."""
    bands = phase_bands(report.phases, now)
    profiling = report.profiling
    if profiling is not None:
        end = profiling.end_s if profiling.end_s is not None else max(now or 0, profiling.start_s)
        bands.append(Band(Phase.PROFILING, profiling.start_s, end, not profiling.done))
    if not bands:
        return 0
    names = ["profiling: not in the peak" if b.name == Phase.PROFILING else
             phase_name(b.name, report.on_gpu) for b in bands]
    texts = [f"<b>{name}</b>" + (" …" if b.open else "") for name, b in zip(names, bands)]
    x0, x1 = window if window is not None else (0.0, max(b.x1 for b in bands))
    starts = [max(b.x0, x0) for b in bands]
    rows = label_rows(starts, [n + (" …" if b.open else "") for n, b in zip(names, bands)],
                      x1 - x0)
    for band, label, row in zip(bands, texts, rows):
        colour = PROFILING_COLOUR if band.name == Phase.PROFILING else phase_colour(band.name)
        shapes.append({"type": "rect", "name": band.name, "xref": "x", "yref": "paper",
                       "x0": band.x0, "x1": band.x1, "y0": 0, "y1": 1, "layer": "below",
                       "fillcolor": colour, "opacity": BAND_OPACITY, "line": {"width": 0}})
        annotations.append({"name": band.name, "x": max(band.x0, x0), "xref": "x", "y": 1,
                            "yref": "paper", "xanchor": "left", "yanchor": "bottom",
                            "yshift": LABEL_ROW_PX * row, "text": label, "showarrow": False,
                            "font": {"color": CURVE_COLOUR, "size": 12}, "bgcolor": colour})
    return max(rows) + 1


def steps_figure(report: RunReport, steps: Sequence[Step]) -> go.Figure:
    """Loss and time of each training step, one above the other on one step axis: what W&B and
    TensorBoard draw first. A step's time runs from the previous step's end (step 1: from the
    training phase's start, so it includes the Trainer's first-step setup)."""
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=("loss", "time a step (s)"))
    steps_traces(figure, report, steps, CURVE_COLOUR, "loss", show_legend=False)
    figure.update_xaxes(title_text="training step", row=2, col=1)
    figure.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                         plot_bgcolor="white", hovermode="x unified", showlegend=False,
                         uirevision=f"steps-{report.id}")
    return figure


def device_figure(hosts: Sequence[HostStatus], gpus: Sequence[GpuStatus],
                  host_names: Sequence[str] = ()) -> go.Figure:
    """The device panel over a run, one panel a figure on one time axis: each GPU's utilisation,
    power and temperature (where the driver gave them), then the host's CPU and RAM (on a run
    across hosts, `host_names`: a line each)."""
    panels: list[tuple[str, list[tuple[str, Sequence, str]]]] = []
    by_gpu: dict[int, list[GpuStatus]] = {}
    for reading in gpus:
        by_gpu.setdefault(reading.gpu, []).append(reading)
    for key, title in (("util", "GPU utilisation (%)"), ("power_w", "power (W)"),
                       ("temperature_c", "temperature (°C)")):
        lines = [(words.panel_gpu(host_names, gpu), [r for r in rows if getattr(r, key) is not None],
                  key) for gpu, rows in sorted(by_gpu.items())]
        if any(points for _, points, _ in lines):
            panels.append((title, lines))
    places = sorted({h.host for h in hosts})
    for title, key, word in (("host CPU, all cores (%)", "cpu_percent", "CPU"),
                             ("host RAM used (GiB)", "ram_used", "RAM")):
        panels.append((title, [(word if len(places) <= 1 else words.panel_host(host_names, place),
                                [h for h in hosts if h.host == place], key) for place in places]))
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



def lengths_figure(lengths: Lengths, longest: TextBatch, typical: TextBatch) -> go.Figure:
    """A dataset's texts by their length in tokens (bins of equal width), the form's answer to
    Predict; the axis names the typical and the longest batch."""
    bins = lengths.histogram()
    figure = go.Figure(go.Bar(
        x=[f"{low:,}" if low == high else f"{low:,}–{high:,}" for low, high, _ in bins],
        y=[count for _, _, count in bins], marker_color=CURVE_COLOUR, showlegend=False,
        hovertemplate="%{x} tokens: %{y:,} texts<extra></extra>"))
    figure.update_layout(
        height=260, margin={"l": 10, "r": 10, "t": 10, "b": 10}, plot_bgcolor="white",
        bargap=0.1, xaxis_title=f"tokens per text (typical batch {typical.words()}, longest "
                                f"{longest.words()})",
        yaxis_title="texts")
    return figure
