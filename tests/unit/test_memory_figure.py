"""The memory figure, read as a plain Plotly object: traces, phase bands, end-of-phase markers."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.store import PHASES, PhaseMark, Sample, Step
from anatomy.units import MIB
from anatomy.views import style
from anatomy.views.figures import layout, live

GIB = 1024 * MIB


def _figure(store, run_id: int) -> go.Figure:
    return live.memory_figure(report(store, run_id), store.decimated(run_id), store.steps(run_id))


def _bands(figure: go.Figure) -> dict[str, tuple[float, float]]:
    return {s.name: (s.x0, s.x1) for s in figure.layout.shapes}


def test_a_band_runs_from_the_previous_phase_end_to_its_own_end(store, seed):
    run_id = seed()
    assert _bands(_figure(store, run_id)) == {
        "baseline": (0.0, 1.0), "kernel": (1.0, 3.0), "weights": (3.0, 5.0), "training": (5.0, 9.0)}


def test_an_open_phase_reaches_now_and_has_no_marker_yet(store, seed):
    run_id = seed(status="running", phases_reached=3)
    figure = _figure(store, run_id)
    assert list(_bands(figure)) == ["baseline", "kernel", "weights"]
    assert _bands(figure)["weights"] == (3.0, store.last_time(run_id))
    labels = [a.text for a in figure.layout.annotations if a.name == "weights"]
    assert labels == ["<b>weights</b> …"]  # the label says it is still going
    markers = next(t for t in figure.data if t.name == "end of phase")
    assert list(markers.x) == [1.0, 3.0]


def test_every_band_has_its_phase_colour_and_a_label(store, seed):
    figure = _figure(store, seed())
    for shape in figure.layout.shapes:
        assert shape.fillcolor == style.PHASE_COLOURS[shape.name]
        assert shape.layer == "below"
    assert [a.name for a in figure.layout.annotations if a.name in PHASES] == list(PHASES)


def test_markers_show_the_reports_memory_at_each_phase_end(store, seed):
    run_id = seed()
    rep = report(store, run_id)
    figure = _figure(store, run_id)
    markers = next(t for t in figure.data if t.name == "end of phase")
    assert list(markers.y) == [p.memory_mb for p in rep.phases] == [1024, 2048, 3072, 4096]
    assert list(markers.x) == [p.end_s for p in rep.phases]
    assert list(markers.text) == ["1,024 MiB", "2,048 MiB", "3,072 MiB", "4,096 MiB"]
    assert "GPU memory occupied: 4,096 MiB." in markers.hovertext[-1]
    boxes = [a.text for a in figure.layout.annotations if a.name.startswith("end of ")]
    assert boxes == [f"<b>{mb:,} MiB</b>" for mb in (1024, 2048, 3072, 4096)]


def test_a_gpu_of_another_host_is_named_by_its_host_not_by_the_key_it_is_stored_under(store, seed):
    """A run across hosts (no ranks told): the second host's GPU 0, stored as device_key(1, 0),
    was drawn as "GPU 1000"."""
    from anatomy.store import RunFacts, device_key

    run_id = seed()
    store.merge_environment(run_id, RunFacts.of(hosts=("node-a", "node-b")))
    store.write(run_id, samples=[Sample(t, device_key(1, 0), 2**30, None, None, None)
                                 for t in (0.5, 1.0)])
    names = [t.name for t in _figure(store, run_id).data]
    assert "node-b: GPU 0" in names and "node-a: GPU 0 (training)" in names, names


def test_one_svg_line_per_gpu_the_allocator_and_the_ceiling(store, seed):
    run_id = seed(gpus=2)
    figure = _figure(store, run_id)
    names = [t.name for t in figure.data]
    assert names == ["GPU 0 (training)", "GPU 1", "torch allocated", "torch reserved",
                     "GPU 0 total: 141.0 GiB (click to show)", "end of phase"]
    # SVG: a browser has a few WebGL contexts, and a live page redraws every second.
    assert all(type(t) is go.Scatter for t in figure.data)
    assert max(figure.data[0].y) == 4096 and max(figure.data[1].y) == 512
    reserved = figure.data[3]
    assert list(reserved.y) == [2048] * 8 and list(reserved.customdata) == list(range(1, 9))
    ceiling = figure.data[4]
    assert list(ceiling.y) == [141 * 1024] * 2
    assert ceiling.visible == "legendonly"  # 4 GiB under 141: drawn, it would flatten the curve
    assert figure.layout.yaxis.title.text == "GPU memory used (MiB)"


def test_the_ceiling_is_drawn_once_the_curve_comes_close(store, seed):
    run_id = seed()
    store.write(run_id, samples=[Sample(9.5, 0, 40 * GIB, None, 141 * GIB, None)])
    ceiling = next(t for t in _figure(store, run_id).data if "total" in t.name)
    assert ceiling.name == "GPU 0 total: 141.0 GiB" and ceiling.visible is True


def test_a_cpu_run_has_no_allocator_lines(store, seed):
    figure = _figure(store, seed(backend="cpu-rss"))
    assert [t.name for t in figure.data] == ["CPU RSS of the training process",
                                             "RAM total: 141.0 GiB (click to show)", "end of phase"]
    assert figure.layout.yaxis.title.text == "CPU memory, RSS (MiB)"


def test_zoom_survives_refreshes_of_one_run_only(store, seed):
    first, second = seed(), seed()
    assert _figure(store, first).layout.uirevision == _figure(store, first).layout.uirevision
    assert _figure(store, first).layout.uirevision != _figure(store, second).layout.uirevision


def test_a_run_without_samples_yet_draws_an_empty_chart(store):
    run_id = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})
    figure = _figure(store, run_id)
    assert figure.data == () and figure.layout.shapes == ()


def test_many_samples_draw_from_a_few_thousand_points_with_the_peak(store):
    # 250,000 samples: 60 times what is drawn, as a million is (bench/decimation.py draws a
    # million and more, and times it)
    run_id = store.create_run(RunOptions().to_dict(), "nvml", "v2", 0, {})
    n, peak_at = 250_000, 154_320
    store.write(run_id, samples=[Sample(i / 1000, 0,
                                        (9 * MIB if i == peak_at else 5 * MIB) + i % 3 * MIB,
                                        None, None, None) for i in range(n)])
    figure = _figure(store, run_id)
    curve = figure.data[0]
    assert len(curve.y) <= 2 * 2000 + 2
    assert max(curve.y) == 9  # the one spike among them survives
    assert curve.x[list(curve.y).index(9)] == peak_at / 1000


def test_labels_that_would_overlap_take_another_row():
    # 10 px a character at 1 x-unit a px: "baseline" needs 8 × 7.2 + 8 ≈ 66 units.
    assert layout.label_rows([0, 100, 200], ["baseline", "kernel", "weights"], 560) == [0, 0, 0]
    assert layout.label_rows([0, 10, 20, 300], ["baseline", "kernel", "weights", "training"],
                              560) == [0, 1, 2, 0]
    assert layout.label_rows([0, 70, 90], ["baseline", "kernel", "weights"], 560) == [0, 0, 1]


def test_a_long_run_keeps_its_short_phases_labels_apart(store):
    """The bands of a run whose training is long: three short phases in its first seconds
    ("ba|weights" overlapped); then zoomed on training, and against its steps."""
    run_id = store.create_run(RunOptions().to_dict(), "nvml", "v2", 0, {})
    marks = [PhaseMark(edge, name, t) for name, start, end in
             (("baseline", 0.1, 0.5), ("kernel", 1.0, 1.2), ("weights", 2.0, 2.2),
              ("training", 2.5, 300.0)) for edge, t in (("start", start), ("end", end))]
    store.write(run_id, samples=[Sample(i / 10, 0, (1 + i // 1000) * GIB, None, None, None)
                                 for i in range(3001)], phases=marks,
                steps=[Step(2.5 + k * 2.975, k, 100, 1.0 / k, None, None)
                       for k in range(1, 101)])
    rep = report(store, run_id)
    figure = live.memory_figure(rep, store.decimated(run_id), store.steps(run_id))
    labels = [a for a in figure.layout.annotations if a.name in PHASES]
    assert [a.yshift or 0 for a in labels] == [0, 18, 36, 54]  # all start in 2.2 s of 300
    # Above the plot, a row each, in the room the top margin keeps: not over the curve's start.
    assert {(a.y, a.yref, a.yanchor) for a in labels} == {(1, "paper", "bottom")}
    assert figure.layout.margin.t >= 4 * 18

    zoomed = live.memory_figure(rep, store.decimated(run_id), store.steps(run_id),
                                   axis="training")
    assert zoomed.layout.xaxis.range[0] == pytest.approx(2.5 - 0.03 * 297.5)
    assert zoomed.layout.xaxis.range[1] > 300.0
    assert zoomed.layout.uirevision != figure.layout.uirevision  # a new axis, a new zoom

    by_step = live.memory_figure(rep, store.decimated(run_id), store.steps(run_id),
                                    axis="step")
    curve = by_step.data[0]
    assert min(curve.x) == 0 and max(curve.x) == 100  # training only, step 0 to 100
    assert by_step.layout.xaxis.title.text == "training step"
    assert by_step.layout.shapes == ()  # one phase: no bands


def test_the_step_axis_waits_for_the_first_step(store, seed):
    run_id = seed(status="running", phases_reached=3)
    figure = live.memory_figure(report(store, run_id), store.decimated(run_id), [],
                                   axis="step")
    assert figure.layout.xaxis.title.text.startswith("seconds")  # no step yet: seconds


def test_loss_and_step_time_per_step(store, seed):
    run_id = seed()
    figure = live.steps_figure(report(store, run_id), store.steps(run_id))
    loss, times = figure.data
    assert list(loss.x) == list(range(1, 9)) and loss.y[0] == 1.0 and loss.y[-1] == 1 / 8
    # Step k ends at 6.0 + 0.4 k; training began at 6.0: every step took 0.4 s.
    assert list(times.y) == pytest.approx([0.4] * 8)
    assert figure.layout.xaxis2.title.text == "training step"


def test_the_profiling_stretch_is_drawn_and_left_out_of_the_peak(store, seed):
    run_id = seed()
    # torch.profiler after training: 5 GiB for a moment, more than training ever held.
    store.write(run_id, samples=[Sample(9.2 + i / 100, 0, 5 * GIB, None, 141 * GIB, None)
                                 for i in range(20)],
                phases=[PhaseMark("start", "profiling", 9.15), PhaseMark("end", "profiling", 9.5)])
    rep = report(store, run_id)
    assert rep.summary.peak_mb == 4096  # not 5120
    assert [p.name for p in rep.phases] == list(PHASES)  # the walkthrough's four only
    assert (rep.profiling.start_s, rep.profiling.end_s) == (9.15, 9.5)
    assert rep.to_dict()["profiling"]["memory_mb"] == 5120
    figure = _figure(store, run_id)
    assert _bands(figure)["profiling"] == (9.15, 9.5)
    label = next(a for a in figure.layout.annotations if a.name == "profiling")
    assert "not in the peak" in label.text


def test_the_workers_exit_after_its_last_phase_is_left_out_of_the_peak(store, seed):
    """On a CPU the interpreter's and torch's teardown as the worker exits rose above the training
    (986 vs 934 MiB for a tiny run): anatomy's worker does nothing after its last phase but exit.
    A user's script may (evaluate, save): its every sample counts."""
    exit_samples = [Sample(9.2 + i / 100, 0, 5 * GIB, None, None, None) for i in range(20)]
    worker = seed(backend="rss")
    store.write(worker, samples=exit_samples)
    assert report(store, worker).summary.peak_mb == 4096  # not 5120
    script = store.create_run({"batch_size": 4}, "rss", "rss", 0, {},
                              source={"kind": "script", "script": "train.py"}, preset="train.py")
    store.write(script, samples=[Sample(8.0, 0, 4 * GIB, None, None, None), *exit_samples],
                phases=[PhaseMark("start", "training", 6.0), PhaseMark("end", "training", 9.0)])
    store.finish(script, "completed")
    assert report(store, script).summary.peak_mb == 5120


