"""The dashboard end to end: `anatomy dashboard` and headless Chromium. A real tiny CPU run
started from the form and watched to its summary; one stopped from the page; and what a newcomer
saw on GPU-like stored runs (tools/demo_store.py): the app's own navigation on a fresh server's
first request, every asset served locally, no WebGL, nothing cut or overlapping at 1,000 px, an
exported chart that holds its labels."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.views import export
from anatomy.views.live import summary_lines
from tests.conftest import PROJECT, USERS_SHAPES, seed_users_run
from tests.e2e.conftest import (
    ARTIFACTS,
    HANG_SECONDS,
    Terminal,
    kill_all,
    left,
    serve,
    stop,
    stopped,
)
from tests.helpers import free_port, wait_until
from tools import demo_store
from tools.browser import WAIT_MS, healthy, wait_for_charts

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")]

RUN_SECONDS = 120  # a tiny CPU run takes ~15 s on two cores; CI machines can be slower
NARROW = {"width": 1000, "height": 900}  # a laptop's window with the sidebar open


def _serve(tmp_path: Path, store_path: Path):
    """The app as `make run` serves it, on its own port and store."""
    return serve([sys.executable, "-m", "anatomy", "dashboard", "--port", "{port}", "--store",
                  str(store_path)], cwd=PROJECT, log_path=tmp_path / "server.log")


@pytest.fixture
def server(tmp_path):
    """The app on an empty store."""
    process, url, log = _serve(tmp_path, tmp_path / "anatomy.sqlite")
    yield url, Store(tmp_path / "anatomy.sqlite"), log
    stop(process, log)


@pytest.fixture
def gpu_store(tmp_path) -> Store:
    """The H200 runs of docs/data in a store (tools/demo_store.py)."""
    return demo_store.build(tmp_path / "anatomy.sqlite", sweep=False)


@pytest.fixture
def gpu_runs(tmp_path, gpu_store):
    """A fresh server on the H200 runs of docs/data, no request served yet. Yields the url, the
    store and the server's log."""
    store = gpu_store
    process, url, log = _serve(tmp_path, store.path)
    yield url, store, log
    stop(process, log)


@pytest.fixture(scope="module")
def every_kind_of_run(tmp_path_factory):
    """A server on the H200 runs of docs/data (ids as gpu_runs's) and a user's run of each shape
    (a Trainer with the callback, the phase API, a watched command), for the tests that only read
    pages (one server a module, per pytest-xdist worker). Yields the url and {shape: run id}."""
    folder = tmp_path_factory.mktemp("every-kind-of-run")
    store = demo_store.build(folder / "anatomy.sqlite", sweep=False)
    runs = {"gpu": store.runs()[-1].id}
    runs.update({shape: seed_users_run(store, shape, name="my run" if shape == "phase api" else
                                       None) for shape in USERS_SHAPES})
    process, url, log = _serve(folder, store.path)
    yield url, runs
    assert "Traceback" not in stop(process, log)


