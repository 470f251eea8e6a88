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
    return figure, ET.fromstring(svg.picture(figure))


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
    assert labels == ["baseline", "CUDA kernels", "weights", "training"]
    # Each phase's end: its memory in a box, as the chart's annotation says it.
    ends = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
            if g.get("class") == "point-label"]
    assert ends == ["1,024 MiB", "2,048 MiB", "3,072 MiB", "4,096 MiB"]


def test_an_open_phase_says_it_lasts(store, seed):
    run_id = seed(status="running", phases_reached=3)
    _, root = _picture(store, run_id)
    labels = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
              if g.get("class") == "band-label"]
    assert labels == ["baseline", "CUDA kernels", "weights …"]


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
        svg.picture(figure)


def test_no_text_is_none_or_markup(store, seed):
    _, root = _picture(store, seed(status="running", phases_reached=2))
    texts = [e.text or "" for e in root.iter(f"{{{NS['s']}}}text")]
    assert texts and not any(re.search(r"\bNone\b|<|nan", t) for t in texts)


# --- figures beyond the memory chart: points with labels, log axes, rules, bars ---

def _of(figure) -> ET.Element:
    return ET.fromstring(svg.picture(figure))


def _all(root, tag: str, cls: str | None = None) -> list[ET.Element]:
    return [e for e in root.iter(f"{{{NS['s']}}}{tag}") if cls is None or e.get("class") == cls]


def test_points_keep_their_symbol_colour_and_label_on_a_log_axis():
    import plotly.graph_objects as go

    figure = go.Figure()
    figure.add_scatter(x=[10, 20], y=[100, 10_000], mode="markers+text", name="fp32",
                       text=["bs 1", "bs 64"], textposition="middle right",
                       marker={"size": 11, "color": "#0072B2", "symbol": "circle"})
    figure.add_scatter(x=[30], y=[1_000], mode="markers+text", name="bf16", text=["bs 8"],
                       textposition="middle left",
                       marker={"size": 11, "color": "#009E73", "symbol": "diamond"})
    figure.update_layout(yaxis={"type": "log", "title": {"text": "peak memory (MB)"}},
                         xaxis={"rangemode": "tozero"})
    root = _of(figure)
    markers = _all(root, "circle", "marker") + _all(root, "path", "marker")
    assert sorted((m.get("data-symbol"), m.get("fill")) for m in markers) == [
        ("circle", "#0072B2"), ("circle", "#0072B2"), ("diamond", "#009E73")]
    labels = {t.text: t for t in _all(root, "text", "point-text")}
    assert set(labels) == {"bs 1", "bs 64", "bs 8"}
    assert labels["bs 8"].get("text-anchor") == "end"  # at the marker's left, as the figure says
    # A log axis: ticks at 1, 2 and 5 times powers of ten, and 1,000 MB halfway between the
    # points at 100 and 10,000.
    ticks = _numbers(_texts(root, "y-tick"))
    assert {100, 1000, 10000} <= set(ticks) and set(ticks) <= {
        m * 10 ** k for k in range(1, 6) for m in (1, 2, 5)}
    ys = {t.text: float(t.get("y")) for t in labels.values()}
    assert ys["bs 8"] == pytest.approx((ys["bs 1"] + ys["bs 64"]) / 2, abs=0.2)
    legend = [g.find("s:text", NS).text for g in _all(root, "g", "legend-item")]
    assert legend == ["fp32", "bf16"]


def test_a_rule_and_its_label_stand_where_the_figure_puts_them():
    import plotly.graph_objects as go

    figure = go.Figure(go.Scatter(x=[-5, 0, 5], y=[1, 2, 3], mode="lines", name="run 1"))
    figure.add_vline(x=0, line={"color": "#009E73", "dash": "dash"},
                     annotation_text="<b>training begins</b>", annotation_position="top right")
    figure.add_hline(y=2.5, line={"color": "#D55E00"}, annotation_text="sum of the parts",
                     annotation_position="top left")
    root = _of(figure)
    zero = [t for t in _all(root, "text", "x-tick") if t.text == "0"][0]
    vertical, horizontal = _all(root, "line", "rule")
    assert float(vertical.get("x1")) == float(vertical.get("x2")) == float(zero.get("x"))
    assert vertical.get("stroke-dasharray") and vertical.get("stroke") == "#009E73"
    assert float(horizontal.get("y1")) == float(horizontal.get("y2"))
    texts = [g.find("s:text", NS) for g in _all(root, "g")
             if g.get("class") in ("band-label", "label")]
    assert [(t.text, t.get("font-weight")) for t in texts] == [("training begins", "bold"),
                                                             ("sum of the parts", None)]
    # The x axis runs over the points, negative times included.
    assert _numbers(_texts(root, "x-tick"))[0] == -5


