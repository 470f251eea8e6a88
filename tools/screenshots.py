"""The README's screenshots: the dashboard in headless Chromium (Playwright), on a store of runs.

    PYTHONPATH=. .venv/bin/python -m tools.screenshots [--runs FILE.json] [--out docs/screenshots]
    PYTHONPATH=. .venv/bin/python -m tools.screenshots --runs FILE.json --sizes "/?run=1" "/runs?run=1"

Without --runs the store is tools/demo_store.py's: the H200 runs of docs/data, rebuilt (their
phase figures, summaries and components are recorded; the curves between, each step's time and
loss, and the device panel are seeded). With --runs, the runs of an export file (`python -m
anatomy export … --format json`, real runs from a GPU) are imported first and shown instead.
A tiny CPU run is recorded for real first, from the Live page's form, for its two pictures;
the form's Predict on a dataset of texts (tools/demo_texts.py) for a third (`--dataset-only`:
that one alone). With --sizes, only the pages given, each at a laptop's two sizes (SIZES: the
whole page, and at 1280 x 800 also what the window shows first), named after the page and the
run (live-run1-1280.png, live-run1-1280x800.png, anatomy-run2-1000.png).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from anatomy.analysis import transfer
from anatomy.store import Store
from tools import demo_store, demo_texts
from tools.browser import ARGS, CHROMIUM, serve, wait_for_charts

PROJECT = Path(__file__).resolve().parent.parent
SETTLE_MS = 1500  # the last chart's transitions
SIZES = ((1280, 800), (1000, 900))  # a laptop's window, and a narrow one with the sidebar open
# The page's script has run to its end (a prediction included) and every chart is drawn.
SETTLED = """() => document.querySelector('[data-testid=stApp]').dataset.testScriptState
  === 'notRunning' && !document.querySelector('[data-testid=stSpinner]')
  && [...document.querySelectorAll('.js-plotly-plot')].every(p => p._fullLayout)"""


def _charts_drawn(page, count: int = 1) -> None:
    wait_for_charts(page, count)
    page.wait_for_timeout(SETTLE_MS)


def _shot(page, path: Path, full: bool = True, most: int = 6000) -> None:
    """The page; `full`: all of it, up to `most` pixels (Streamlit scrolls inside its main
    block, so the window is made as tall as that block first)."""
    if full:
        height = page.evaluate("() => document.querySelector('[data-testid=stMain]')"
                               ".scrollHeight")
        page.set_viewport_size({"width": 1400, "height": min(most, height + 40)})
        page.wait_for_timeout(SETTLE_MS)
    page.screenshot(path=path)
    page.set_viewport_size({"width": 1400, "height": 1000})
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="an export file of real runs to show instead")
    parser.add_argument("--out", type=Path, default=PROJECT / "docs" / "screenshots")
    parser.add_argument("--no-cpu-run", action="store_true", help="skip the live CPU run")
    parser.add_argument("--dataset-only", action="store_true",
                        help="only the form's Predict on a dataset (live-dataset-cpu.png)")
    parser.add_argument("--sizes", nargs="+", metavar="PAGE",
                        help="only these pages (/?run=1, /anatomy?run=2, /compare?runs=1,2), each "
                             "at 1280 and 1000 px")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    if args.dataset_only:
        with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
            server, url = serve(Path(folder) / "anatomy.sqlite")
            try:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                _dataset_forecast(browser.new_page(viewport={"width": 1400, "height": 1000}),
                                  url, args.out, Path(folder))
                browser.close()
            finally:
                server.terminate()
                server.wait(timeout=30)
        return

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "anatomy.sqlite"
        if args.runs:
            transfer.import_runs(Store(path), args.runs.read_bytes())
        else:
            demo_store.build(path)
        server, url = serve(path)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                if args.sizes:
                    for page_path in args.sizes:
                        _sized(browser, url, page_path, args.out)
                    browser.close()
                    return
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/?run=1")
                _charts_drawn(page)
                _shot(page, args.out / "live-gpu-h200.png")
                page.get_by_role("radio", name="Device").click()
                page.get_by_text("Processes on the GPU").wait_for(timeout=60_000)
                _charts_drawn(page)
                _shot(page, args.out / "device-gpu-h200.png", most=1700)
                page.goto(f"{url}/runs?run=1")
                _charts_drawn(page, 2)
                _shot(page, args.out / "runs-gpu-h200.png", most=1500)
                page.goto(f"{url}/compare?runs=1,2,3,4")
                _charts_drawn(page, 4)
                _shot(page, args.out / "compare.png", most=2300)
                page.goto(f"{url}/anatomy?run=1")
                _charts_drawn(page, 3)
                _shot(page, args.out / "anatomy.png")
                page.goto(f"{url}/compare?runs=1,2")
                page.get_by_role("tab", name="Sweep").click()
                _charts_drawn(page)
                page.get_by_text("Largest batch size").evaluate(
                    "e => e.scrollIntoView({block: 'start'})")
                page.wait_for_timeout(SETTLE_MS)
                _shot(page, args.out / "sweep.png", full=False)
                with tempfile.TemporaryDirectory() as texts:
                    _dataset_forecast(page, url, args.out, Path(texts))
                if not args.no_cpu_run:
                    _cpu_run(page, url, args.out)
                browser.close()
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def _settled(page) -> None:
    """Until the page has run to its end and stays so (a first run may be followed by another,
    which draws its elements again)."""
    for _ in range(2):
        page.wait_for_function(SETTLED, timeout=600_000, polling=500)
        page.wait_for_timeout(3 * SETTLE_MS)
    page.wait_for_function(SETTLED, timeout=600_000, polling=500)


def _sized(browser, url: str, page_path: str, out: Path) -> None:
    """One page at each of SIZES: the whole page, and at the first size what the window shows.
    A page ending in #Tab has that tab opened ("/compare?runs=1,2#Sweep")."""
    page_path, _, tab = page_path.partition("#")
    where, _, query = page_path.lstrip("/").partition("?")
    name = "-".join([where or "live", *(part.replace("=", "").replace(",", "-")
                                        for part in query.split("&") if part),
                     *([tab.lower()] if tab else [])])
    for width, height in SIZES:
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(url + page_path)
        _settled(page)
        if tab:
            page.get_by_role("tab", name=tab).click()
            _settled(page)
        if tab == "Sweep":  # its form whole: the base configuration open, "until out of memory"
            page.get_by_text("Base configuration", exact=True).click()
            page.get_by_text("Keep doubling the batch size").click()
            _settled(page)
        if (width, height) == SIZES[0]:
            page.screenshot(path=out / f"{name}-{width}x{height}.png")
            print(f"wrote {out / f'{name}-{width}x{height}.png'}")
        tall = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollHeight")
        page.set_viewport_size({"width": width, "height": min(6000, tall + 40)})
        page.wait_for_timeout(SETTLE_MS)
        page.screenshot(path=out / f"{name}-{width}.png")
        print(f"wrote {out / f'{name}-{width}.png'}")
        page.close()