# Plotly keeps the drawn figure on its element: read the bands and markers the browser shows.
PHASES_DRAWN = """() => {
  const plot = document.querySelector('.js-plotly-plot');
  if (!plot || !plot._fullLayout) return null;
  return {
    bands: plot._fullLayout.shapes.map(s => s.name),
    labels: plot._fullLayout.annotations.map(a => a.text),
  };
}"""
# A run's memory as the page's SVG picture (views/figures/svg.py), and how many Plotly charts.
PHASES_PICTURED = """() => {
  const picture = document.querySelector('svg.anatomy-chart');
  if (!picture || !picture.querySelector('polyline')) return null;
  return {
    bands: [...picture.querySelectorAll('rect[data-band]')].map(r => r.dataset.band),
    labels: [...picture.querySelectorAll('g.band-label text')].map(t => t.textContent),
    ends: [...picture.querySelectorAll('g.point-label text')].map(t => t.textContent),
    axis: picture.querySelector('text.y-title').textContent,
    plotly: document.querySelectorAll('.js-plotly-plot').length,
  };
}"""
# Every text annotation of every chart as drawn: its box, and the box of its chart's SVG.
ANNOTATION_BOXES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(plot => {
  const frame = plot.querySelector('.main-svg').getBoundingClientRect();
  const boxes = [...plot.querySelectorAll('g.annotation')].map(a => {
    const r = a.querySelector('.annotation-text-g').getBoundingClientRect();
    return {text: a.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
  });
  return {frame: {left: frame.left, right: frame.right, top: frame.top, bottom: frame.bottom},
          boxes: boxes.filter(b => b.right > b.left)};
})"""
# The same for the pictures (views/figures/svg.py): their labels and the words beside points
# and over bars, and the box of the picture.
PICTURE_BOXES = """() => [...document.querySelectorAll('svg.anatomy-chart')].map(picture => {
  const frame = picture.getBoundingClientRect();
  const texts = [...picture.querySelectorAll(
    'g.band-label text, g.label text, g.point-label text, text.point-text, text.bar-text')];
  const boxes = texts.map(t => { const r = t.getBoundingClientRect();
    return {text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; });
  return {frame: {left: frame.left, right: frame.right, top: frame.top, bottom: frame.bottom},
          boxes: boxes.filter(b => b.right > b.left)};
})"""
# Elements whose text is cut (an ellipsis: wider inside than shown).
CUT = """(selector) => [...document.querySelectorAll(selector)]
  .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""


def _overlaps(chart: dict) -> list[tuple[str, str]]:
    boxes = chart["boxes"]
    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a["left"] < b["right"] - 1 and b["left"] < a["right"] - 1
            and a["top"] < b["bottom"] - 1 and b["top"] < a["bottom"] - 1]


def _outside(chart: dict) -> list[str]:
    frame = chart["frame"]
    return [b["text"] for b in chart["boxes"]
            if b["left"] < frame["left"] - 1 or b["right"] > frame["right"] + 1]


def test_a_run_started_from_the_form_shows_its_phases_live_and_its_summary(server, chromium):
    url, store, log = server
    page = chromium.new_page(viewport={"width": 1400, "height": 1500})
    page.goto(url)
    from playwright.sync_api import expect

    expect(page.get_by_text("No run in progress")).to_be_visible(timeout=30_000)
    page.get_by_role("spinbutton", name="Dataset size", exact=True).fill("64")
    page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("128")
    page.get_by_role("spinbutton", name="Sample rate (Hz)", exact=True).fill("50")
    page.get_by_role("button", name="Predict memory and time").click()
    expect(page.get_by_text("steps ×").first).to_be_visible(timeout=RUN_SECONDS * 1000)  # before Start
    page.get_by_role("button", name="Start", exact=True).click()

    # Live: the bands appear as the phases begin, in the picture drawn while the run trains.
    # Reload mid-run: nothing is lost.
    page.wait_for_function(
        f"(() => {{ const d = ({PHASES_PICTURED})(); return d && d.bands.length >= 2; }})",
        timeout=RUN_SECONDS * 1000)
    pictured = page.evaluate(PHASES_PICTURED)
    page.screenshot(path=ARTIFACTS / "live-cpu-running.png")
    assert pictured["bands"][:2] == ["baseline", "kernel"]
    # A CPU's kernel phase, said as it lasts ("…") or not
    assert [label.removesuffix(" …") for label in pictured["labels"][:2]] == [
        "baseline", "torch loaded"]
    assert pictured["axis"] == "CPU memory, RSS (MiB)"
    assert pictured["plotly"] == 0  # no Plotly chart while it trains: a new tab's first is slow
    page.reload()

    expect(page.get_by_text("Samples/second:")).to_be_visible(timeout=RUN_SECONDS * 1000)
    # Ended: still a picture in this tab, now of its four phases, a marker at each one's end.
    page.wait_for_function(
        f"(() => {{ const d = ({PHASES_PICTURED})(); return d && d.bands.length == 4; }})",
        timeout=30_000)
    ended = page.evaluate(PHASES_PICTURED)
    assert ended["bands"] == ["baseline", "kernel", "weights", "training"]
    assert len(ended["ends"]) == 4 and all(end.endswith(" MiB") for end in ended["ends"])
    # The same chart interactive, from the sidebar's switch.
    page.locator("[data-testid=stSidebar]").get_by_text("Interactive charts").click()
    page.wait_for_function(
        f"(() => {{ const d = ({PHASES_DRAWN})(); return d && d.bands.length == 4; }})",
        timeout=30_000)
    drawn = page.evaluate(PHASES_DRAWN)
    shown_summary = page.locator("code", has_text="Samples/second:").inner_text()
    # The forecast belonged to the run before it ended: it has gone.
    assert page.get_by_text("steps ×").count() == 0
    page.wait_for_timeout(500)  # let the last frame of the chart settle for the picture
    page.screenshot(path=ARTIFACTS / "live-cpu.png", full_page=True)

    assert drawn["bands"] == ["baseline", "kernel", "weights", "training"]
    assert sum(label.endswith(" MiB</b>") for label in drawn["labels"]) == 4  # one marker a phase
    (run,) = store.runs()
    assert run.status == "completed"
    assert store.sample_count(run.id) == run.samples_sent  # the reload lost nothing
    assert shown_summary.strip().splitlines() == summary_lines(report(store, run.id))
    assert store.host_status(run.id)  # the device panel's readings were taken too
    server_log = _stop_log(log)
    assert "Traceback" not in server_log and "Error" not in server_log, server_log


def _stop_log(log) -> str:
    log.seek(0)
    return log.read()


def test_enter_in_a_run_option_keeps_its_value_and_starts_nothing(server, chromium):
    from playwright.sync_api import expect

    url, store, log = server
    page = chromium.new_page(viewport=NARROW)
    page.goto(url)
    batch = page.get_by_role("spinbutton", name="Batch size", exact=True)
    batch.fill("6")
    batch.press("Enter")
    page.get_by_role("spinbutton", name="Dataset size", exact=True).press("Enter")
    # A button of the form that starts nothing: its answer comes after whatever Enter sent.
    page.get_by_role("button", name="Predict memory and time").click()
    expect(page.get_by_text("steps ×").first).to_be_visible(timeout=RUN_SECONDS * 1000)
    assert store.runs() == []
    assert page.get_by_text("No run in progress").count() == 1
    assert batch.input_value() == "6"  # kept, and sent with the form's button
    assert "Traceback" not in _stop_log(log)


def test_stop_answers_at_once_and_nothing_is_cut_at_1000_px(server, chromium):
    from playwright.sync_api import expect

    url, store, log = server
    page = chromium.new_page(viewport=NARROW)
    page.goto(url)
    page.get_by_role("spinbutton", name="Dataset size", exact=True).fill("100000")
    page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("32")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.get_by_text("training: step").first).to_be_visible(timeout=RUN_SECONDS * 1000)
    expect(page.get_by_text("training (now)")).to_be_visible(timeout=60_000)
    page.wait_for_timeout(1500)  # the device panel's sparklines, a refresh later
    cut = page.evaluate(CUT, "[data-testid=stMetricValue] div, button p")
    page.screenshot(path=ARTIFACTS / "live-cpu-1000px.png")
    assert cut == [], f"cut at 1,000 px: {cut}"

    page.get_by_role("button", name="Stop", exact=True).click()
    # The page answers before the process has ended (timings: bench/dashboard_latency.py).
    expect(page.get_by_role("button", name="Stopping…")).to_be_visible(timeout=10_000)
    expect(page.get_by_text("stopped by the user")).to_be_visible(timeout=60_000)
    (run,) = store.runs()
    assert run.status == "stopped"
    assert "Traceback" not in _stop_log(log)


