"""How long each page takes to draw a run of 8 and of 64 GPUs (issue 21: ≤ 2 s a page), on a
stored run synthesized by tools/many_gpus.py at the rate a real one is sampled.

Two figures a page, each the median of --repeats, each as wall seconds and as this process's CPU
seconds (on a machine shared with other work the wall time counts the others' too):
- figures: what the page reads and builds for that run, without Streamlit — the report, the
  store's reads, the figures as Plotly objects and their JSON (what reaches the browser);
- page: the page's whole script through Streamlit's AppTest (the same process, no browser), after
  one warm-up run; the Anatomy page's rank prediction (a trace of the model, the same for 8 or 64
  ranks) is warm too, and timed on its own (`prediction`).

    PYTHONPATH=. .venv/bin/python bench/many_gpus.py [--rate 200] [--seconds 60] [--repeats 3]

Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple

from anatomy.analysis.report import report
from anatomy.prediction import breakdown
from anatomy.store import Store
from anatomy.views import compare as compare_view
from anatomy.views import gpus as gpus_view
from anatomy.views import live as live_view
from anatomy.views.figures import gpus as figures
from anatomy.views.figures import live as live_figures
from tools import many_gpus

SHAPES = {8: (1, 8), 64: (8, 8)}  # GPUs: (hosts, GPUs a host)


def _memory_and_strip(store: Store, run_id: int) -> None:
    """The Live and Runs pages: the memory chart, the Per GPU view (heat strip, table, words),
    the loss and step time."""
    rep = report(store, run_id)
    samples = store.decimated(run_id, figures.buckets(rep))
    figures.memory_chart(rep, samples, store.steps(run_id)).to_json()
    figures.heat_strip(rep, samples).to_json()
    gpus_view.gpu_rows(store, rep)
    gpus_view.standouts(rep)
    live_view.summary_lines(rep)
    live_figures.steps_figure(rep, store.steps(run_id)).to_json()


def _anatomy(store: Store, run_id: int) -> None:
    """The Anatomy page's per-GPU part (its prediction apart: `prediction`)."""
    from anatomy.views import anatomy as anatomy_view

    rep = report(store, run_id)
    predicted = breakdown.rank_prediction_for(rep)  # warm: cached in this process
    anatomy_view.rank_rows(rep, predicted)
    gpus_view.spread_line(rep)
    gpus_view.standouts(rep)


def _compare(store: Store, run_ids: list[int]) -> None:
    reports = [report(store, r) for r in run_ids]
    compare_view.side_by_side(reports)


class Took(NamedTuple):
    wall: float  # seconds
    cpu: float  # this process's CPU seconds (every thread): the wall time an idle machine gives

    def __str__(self) -> str:
        return f"{self.wall:.2f} ({self.cpu:.2f})"


def _timed(action) -> Took:
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return Took(time.perf_counter() - wall, time.process_time() - cpu)


def _median(action, repeats: int) -> Took:
    times = [_timed(action) for _ in range(repeats)]
    return Took(statistics.median(t.wall for t in times), statistics.median(t.cpu for t in times))


def _page_time(page: str, repeats: int, view: str | None = None, **query: str) -> Took:
    """The page's script run, as a link opens it; with `view`, the run charts' view switched to
    it (the time of that rerun alone)."""
    from tests.apptest import open_page

    app = open_page(page, **query)  # warm: imports, the app's first run
    if view is None:
        return _median(lambda: open_page(page, **query), repeats)
    key = "live_view" if page.endswith("live.py") else "runs_view"
    times = []
    for _ in range(repeats):
        app.segmented_control(key=key).set_value("memory").run()
        times.append(_timed(app.segmented_control(key=key).set_value(view).run))
        assert not app.exception, app.exception
    return Took(statistics.median(t.wall for t in times), statistics.median(t.cpu for t in times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="Hz per GPU")
    parser.add_argument("--seconds", type=float, default=60.0, help="of training")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="bert-large-uncased")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="anatomy-many-gpus-"))
    os.environ["ANATOMY_STORE"] = str(folder / "anatomy.sqlite")
    store = Store(os.environ["ANATOMY_STORE"])
    runs = {}
    for world, (hosts, per_host) in SHAPES.items():
        started = time.perf_counter()
        runs[world] = many_gpus.add_run(store, hosts, per_host, args.rate, args.seconds,
                                        model=args.model)
        print(f"{world} GPUs: run {runs[world]}, {store.sample_count(runs[world]):,} samples, "
              f"stored in {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    breakdown.rank_prediction_for(report(store, runs[64]))
    prediction = time.perf_counter() - started
    print(f"\nthe Anatomy page's rank prediction ({args.model}, first in this process): "
          f"{prediction:.1f} s; once made, it is cached", flush=True)
    print("\n| page | GPUs | figures: wall (CPU) s | page: wall (CPU) s |\n|---|---:|---:|---:|")
    for world, run_id in runs.items():
        other = runs[8 if world == 64 else 64]
        rows = [
            ("Live (a finished run)", partial(_memory_and_strip, store, run_id),
             ("screens/live.py", None, {"run": str(run_id)})),
            ("Live: Per GPU view", None, ("screens/live.py", "gpus", {"run": str(run_id)})),
            ("Runs", partial(_memory_and_strip, store, run_id),
             ("screens/runs.py", None, {"run": str(run_id)})),
            ("Runs: Per GPU view", None, ("screens/runs.py", "gpus", {"run": str(run_id)})),
            ("Anatomy", partial(_anatomy, store, run_id),
             ("screens/anatomy.py", None, {"run": str(run_id)})),
            ("Compare (with the other run)", partial(_compare, store, [other, run_id]),
             ("screens/compare.py", None, {"runs": f"{other},{run_id}"})),
        ]
        for name, action, (page, view, query) in rows:
            figure_s = None
            if action is not None:
                action()  # warm
                figure_s = _median(action, args.repeats)
            page_s = _page_time(page, args.repeats, view, **query)
            print(f"| {name} | {world} | {figure_s or '(in the row above)'} | {page_s} |",
                  flush=True)
    print(f"\nload average while it ran: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
