"""The dashboard end to end: `streamlit run app.py`, headless Chromium, a real tiny CPU run started
from the form, watched until its four phases and its summary are on screen."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from anatomy.analysis.report import report
from anatomy.store import Store
from anatomy.views import session

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROJECT = Path(__file__).resolve().parent.parent
ARTIFACTS = PROJECT / "test-artifacts"
RUN_SECONDS = 120  # a tiny CPU run takes ~15 s on two cores; CI machines can be slower


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """The app as `make run` serves it, on its own port and its own store."""
    port = _free_port()
    log = (tmp_path / "server.log").open("w+")
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "anatomy.sqlite")}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.headless", "true"], cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://localhost:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            pytest.fail(f"streamlit did not start:\n{log.read()}")
        time.sleep(0.3)
    yield url, Store(env["ANATOMY_STORE"]), log
    process.terminate()
    process.wait(timeout=20)
    log.close()


# Plotly keeps the drawn figure on its element: read the bands and markers the browser shows.
PHASES_DRAWN = """() => {
  const plot = document.querySelector('.js-plotly-plot');
  if (!plot || !plot._fullLayout) return null;
  return {
    bands: plot._fullLayout.shapes.map(s => s.name),
    labels: plot._fullLayout.annotations.map(a => a.text),
  };
}"""


@pytest.mark.skipif(not CHROMIUM.exists(),
                    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")
def test_a_run_started_from_the_form_shows_its_phases_live_and_its_summary(server):
    from playwright.sync_api import expect, sync_playwright

    url, store, log = server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        try:
            page.goto(url)
            expect(page.get_by_text("No run in progress")).to_be_visible(timeout=30_000)
            page.get_by_role("spinbutton", name="Dataset size", exact=True).fill("64")
            page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("128")
            page.get_by_role("spinbutton", name="Sample rate (Hz)", exact=True).fill("50")
            page.get_by_role("button", name="Start").click()

            # Live: the bands appear as the phases begin. Reload mid-run: nothing is lost.
            page.wait_for_function(
                f"(() => {{ const d = ({PHASES_DRAWN})(); return d && d.bands.length >= 2; }})",
                timeout=RUN_SECONDS * 1000)
            page.screenshot(path=ARTIFACTS / "live-cpu-running.png")
            page.reload()

            expect(page.get_by_text("Samples/second:")).to_be_visible(timeout=RUN_SECONDS * 1000)
            page.wait_for_function(
                f"(() => {{ const d = ({PHASES_DRAWN})(); return d && d.bands.length == 4; }})",
                timeout=30_000)
            drawn = page.evaluate(PHASES_DRAWN)
            shown_summary = page.locator("code", has_text="Samples/second:").inner_text()
            page.wait_for_timeout(500)  # let the last frame of the chart settle for the picture
            page.screenshot(path=ARTIFACTS / "live-cpu.png", full_page=True)
        finally:
            browser.close()

    assert drawn["bands"] == ["baseline", "kernel", "weights", "training"]
    assert sum(label.endswith(" MB</b>") for label in drawn["labels"]) == 4  # one marker a phase
    (run,) = store.runs()
    assert run.status == "completed"
    assert store.sample_count(run.id) == run.samples_sent  # the reload lost nothing
    assert shown_summary.strip().splitlines() == session.summary_lines(report(store, run.id))
    log.seek(0)
    server_log = log.read()
    assert "Traceback" not in server_log and "Error" not in server_log, server_log