# The dashboard's process group as a terminal or a service manager signals it, and its server
# alone (`kill PID`).
STOPPED_BY = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM",
              signal.SIGHUP: "SIGHUP: its terminal was closed"}


@pytest.mark.parametrize("to_group", [True, False], ids=["its-group", "its-server-alone"])
@pytest.mark.parametrize("signum", list(STOPPED_BY), ids=lambda s: signal.Signals(s).name)
def test_stopping_the_dashboard_stops_its_run_recorded_as_stopped_and_leaves_no_process(
        tmp_path, chromium, signum, to_group):
    store_path = tmp_path / "anatomy.sqlite"
    process, url, log = serve([sys.executable, "-m", "anatomy", "dashboard", "--port", "{port}",
                               "--store", str(store_path)], cwd=PROJECT,
                              log_path=tmp_path / "server.log", start_new_session=True)
    try:
        page = chromium.new_page(viewport=NARROW)
        page.goto(url)
        page.get_by_role("spinbutton", name="Max steps", exact=True).fill("100000")
        page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("32")
        page.get_by_role("button", name="Start", exact=True).click()
        store = Store(store_path, read_only=True)
        # Training: every process of the run is there, and samples are stored.
        page.get_by_text("training (now)").wait_for(timeout=RUN_SECONDS * 1000)
        (run,) = store.runs()
        processes = psutil.Process(process.pid).children(recursive=True)
        assert psutil.pid_exists(run.worker_pid) and len(processes) >= 2
        page.close()  # the tab goes first; the run goes on
        (os.killpg if to_group else os.kill)(process.pid, signum)
        process.wait(timeout=HANG_SECONDS)
    finally:
        text = stop(process, log)
    run = store.run(run.id)
    assert (run.status, run.error) == ("stopped",
                                       f"stopped with the dashboard, by {STOPPED_BY[signum]}")
    assert store.sample_count(run.id) > 0 and report(store, run.id).training is not None
    assert left(processes) == []
    assert "Traceback" not in text, text


