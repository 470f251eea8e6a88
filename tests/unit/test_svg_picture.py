"""The memory chart as an SVG picture (anatomy/views/figures/svg.py), read back as XML: what it
draws is what the Plotly figure it is made from holds."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from anatomy.analysis.report import report
from anatomy.views.figures import live, svg

NS = {"s": "http://www.w3.org/2000/svg"}


def _picture(store, run_id: int, axis: str = "run"):
    figure = live.memory_figure(report(store, run_id), store.decimated(run_id),
                                store.steps(run_id), axis=axis)
    return figure, ET.fromstring(svg.memory_picture(figure))


def _texts(root, cls: str) -> list[str]:
    return [e.text for e in root.iter(f"{{{NS['s']}}}text") if e.get("class") == cls]


def _numbers(texts: list[str]) -> list[float]:
    return [float(t.replace(",", "")) for t in texts]


def test_a_line_per_gpu_of_the_run_named_in_the_legend(store, seed):
    run_id = seed(gpus=2, phases_reached=4)
    figure, root = _picture(store, run_id)
    lines = {e.get("data-name") for e in root.iter(f"{{{NS['s']}}}polyline")}
    drawn_lines = {t.name for t in figure.data if t.mode == "lines" and t.visible is None}
    assert lines == drawn_lines
    assert {"GPU 0 (training)", "GPU 1"} <= lines
    legend = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
              if g.get("class") == "legend-item"]
    assert "GPU 0 (training)" in legend and "end of phase" in legend
    # The device's total waits in the interactive chart's legend for a click: a picture cannot
    # be clicked, so it is neither drawn nor listed.
    assert not any("total" in name for name in [*legend, *lines])


def test_the_phase_bands_and_their_names_as_the_figure_places_them(store, seed):
    run_id = seed()
    figure, root = _picture(store, run_id)
    bands = [e.get("data-band") for e in root.iter(f"{{{NS['s']}}}rect") if e.get("data-band")]
    assert bands == ["baseline", "kernel", "weights", "training"]
    labels = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
              if g.get("class") == "band-label"]
    assert labels == ["baseline", "kernel", "weights", "training"]
    # Each phase's end: its memory in a box, as the chart's annotation says it.
    ends = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
            if g.get("class") == "point-label"]
    assert ends == ["1024 MB", "2048 MB", "3072 MB", "4096 MB"]


def test_an_open_phase_says_it_lasts(store, seed):
    run_id = seed(status="running", phases_reached=3)
    _, root = _picture(store, run_id)
    labels = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
              if g.get("class") == "band-label"]
    assert labels == ["baseline", "kernel", "weights …"]


def test_the_axes_say_their_units_and_their_ticks_span_the_data(store, seed):
    run_id = seed()  # 1 to 4 GiB over 9 s
    _, root = _picture(store, run_id)
    assert _texts(root, "y-title") == ["GPU memory used (MiB)"]
    assert _texts(root, "x-title") == ["seconds since the run started"]
    y = _numbers(_texts(root, "y-tick"))
    assert y[0] == 0 and 3000 <= y[-1] <= 4096 * 1.05  # up to the peak's 4096 MiB, not beyond
    assert y == sorted(y) and len(set(np.diff(y))) == 1  # round, evenly spaced
    x = _numbers(_texts(root, "x-tick"))
    assert x[0] == 0 and 8 <= x[-1] <= 9


def test_the_cpu_axis_says_rss_and_the_step_axis_its_steps(store, seed):
    run_id = seed(backend="rss")
    figure, root = _picture(store, run_id, axis="step")
    last = max(max(t.x) for t in figure.data if t.visible is None)  # the last step drawn
    assert _texts(root, "y-title") == ["CPU memory, RSS (MiB)"]
    assert _texts(root, "x-title") == ["training step"]
    x = _numbers(_texts(root, "x-tick"))
    assert x[0] == 0 and last - 1 < x[-1] <= last and 7 <= last <= 8  # 8 steps
    assert not any(e.get("data-band") for e in root.iter(f"{{{NS['s']}}}rect"))


def test_the_zoom_on_training_shows_the_training_window_alone(store, seed):
    run_id = seed()
    figure, root = _picture(store, run_id, axis="training")
    low, high = figure.layout.xaxis.range
    x = _numbers(_texts(root, "x-tick"))
    assert low <= x[0] and x[-1] <= high and x[0] >= 4  # training: 5 to 9 s


def test_a_line_keeps_its_peaks_once_decimated_to_the_plots_width():
    t = np.linspace(0, 100, 50_000)
    used = np.where(np.arange(t.size) == 31_337, 9_000.0, 100.0 + np.sin(t))
    x, y = svg.decimated(t, used, 0, 100, 500)
    assert len(x) <= 4 * 500 + 2 and y.max() == 9_000 and y.min() == used.min()
    assert np.all(np.diff(x) >= 0)  # still in time order


def test_ticks_are_round_and_their_text_has_the_decimals_it_needs():
    assert svg.nice_ticks(0, 4300, 5) == [0, 1000, 2000, 3000, 4000]
    ticks = svg.nice_ticks(0, 1.3, 5)
    assert [svg.tick_text(v, ticks) for v in ticks] == ["0.0", "0.2", "0.4", "0.6", "0.8",
                                                       "1.0", "1.2"]
    assert svg.tick_text(12000, [0, 5000]) == "12,000"


def test_a_figure_of_several_axes_is_not_drawn_as_one(store, seed):
    from anatomy.views.figures import gpus

    run_id = seed(gpus=2)
    figure = gpus.small_multiples(report(store, run_id), store.decimated(run_id))
    figure.add_scatter(x=[0, 1], y=[0, 1], xaxis="x2", yaxis="y2")  # a second panel
    with pytest.raises(svg.Unsupported):
        svg.memory_picture(figure)


def test_no_text_is_none_or_markup(store, seed):
    _, root = _picture(store, seed(status="running", phases_reached=2))
    texts = [e.text or "" for e in root.iter(f"{{{NS['s']}}}text")]
    assert texts and not any(re.search(r"\bNone\b|<|nan", t) for t in texts)
