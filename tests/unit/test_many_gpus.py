"""What 8 and 64 GPUs look like on the pages (issue 21): a stored run with that many ranks
(tools/many_gpus.py: 8 GPUs on one host, 64 on eight hosts; one rank heavier, one late) renders on
Live, Runs, Anatomy and Compare, and every GPU is on them. How fast: bench/many_gpus.py."""

from __future__ import annotations

import pytest

from anatomy.analysis.report import report
from anatomy.views import gpus
from anatomy.views.figures import gpus as figures
from tests.apptest import chart_spec, open_page
from tools import many_gpus

SHAPES = {8: (1, 8), 64: (8, 8)}  # GPUs: (hosts, GPUs a host)


def _run(store, world: int) -> int:
    hosts, per_host = SHAPES[world]
    return many_gpus.add_run(store, hosts, per_host, rate=10.0, training_s=6.0, model="tiny",
                             seq_len=32)


def _labels(store, run_id: int) -> list[str]:
    return [rank.label() for rank in report(store, run_id).ranks]


def _traced(spec: dict) -> set[str]:
    return {trace["name"] for trace in spec["data"]}


@pytest.mark.parametrize("world", [8, 64])
def test_every_gpu_is_a_line_of_the_memory_chart_and_a_row_of_the_heat_strip(store, world):
    run_id = _run(store, world)
    labels = _labels(store, run_id)
    assert len(labels) == world
    if world == 64:
        assert labels[9] == "node-1 · GPU 1 (rank 9)"
    for page, key in (("screens/runs.py", "runs_view"), ("screens/live.py", "live_view")):
        app = open_page(page, run=str(run_id))
        memory = chart_spec(app, f"memory-{run_id}")
        assert set(labels) <= _traced(memory)
        # Beyond eight GPUs a panel per host, each of its GPUs a line, on one y range.
        panels = [a["text"] for a in memory["layout"].get("annotations", [])
                  if a["text"].startswith("node-")]
        assert panels == ([f"node-{h}: GPUs 0-7" for h in range(8)] if world == 64 else [])
        app.segmented_control(key=key).set_value("gpus").run()
        assert not app.exception
        strip = chart_spec(app, f"gpus-{run_id}")["data"][0]
        assert strip["type"] == "heatmap" and strip["y"] == labels
        assert list(app.dataframe[-1].value["GPU"]) == labels
        said = [w.value for w in app.warning]
        heavy, late = (labels[many_gpus.heavy_rank(world)], labels[many_gpus.late_rank(world)])
        assert any(w.startswith(heavy) and "above the median" in w for w in said)
        assert any(w.startswith(late) and "straggler" in w for w in said)


def test_anatomy_has_every_gpu_and_compare_their_spread(store):
    from anatomy.prediction import breakdown

    eight, sixty_four = _run(store, 8), _run(store, 64)
    # The rank's prediction (a trace of the tiny model, the same for 8 or 64 ranks) is made once
    # here, where no page's time limit runs: this test is about the GPUs the page shows.
    breakdown.rank_prediction_for(report(store, sixty_four))
    app = open_page("screens/anatomy.py", run=str(sixty_four))
    per_gpu = next(d.value for d in app.dataframe if "GPU" in d.value.columns)
    assert set(per_gpu["GPU"]) == set(_labels(store, sixty_four))
    assert any(m.value.startswith("64 GPUs on 8 hosts: peak ") for m in app.markdown)

    app = open_page("screens/compare.py", runs=f"{eight},{sixty_four}")
    assert not app.exception
    peaks = app.dataframe[0].value.loc["peak per GPU (MiB)"]
    assert peaks[f"Run {eight}"].count("GPU ") == 8  # eight are named one by one
    assert peaks[f"Run {sixty_four}"].startswith("64 GPUs: ")  # beyond, their spread


def test_the_spread_and_the_heat_strip_read_the_peaks(store):
    run_id = _run(store, 64)
    rep = report(store, run_id)
    found = gpus.spread(rep)
    peaks = sorted(r.peak_bytes for r in rep.ranks)
    assert (found.count, found.low, found.high) == (64, peaks[0], peaks[-1])
    assert found.highest == rep.ranks[many_gpus.heavy_rank(64)].label()
    strip = figures.heat_strip(rep, store.decimated(run_id, figures.buckets(rep)))
    grid = strip.data[0].z
    top = max(max(v for v in row if v == v) for row in grid)  # NaN: a bin without a sample
    assert top == pytest.approx(found.high / many_gpus.H200_TOTAL)
    assert figures.many(rep) and not figures.many(report(store, _run(store, 8)))


def test_a_run_of_two_hosts_draws_each_hosts_gpus_as_their_own_lines(store):
    """2 hosts × 2 GPUs (GPU 0 and 1 on each): four lines, each named by its host, though the
    hosts' GPUs share their NVML indices."""
    from anatomy.views.figures import live

    run_id = many_gpus.add_run(store, 2, 2, rate=10.0, training_s=3.0, model="tiny", seq_len=32)
    rep = report(store, run_id)
    names = [t.name for t in live.memory_figure(rep, store.decimated(run_id)).data
             if t.name.startswith("node-")]
    assert names == ["node-0 · GPU 0 (rank 0)", "node-0 · GPU 1 (rank 1)",
                     "node-1 · GPU 0 (rank 2)", "node-1 · GPU 1 (rank 3)"]


@pytest.mark.parametrize("hosts", [3, 4, 5, 6])
def test_a_panel_for_each_of_several_hosts_lies_inside_the_figure(store, hosts):
    """3 to 6 hosts of 8 GPUs: a panel each, every panel's axes within the figure (the last
    row's bottom, 1 less the rows above it, came out a hair below 0 and plotly refused it)."""
    run_id = many_gpus.add_run(store, hosts, 8, rate=5.0, training_s=2.0, model="tiny",
                               seq_len=32)
    rep = report(store, run_id)
    figure = figures.memory_chart(rep, store.decimated(run_id, figures.buckets(rep)))
    domains = [axis.domain for axis in figure.select_yaxes()]
    assert len(domains) == hosts
    assert all(0 <= low < high <= 1 for low, high in domains)