def test_ctrl_z_at_the_dashboards_terminal_pauses_its_run_and_fg_continues_it(tmp_path, chromium):
    """`anatomy dashboard` at a terminal, a run started from its form: Ctrl-Z stops the server as
    the job, and its run's training with it (the worker leads a process group of its own, which
    the terminal's signal does not reach: it trained on unseen); `fg` continues both, and Ctrl-C
    then stops the run with the server."""
    store_path, port = tmp_path / "anatomy.sqlite", free_port()
    terminal = Terminal(PROJECT)
    processes: list[psutil.Process] = []
    try:
        terminal.type(f"{sys.executable} -m anatomy dashboard --port {port} --store {store_path}\n")
        url = f"http://localhost:{port}"
        wait_until(lambda: healthy(url), 90, "the dashboard to answer its health check",
                   every=0.3, seen=lambda: terminal.output.decode(errors="replace"))
        page = chromium.new_page(viewport=NARROW)
        page.goto(url)
        page.get_by_role("spinbutton", name="Max steps", exact=True).fill("100000")
        page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("32")
        page.get_by_role("button", name="Start", exact=True).click()
        page.get_by_text("training (now)").wait_for(timeout=RUN_SECONDS * 1000)
        page.close()
        store = Store(store_path, read_only=True)
        (run,) = store.runs()
        worker = psutil.Process(run.worker_pid)
        server = worker.parent()
        processes = [server, *server.children(recursive=True)]
        terminal.type("\x1a")  # Ctrl-Z
        wait_until(lambda: stopped(worker) and stopped(server), 30,
                   "the server and its run's worker to stop as the job")
        spent = worker.cpu_times()
        time.sleep(1.0)
        assert stopped(worker) and worker.cpu_times() == spent
        terminal.type("fg\n")
        wait_until(lambda: not stopped(worker), 30, "the worker to go on with the job")
        steps = store.step_count(run.id)
        wait_until(lambda: store.step_count(run.id) > steps + 1, 60, "the run to train again")
        terminal.type("\x03")  # Ctrl-C
        wait_until(lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE,
                   HANG_SECONDS, "the server to end")
        assert left(processes) == []
    finally:
        terminal.close()
        kill_all(processes)
    run = store.run(run.id)
    assert (run.status, run.error) == ("stopped", "stopped with the dashboard, by Ctrl-C (SIGINT)")
    assert "Traceback" not in terminal.output.decode(errors="replace")