def test_a_notes_box_has_the_colour_the_figure_gives_it():
    import plotly.graph_objects as go

    figure = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 2, 3], mode="lines", name="run 1"))
    figure.add_annotation(x=1, y=2, text="given", ax=30, ay=-30, showarrow=True,
                          bgcolor="rgba(255,255,255,0.9)")
    figure.add_annotation(x=2, y=3, text="not given", ax=-30, ay=20, showarrow=True)
    boxes = {g.find("s:text", NS).text: g.find("s:rect", NS).get("fill")
             for g in _all(_of(figure), "g") if g.get("class") == "point-label"}
    assert boxes == {"given": "rgba(255,255,255,0.9)", "not given": svg.FALLBACK_NOTE_FILL}


def test_bars_side_by_side_and_a_waterfalls_running_totals():
    import plotly.graph_objects as go

    figure = go.Figure()
    for name, colour, values in (("measured", "#1B2A41", [100, 50, -30]),
                                 ("predicted", "#0072B2", [100, 60, -40])):
        figure.add_trace(go.Waterfall(
            name=name, x=["weights", "gradients", "never held at once", "peak"],
            measure=["relative", "relative", "relative", "total"], y=[*values, 0],
            texttemplate=["", "", "", "%{final:,.0f}"], textposition="outside",
            increasing={"marker": {"color": colour}}, decreasing={"marker": {"color": "red"}},
            totals={"marker": {"color": "grey"}}))
    figure.update_layout(waterfallmode="group",
                         xaxis={"categoryorder": "array",
                                "categoryarray": ["weights", "gradients", "never held at once",
                                                  "peak"]})
    root = _of(figure)
    bars = _all(root, "rect", "bar")
    assert [b.get("data-category") for b in bars] == [
        "weights", "gradients", "never held at once", "peak"] * 2
    heights = [float(b.get("height")) for b in bars]
    unit = heights[0] / 100
    assert [h / unit for h in heights] == pytest.approx([100, 50, 30, 120, 100, 60, 40, 120],
                                                         abs=0.5)
    assert [b.get("fill") for b in bars[:4]] == ["#1B2A41", "#1B2A41", "red", "grey"]
    assert [t.text for t in _all(root, "text", "bar-text")] == ["120", "120"]
    assert len(_all(root, "line", "connector")) == 6  # each step joined to the next
    # Side by side: the predicted bar of a category at the right of the measured one.
    assert float(bars[4].get("x")) > float(bars[0].get("x"))
    names = [t.text or "".join(s.text for s in t) for t in _all(root, "text", "x-tick")]
    assert names == ["weights", "gradients", "never held at once", "peak"]


def test_category_names_too_wide_for_their_slots_are_written_under_every_other_one():
    """A dataset's lengths in 16 bins ("93–100", "101–108", …): each name wider than its slot
    ran into the next ("93–100101–108109–116"). Every bar is drawn; the names written under
    them are every second one (every one where they fit), none overlapping the next, and the
    last one always: the Anatomy page's waterfall of a CPU run, ten bars, left its last pair,
    the peak RSS it ends on, without a name."""
    import plotly.graph_objects as go

    for count, written in ((16, [0, 2, 4, 6, 8, 10, 12, 15]), (15, list(range(0, 15, 2))),
                           (6, list(range(6)))):
        names = [f"{8 * i + 5:,}–{8 * i + 12:,}" for i in range(count)]
        root = _of(go.Figure(go.Bar(x=names, y=list(range(1, count + 1)))))
        assert [b.get("data-category") for b in _all(root, "rect", "bar")] == names
        ticks = _all(root, "text", "x-tick")
        assert [t.text for t in ticks] == [names[i] for i in written]
        middles = [float(t.get("x")) for t in ticks]
        widest = max(len(n) for n in names) * svg.TICK_FONT_PX * 0.55
        assert min(b - a for a, b in zip(middles, middles[1:])) > widest


@pytest.mark.parametrize("change", ["symbol", "stacked", "template", "inside", "heatmap",
                                    "ticks"])
def test_what_the_picture_cannot_draw_as_the_chart_does_is_refused(change):
    import plotly.graph_objects as go

    figure = go.Figure()
    if change == "symbol":
        figure.add_scatter(x=[1], y=[1], mode="markers", marker={"symbol": "star"})
    elif change == "stacked":
        figure.add_bar(x=["a"], y=[1])
        figure.add_bar(x=["a"], y=[2])
        figure.update_layout(barmode="stack")
    elif change == "template":
        figure.add_bar(x=["a"], y=[1], texttemplate="%{customdata}", textposition="outside")
    elif change == "inside":
        figure.add_bar(x=["a"], y=[1], text=["1"], textposition="inside")
    elif change == "ticks":  # the picture writes round numbers: "Run 13" was left out
        figure.add_scatter(x=[0], y=[100], mode="markers")
        figure.update_layout(xaxis={"tickmode": "array", "tickvals": [0, 1],
                                    "ticktext": ["Run 13", "Run 14"]})
    else:
        figure.add_heatmap(z=[[1, 2]])
    with pytest.raises(svg.Unsupported):
        svg.picture(figure)