def _cpu_run(page, url: str, out: Path) -> None:
    """A real tiny run from the form: once while it trains, once finished."""
    page.goto(url)
    page.get_by_role("spinbutton", name="Dataset size", exact=True).fill("256")
    page.get_by_role("button", name="Predict memory and time").click()
    page.get_by_text("steps ×").first.wait_for(timeout=60_000)
    page.get_by_role("button", name="Start", exact=True).click()
    page.get_by_text("training: step").first.wait_for(timeout=300_000)
    page.wait_for_function("() => /step ([3-9]|\\d\\d+) \\//.test(document.body.innerText)",
                           timeout=300_000)
    page.wait_for_timeout(SETTLE_MS)
    _shot(page, out / "live-cpu-running.png")
    page.get_by_text("Samples/second:").wait_for(timeout=600_000)
    _charts_drawn(page)
    _shot(page, out / "live-cpu.png")


def _dataset_forecast(page, url: str, out: Path, folder: Path) -> None:
    """The form's Predict on a dataset of texts (demo_texts.py's reviews): its lengths' histogram
    and the batches it predicts."""
    dataset, tokenizer = demo_texts.build(folder)
    page.goto(url)
    page.get_by_role("textbox", name="Dataset", exact=True).fill(str(dataset))
    page.get_by_role("textbox", name="Tokenizer", exact=True).fill(str(tokenizer))
    page.get_by_role("spinbutton", name="Batch size", exact=True).fill("64")
    page.get_by_role("button", name="Predict memory and time").click()
    page.get_by_text("at its longest batch").first.wait_for(timeout=300_000)
    page.mouse.move(0, 0)  # no button's help over the form
    _charts_drawn(page)
    _shot(page, out / "live-dataset-cpu.png", most=1800)


if __name__ == "__main__":
    main()