def test_a_fresh_servers_first_page_has_the_apps_navigation_and_fetches_nothing_elsewhere(
        gpu_runs, chromium):
    url, store, log = gpu_runs
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    elsewhere = []
    page.on("request", lambda request: elsewhere.append(request.url)
            if not request.url.startswith((url, "data:", "blob:")) else None)
    page.goto(f"{url}/runs?run=1")  # the server's very first request, and not "/"
    wait_for_charts(page, 2)
    page.wait_for_timeout(1000)
    links = page.locator("[data-testid=stSidebarNav] a").all_inner_texts()
    favicon = page.evaluate("() => document.querySelector('link[rel~=icon]').href")
    canvases = page.evaluate("() => document.querySelectorAll('canvas.gl-canvas').length")
    page.screenshot(path=ARTIFACTS / "first-request-runs.png")

    assert [link.split("\n")[-1] for link in links] == ["Live run", "Runs", "Compare", "Anatomy"]
    assert page.get_by_role("heading", name="Runs").count() == 1
    assert elsewhere == [], f"fetched from elsewhere: {elsewhere}"
    assert favicon.startswith(url)
    assert canvases == 0  # SVG charts: no WebGL context

    page.goto(f"{url}/compare?runs=1,2,3,4")
    wait_for_charts(page, 4)
    assert page.evaluate("() => document.querySelectorAll('canvas.gl-canvas').length") == 0
    assert elsewhere == []
    assert "Traceback" not in _stop_log(log)


def test_a_fresh_servers_first_request_for_a_shared_anatomy_link_finds_its_page(gpu_runs,
                                                                                   chromium):
    url, store, log = gpu_runs
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/anatomy?run=1")  # the server's very first request
    wait_for_charts(page, 2)
    page.wait_for_timeout(1000)
    page.screenshot(path=ARTIFACTS / "first-request-anatomy.png")
    assert page.get_by_text("Page not found").count() == 0
    assert page.get_by_role("heading", name="Anatomy").count() == 1
    assert page.url.startswith(f"{url}/anatomy")


def test_a_run_renamed_on_the_runs_page_stays_shown_at_the_next_click(gpu_runs, chromium):
    """Renamed, then the next click anywhere: the chooser's browser side still held the label
    of the old name, which matched no run, and the page jumped to the newest run."""
    url, store, log = gpu_runs
    first, newest = store.runs()[-1].id, store.runs()[0].id
    assert first != newest
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/runs?run={first}")
    wait_for_charts(page, 1)
    page.get_by_role("textbox", name="Name", exact=True).fill("gamma")
    page.keyboard.press("Enter")
    page.get_by_text(f"Run {first} saved").wait_for(timeout=60_000)
    page.get_by_text("Loss and step time").first.click()
    page.wait_for_function(f"() => /Run {first}: gamma/.test(document.body.innerText)"
                           " && !document.querySelector('[data-stale=\"true\"]')",
                           timeout=60_000)
    page.wait_for_timeout(1500)  # the rerun the click made has drawn
    assert page.url.endswith(f"run={first}")
    assert page.get_by_text(f"Run {first}: gamma").count() == 1
    assert store.run(first).name == "gamma"