def _run(id_: int, speed: float, peak: int, batch: int):
    from types import SimpleNamespace

    return SimpleNamespace(id=id_, status="completed", samples_per_second=speed, peak_mb=peak,
                           batch_size=batch, precision="fp32", device="NVIDIA H200",
                           preset="bert-large-uncased", seq_len=512, gradient_checkpointing=False)


def test_two_runs_of_one_batch_size_at_one_point_are_labelled_once():
    from anatomy.views.figures import runs

    rows = [_run(1, 21.2, 7220, 4), _run(2, 21.2, 7220, 4), _run(3, 40.0, 60_000, 64)]
    labels = runs.batch_labels(rows, log=True)
    assert [labels[i][0] for i in (1, 2, 3)] == ["bs 4", "", "bs 64"]
    root = _of(runs.efficiency_figure(rows))
    assert sorted(t.text for t in _all(root, "text", "point-text")) == ["bs 4", "bs 64"]
    assert len(_all(root, "circle", "marker")) == 3  # every run still a point


def test_the_runs_labels_cover_no_other_label_and_no_marker():
    from anatomy.views.figures import runs

    # A batch-size ladder with runs of about the same speed and peak (the docs' demo runs).
    rows = [_run(i, speed, peak, batch) for i, (speed, peak, batch) in enumerate([
        (42.5, 108242, 128), (39.6, 56702, 64), (35.5, 30732, 32), (29.9, 17908, 16),
        (23.3, 11424, 8), (15.6, 8536, 4), (9.4, 7266, 2), (5.1, 7258, 1), (20.8, 7240, 4),
        (23.5, 7660, 4), (21.2, 7220, 8), (26.2, 8536, 4)])]
    root = _of(runs.efficiency_figure(rows))
    boxes = []
    for text in _all(root, "text", "point-text"):
        x, y, width = float(text.get("x")), float(text.get("y")), len(text.text) * 6.5
        left = {"start": x, "end": x - width, "middle": x - width / 2}[text.get("text-anchor")]
        boxes.append((left, left + width, y - 11, y + 2, text.text))
    markers = [(float(c.get("cx")) - 5.5, float(c.get("cx")) + 5.5, float(c.get("cy")) - 5.5,
                float(c.get("cy")) + 5.5, "marker") for c in _all(root, "circle", "marker")]
    assert len(boxes) == len(rows)  # each batch size at its own point: every run labelled
    hits = [(a[4], b[4]) for i, a in enumerate(boxes) for b in [*boxes[i + 1:], *markers]
            if a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]]
    assert hits == []


def test_a_name_with_markdown_in_it_is_drawn_as_written_and_is_no_markup(store, seed):
    """The page writes the picture with st.markdown: a run named "**v2** $x^2$ :red[r]" split the
    Compare page's legend out of the picture, in bold, red and as a formula. Markdown's
    characters are character references in the SVG: the same characters drawn, none read."""
    import plotly.graph_objects as go

    name = "**v2** <b>x</b> :red[r] $x^2$ _it_ `c` ~d~ a\\b"
    figure = go.Figure(go.Scatter(x=[0, 1], y=[1, 2], mode="lines", name=name))
    drawn = svg.picture(figure)
    legend = [g.find("s:text", NS).text for g in ET.fromstring(drawn).iter(f"{{{NS['s']}}}g")
              if g.get("class") == "legend-item"]
    assert legend == [name]
    assert not set("*$[]_`~\\") & set(re.sub(r"<[^>]*>", "", drawn))  # text outside the tags


def test_a_legend_name_is_drawn_as_plotly_draws_it_and_cut_where_wider_than_the_picture():
    """The Compare page's labels are escaped for Plotly ("&lt;b&gt;", drawn "<b>"): the picture
    drew "&lt;b&gt;". A name wider than the picture ran off its right edge."""
    import html

    import plotly.graph_objects as go

    figure = go.Figure([go.Scatter(x=[0, 1], y=[1, 2], mode="lines",
                                   name=html.escape("Run 1 · <b>x</b> & co", quote=False)),
                        go.Scatter(x=[0, 1], y=[2, 1], mode="lines", name="Run 2 · " + "n" * 400)])
    root = ET.fromstring(svg.picture(figure, width=600))
    legend = [g.find("s:text", NS).text for g in root.iter(f"{{{NS['s']}}}g")
              if g.get("class") == "legend-item"]
    assert legend[0] == "Run 1 · <b>x</b> & co"
    assert legend[1].startswith("Run 2 · nnn") and legend[1].endswith("…")
    assert len(legend[1]) < 600 / 5
