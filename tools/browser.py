"""What the screenshots, the dashboard bench and the browser tests share: Debian's Chromium with
its arguments, a dashboard served on a free port over a given store, and when a page's charts are
drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.helpers import free_port, wait_until

PROJECT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# A Plotly chart is drawn once Plotly has laid it out and made its SVG.
_PLOT_DRAWN = "p => !!(p._fullLayout && p.querySelector('.main-svg'))"
# The page's first chart: a Plotly chart, or a picture of one (views/figures/svg.py) once it has
# what it shows: a curve, points or bars.
CHART_DRAWN = f"""() => [...document.querySelectorAll('.js-plotly-plot')].some({_PLOT_DRAWN})
  || !!document.querySelector(
    'svg.anatomy-chart polyline, svg.anatomy-chart .marker, svg.anatomy-chart .bar')"""
# At least `count` charts (Plotly charts and pictures), every Plotly chart among them drawn.
CHARTS_DRAWN = f"""(count) => {{ const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const pictures = document.querySelectorAll('svg.anatomy-chart').length;
  return plots.length + pictures >= count && plots.every({_PLOT_DRAWN}); }}"""
# A Plotly chart drawn that was not on the page when `mark_charts_seen` ran.
NEW_CHART_DRAWN = f"""() => [...document.querySelectorAll('.js-plotly-plot')]
  .some(p => !p.dataset.seen && ({_PLOT_DRAWN})(p))"""
_MARK_SEEN = "() => document.querySelectorAll('.js-plotly-plot').forEach(p => p.dataset.seen = '1')"
WAIT_MS = 120_000  # a page's charts on a loaded machine


def wait_for_chart(page, timeout_ms: int = WAIT_MS, polling: int | str = "raf") -> None:
    """Until the page shows its first chart (CHART_DRAWN)."""
    page.wait_for_function(CHART_DRAWN, timeout=timeout_ms, polling=polling)


def wait_for_charts(page, count: int = 1, timeout_ms: int = WAIT_MS) -> None:
    """Until the page shows `count` charts or more, its Plotly charts drawn (CHARTS_DRAWN)."""
    page.wait_for_function(CHARTS_DRAWN, arg=count, timeout=timeout_ms)


def mark_charts_seen(page) -> None:
    """Mark the charts on the page now, so that `wait_for_new_chart` waits for another."""
    page.evaluate(_MARK_SEEN)


def wait_for_new_chart(page, timeout_ms: int = WAIT_MS, polling: int | str = "raf") -> None:
    """Until a chart that `mark_charts_seen` did not mark is drawn."""
    page.wait_for_function(NEW_CHART_DRAWN, timeout=timeout_ms, polling=polling)


def serve(store: Path, project: Path = PROJECT, lock_dir: Path | None = None,
          first_on_path: Path | None = None) -> tuple[subprocess.Popen, str]:
    """The dashboard of `project` over `store`, once it answers its health check. Device locks of
    its own (`lock_dir`, by default beside the store): a run elsewhere on the machine does not
    make this one "busy". A checkout from before `anatomy dashboard` serves its app.py, so that
    the bench compares before and after. `first_on_path`: a folder put before the project on
    the server's Python path (a bench's sitecustomize.py)."""
    port = free_port()
    path = os.pathsep.join(str(p) for p in (first_on_path, project) if p is not None)
    env = {**os.environ, "ANATOMY_STORE": str(store), "PYTHONPATH": path,
           "ANATOMY_LOCK_DIR": str(lock_dir or store.parent)}
    command = (["-m", "anatomy", "dashboard", "--port", str(port), "--store", str(store)]
               if (project / "anatomy" / "cli" / "dashboard.py").exists() else
               ["-m", "streamlit", "run", "app.py", "--server.headless", "true",
                "--server.port", str(port)])
    process = subprocess.Popen([sys.executable, *command],
                               cwd=project, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://localhost:{port}"
    try:
        wait_until(lambda: healthy(url), 120, "streamlit to answer its health check",
                   every=0.2, process=process)
    except AssertionError as never:
        process.kill()
        raise SystemExit(f"streamlit did not start: {never}") from None
    return process, url


def healthy(url: str) -> bool:
    """The Streamlit server at `url` answers its health check."""
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def end(process: subprocess.Popen, grace_s: float = 20) -> None:
    """End a server or a run: SIGTERM, then SIGKILL after `grace_s` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