def test_a_peak_before_a_moment_reads_the_bucket_it_cuts_exactly(store):
    run_id = store.create_run(RunOptions().to_dict(), "nvml", "v2", 0, {})
    store.write(run_id, samples=[Sample(1.01, 0, 7, None, None, None),
                                 Sample(1.04, 0, 9, None, None, None),
                                 Sample(1.06, 0, 99, None, None, None)])
    assert store.peak(run_id, 0) == 99
    assert store.peak(run_id, 0, before=1.05) == 9  # 1.0-1.1 is one bucket, cut at 1.05
    assert store.peak(run_id, 0, before=1.0) is None


def test_steps_of_one_length_are_one_time_not_float_noise(store, seed):
    """Steps ending of one length (0.3 s in a user's run): the step-time axis read 0.2999999999999933 to
    0.3000000000000006, the float noise of the differences."""
    run_id = seed()  # its steps end at 6.0 + 0.4 k s
    rep = report(store, run_id)
    assert set(layout.step_times(rep, store.steps(run_id))[1:]) == {0.4}


def test_the_labels_of_phases_that_end_close_together_keep_clear_of_one_another(store):
    """A user's short CPU run of a small model (seen in Chromium): torch loaded at 234 MiB and the
    weights at 351 MiB, 2 s apart in a 45 s run; both labels were pushed right of the axis, one
    above its marker and one below, and "351 MiB" lay over "234 MiB"."""
    run_id = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})
    ends = {"baseline": (0.9, 52), "kernel": (2.7, 234), "weights": (4.8, 351),
            "training": (44.8, 473)}
    marks, start = [], 0.1
    for name, (end, _) in ends.items():
        marks += [PhaseMark("start", name, start), PhaseMark("end", name, end)]
        start = end
    levels = [(end, mib) for end, mib in ends.values()]
    samples = [Sample(i / 10, 0, next(mib for end, mib in levels if i / 10 <= end) * MIB,
                      None, None, None) for i in range(449)]
    store.write(run_id, samples=samples, phases=marks)
    figure = _figure(store, run_id)
    notes = [a for a in figure.layout.annotations if a.name.startswith("end of ")]
    assert len(notes) == 4
    top = max(s.used for s in samples) / MIB
    rows = len({a.yshift or 0 for a in figure.layout.annotations if a.name in PHASES})
    height = layout.assumed_plot_height(rows)
    shown = (0.0, samples[-1].t)
    boxes = []
    for note in notes:
        at, y_px = live.plot_px(note.x, note.y, shown, top, height)
        box = live.note_box(at, y_px, note.ax, note.ay, note.text.removeprefix("<b>")
                            .removesuffix("</b>"))
        assert 0 <= box[2] and box[3] <= height  # inside the plot
        boxes.append(box)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a[1] <= b[0] or b[1] <= a[0] or a[3] <= b[2] or b[3] <= a[2]
            assert apart, (a, b)