def test_at_1000_px_no_label_overlaps_another_or_leaves_its_chart(every_kind_of_run, chromium):
    url, _ = every_kind_of_run
    page = chromium.new_page(viewport=NARROW)
    problems = {}
    for path, charts in (("/runs?run=1", 2), ("/anatomy?run=1", 4), ("/?run=3", 1)):
        page.goto(url + path)
        wait_for_charts(page, charts)
        page.wait_for_timeout(1000)
        pictured = page.evaluate(PICTURE_BOXES)
        assert pictured  # a new tab: pictures first
        # Then the same charts interactive (the sidebar's switch), as Plotly draws them.
        page.locator("[data-testid=stSidebar]").get_by_text("Interactive charts").click()
        page.wait_for_function(
            "() => !document.querySelector('svg.anatomy-chart')", timeout=WAIT_MS)
        wait_for_charts(page, charts)
        page.wait_for_timeout(1000)
        for index, chart in enumerate([*pictured, *page.evaluate(ANNOTATION_BOXES)]):
            found = _overlaps(chart) + [(text, "edge") for text in _outside(chart)]
            if found:
                problems[f"{path} chart {index}"] = found
        cut = page.evaluate(CUT, "[data-testid=stMetricValue] div")
        if cut:
            problems[f"{path} metrics"] = cut
        page.screenshot(path=ARTIFACTS / f"narrow{path.split('?')[0].replace('/', '-')}.png",
                        full_page=True)
    assert problems == {}


# The Live page's picture as drawn: its text's size, its plot, its y ticks, the labels of the
# phases' ends and of the bands.
PICTURE_LAYOUT = """() => {
  const picture = document.querySelector('svg.anatomy-chart');
  const box = e => { const r = e.getBoundingClientRect();
    return {text: e.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const scale = picture.getBoundingClientRect().width / picture.viewBox.baseVal.width;
  const tick = picture.querySelector('text.y-tick');
  return {tick_px: parseFloat(tick.getAttribute('font-size')) * scale,
          width: picture.getBoundingClientRect().width,
          plot: box(picture.querySelector(':scope > rect')),
          ticks: [...picture.querySelectorAll('text.y-tick')].map(box),
          ends: [...picture.querySelectorAll('g.point-label rect')].map(box),
          bands: [...picture.querySelectorAll('g.band-label rect')].map(box)};
}"""


# The picture's width in the first frame that shows it.
FIRST_WIDTH = """() => { const picture = document.querySelector('svg.anatomy-chart');
                       return picture && picture.getBoundingClientRect().width; }"""


def _meet(a: dict, b: dict) -> bool:
    return (a["left"] < b["right"] - 1 and b["left"] < a["right"] - 1
            and a["top"] < b["bottom"] - 1 and b["top"] < a["bottom"] - 1)


def test_the_live_chart_reads_at_1000_px_and_is_seen_whole_at_1280_by_800(every_kind_of_run,
                                                                            chromium):
    """At 1,000 px the picture's ticks were 7 px, the baseline's "39 MB" covered the tick
    "100" and the short phases' labels stacked over the curve's start; at 1280 x 800 the chart
    began below the window's edge. The page's style came after the chart (Streamlit's event
    container), which was first drawn between 80 px margins and then moved."""
    url, runs = every_kind_of_run
    problems = {}
    for shape in ("gpu", "phase api"):
        for width, height in ((1000, 900), (1280, 800)):
            page = chromium.new_page(viewport={"width": width, "height": height})
            page.goto(f"{url}/?run={runs[shape]}")
            first = page.wait_for_function(FIRST_WIDTH, polling="raf", timeout=WAIT_MS)
            first = first.json_value()
            wait_for_charts(page)
            page.wait_for_timeout(1000)
            drawn = page.evaluate(PICTURE_LAYOUT)
            page.screenshot(path=ARTIFACTS / f"live-chart-{width}-{shape.replace(' ', '-')}.png")
            found = {
                "ticks under 10.5 px": [] if drawn["tick_px"] >= 10.5 else [drawn["tick_px"]],
                "a tick covered": [(end["text"], tick["text"]) for end in drawn["ends"]
                                   for tick in drawn["ticks"] if _meet(end, tick)],
                "a band label in the plot": [band["text"] for band in drawn["bands"]
                                             if band["bottom"] > drawn["plot"]["top"] + 1],
                "the plot below the window": [] if drawn["plot"]["bottom"] <= height else
                [drawn["plot"]["bottom"]],
                "first drawn at another width": [] if abs(first - drawn["width"]) <= 1 else
                [first, drawn["width"]],
            }
            found = {what: items for what, items in found.items() if items}
            if found:
                problems[f"{shape} at {width} px"] = found
    assert problems == {}


def test_an_exported_chart_keeps_its_title_and_tick_labels_on_the_page(gpu_store, chromium,
                                                                       tmp_path):
    store = gpu_store  # a file of its own: no server
    exported = tmp_path / "run-1.html"
    exported.write_text(export.runs_html(store, [1]))
    page = chromium.new_page(viewport={"width": 1000, "height": 800})
    page.goto(exported.as_uri())
    wait_for_charts(page, 1, timeout_ms=60_000)
    boxes = page.evaluate("""() => {
      const box = e => { const r = e.getBoundingClientRect();
                         return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
      return {title: box(document.querySelector('.gtitle')),
              ticks: [...document.querySelectorAll('.ytick text')].map(box)}; }""")
    page.screenshot(path=ARTIFACTS / "exported-chart.png")
    assert boxes["ticks"] and all(t["left"] >= 0 for t in boxes["ticks"])  # none cut
    title = boxes["title"]
    assert all(title["bottom"] <= t["top"] or title["left"] >= t["right"]
               for t in boxes["ticks"])  # the title is above them, not on them


# What Glide's data grid draws on its canvas (Streamlit's dataframes), and whether it is cut: each
# cell's text is drawn inside a clip rectangle, the cell.
DRAWN_TEXT = """(() => {
  const P = CanvasRenderingContext2D.prototype;
  const drawn = window.__drawn = [];
  const rect = P.rect, clip = P.clip, save = P.save, restore = P.restore, fill = P.fillText;
  P.rect = function (x, y, w, h) { this.__rect = [x, y, w, h]; return rect.apply(this, arguments); };
  P.clip = function () { this.__clip = this.__rect; return clip.apply(this, arguments); };
  P.save = function () { (this.__clips = this.__clips || []).push(this.__clip);
                         return save.apply(this, arguments); };
  P.restore = function () { this.__clip = (this.__clips || []).pop();
                            return restore.apply(this, arguments); };
  P.fillText = function (text, x, y) {
    const c = this.__clip, w = this.measureText(text).width, a = this.textAlign;
    const left = a === 'right' || a === 'end' ? x - w : a === 'center' ? x - w / 2 : x;
    drawn.push({text: String(text),
                cut: !!c && (left < c[0] - 0.5 || left + w > c[0] + c[2] + 0.5)});
    return fill.apply(this, arguments);
  };
})();"""
# Text the page cuts: an element that hides what overflows it (an ellipsis, a clipped box) and is
# wider inside than shown. Tables and charts are judged by what they draw.
CUT_TEXT = """() => [...document.querySelectorAll('[data-testid=stMain] *, [data-testid=stSidebar] *')]
  .filter(e => !e.closest('[data-testid=stDataFrame], .js-plotly-plot, [data-testid=stCode]'))
  .filter(e => { const s = getComputedStyle(e);
    return (['hidden', 'clip', 'auto', 'scroll'].includes(s.overflowX) || s.textOverflow === 'ellipsis')
      && e.scrollWidth > e.clientWidth + 1 && e.innerText && e.innerText.trim(); })
  .map(e => e.innerText.trim().slice(0, 80))"""
# The page's script has run to its end (a prediction included) and every chart is drawn: a page
# just opened is "initial" until its first run begins, then "running", then "notRunning".
SETTLED = """() => document.querySelector('[data-testid=stApp]').dataset.testScriptState === 'notRunning'
  && !document.querySelector('[data-testid=stSpinner]')
  && [...document.querySelectorAll('.js-plotly-plot')].every(p => p._fullLayout)"""
# A table wider than its frame: scrolled sideways to be read (its columns' headings).
WIDE_TABLES = """() => [...document.querySelectorAll('[data-testid=stDataFrame]')]
  .filter(f => { const s = f.querySelector('.dvn-scroller');
                 return s && s.scrollWidth > s.clientWidth + 1; })
  .map(f => f.innerText.slice(0, 80))"""
# "Time: 3.85": a figure whose label says no unit ("Samples/second", "(MB)" say theirs).
UNITLESS = re.compile(r"^[A-Za-z ]+: -?[\d.,]+$")


def _what_is_wrong(page) -> dict[str, list[str]]:
    text = page.inner_text("body")
    drawn = page.evaluate("() => window.__drawn.splice(0)")
    found = {
        "errors": page.locator("[data-testid=stException]").all_inner_texts(),
        "None": sorted({line.strip()[:100] for line in text.splitlines()
                        if re.search(r"\bNone\b", line)}
                       | {d["text"] for d in drawn if re.search(r"\bNone\b", d["text"])}),
        "cut cells": sorted({d["text"] for d in drawn if d["cut"]}),
        "cut labels": sorted(set(page.evaluate(CUT_TEXT))),
        "no unit": sorted({line.strip() for line in text.splitlines()
                           if UNITLESS.match(line.strip())}),
        # A picture's labels (views/figures/svg.py): inside it, none over another.
        "cut or covered in a picture": sorted({
            f"{a} / {b}" for chart in page.evaluate(PICTURE_BOXES)
            for a, b in [*_overlaps(chart), *((t, "edge") for t in _outside(chart))]}),
    }
    return {what: items for what, items in found.items() if items}


@pytest.mark.timeout(2400)
def test_no_page_shows_none_a_figure_without_its_unit_or_a_cut_label_at_1000_px(
        every_kind_of_run, chromium):
    """Every page, on anatomy's own GPU runs and on a user's run of each shape, as a laptop shows
    it in a new tab (its charts pictures): no "None" (in the page's text, a picture's or drawn in
    a table), no number without its unit, no label, picture label or table cell cut; the Runs
    page's list read without scrolling sideways."""
    url, runs = every_kind_of_run
    page = chromium.new_page(viewport={"width": 1000, "height": 3000})  # every element drawn
    page.add_init_script(DRAWN_TEXT)
    everything = ",".join(str(i) for i in runs.values())
    paths = ["/", "/runs", f"/compare?runs={everything}",
             *(f"/?run={i}" for i in runs.values()),
             *(f"/runs?run={i}" for i in runs.values()),
             *(f"/anatomy?run={i}" for i in runs.values())]
    problems = {}
    for path in paths:
        page.goto(url + path)
        page.wait_for_function(SETTLED, timeout=300_000, polling=500)
        page.wait_for_timeout(1500)  # the tables' canvases drawn
        wrong = _what_is_wrong(page)
        if path.startswith("/runs") and page.evaluate(WIDE_TABLES):  # the list fits its page
            wrong["scrolls sideways"] = page.evaluate(WIDE_TABLES)
        if wrong:
            problems[path] = wrong
            name = path.strip("/").replace("?", "-").replace("=", "").replace(",", "-") or "live"
            page.screenshot(path=ARTIFACTS / f"wrong-{name}.png", full_page=True)
    assert problems == {}, json.dumps(problems, indent=1, ensure_ascii=False)
