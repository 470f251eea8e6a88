"""How quickly the dashboard answers in a browser: navigation to the first chart of each page on a
stored run, Stop to visible feedback on a live run, and (--during-run) a fresh tab's first chart
while a run trains. Headless Chromium (Debian's) through Playwright against a real dashboard server
(tools/browser.py), on a store of GPU-like runs (tools/demo_store.py).

    PYTHONPATH=. .venv/bin/python bench/dashboard_latency.py [--repeats 3] [--project DIR]
    PYTHONPATH=. .venv/bin/python bench/dashboard_latency.py --during-run [--repeats 5]
    PYTHONPATH=. .venv/bin/python bench/dashboard_latency.py --renderers [--repeats 7]

--project runs another checkout's dashboard (the same store and browser), to compare before/after.
--renderers: a fresh tab's first chart during a run, drawn as the SVG picture (the dashboard as it
is, views/figures/svg.py) and by Plotly alone (the same dashboard, its pictures refused, as it
would be without svg.py), the two servers side by side over the same run, taken in turn.
Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import wait_until
from tools import demo_store
from tools.browser import ARGS, CHROMIUM, end, mark_charts_seen, serve, wait_for_chart, wait_for_new_chart

PAGES = {"Runs": "/runs?run=1", "Anatomy": "/anatomy?run=1", "Compare": "/compare?runs=1,2,3,4",
         "Live (stored run)": "/?run=1"}
WEBGL = "() => document.querySelectorAll('canvas.gl-canvas, .gl-container canvas').length"
# The tabs a user opens while a run trains: (name, path, in a new browser profile). The Live page
# follows the run in progress; a new tab's browser has opened the dashboard before (its cache
# warm), a new profile has nothing cached.
TABS = (("Live, new tab", "/", False), ("Live, new profile", "/", True),
        ("Live (a stored run), new tab", PAGES["Live (stored run)"], False),
        ("Runs, new tab", PAGES["Runs"], False),
        ("Compare, new tab", PAGES["Compare"], False),
        ("Anatomy, new tab", PAGES["Anatomy"], False))
VIEWPORT = {"width": 1400, "height": 1000}
# What drew the page's first chart: one of the pictures (svg.anatomy-chart), else Plotly.
FIRST_CHART = "() => document.querySelector('svg.anatomy-chart') ? 'picture' : 'plotly'"
# A server that draws every chart with Plotly: its pictures refused, widgets.chart falls back to
# the interactive chart, as the dashboard would without views/figures/svg.py. Loaded by every
# Python process of that server (a sitecustomize.py first on its path); a checkout without svg.py
# is Plotly alone already.
PLOTLY_ALONE = """
try:
    from anatomy.views.figures import svg
except ImportError:
    pass
else:
    def _refused(figure):
        raise svg.Unsupported("the bench's Plotly-alone server draws no picture")

    svg.picture = _refused
"""
RENDERERS = ("SVG picture", "Plotly alone")


def _to_chart(page, url: str) -> float:
    started = time.monotonic()
    page.goto(url)
    wait_for_chart(page, polling=50)
    return time.monotonic() - started


def _by_link(page, name: str) -> float:
    """In a tab already open: a click on the sidebar's link to another page, to its first chart
    (a new one: those on screen before the click are marked)."""
    mark_charts_seen(page)
    started = time.monotonic()
    page.locator("[data-testid=stSidebar]").get_by_text(name, exact=True).click()
    wait_for_new_chart(page, polling=50)
    return time.monotonic() - started


def _stop_feedback(page, url: str) -> float:
    """Start a long tiny CPU run from the form, then seconds from the Stop click to the first
    visible word of it (a 'stopping' note, or the stopped status)."""
    page.goto(url)
    page.get_by_role("spinbutton", name="Dataset size", exact=True).fill("100000")
    page.get_by_role("spinbutton", name="Sequence length", exact=True).fill("32")
    page.get_by_role("button", name="Start", exact=True).click()
    stop = page.get_by_role("button", name="Stop")
    stop.wait_for(timeout=120_000)
    page.get_by_text("training: step").first.wait_for(timeout=180_000)
    started = time.monotonic()
    stop.click()
    page.wait_for_function("""() => /[Ss]topping|stopped by the user/.test(
        document.querySelector('[data-testid=stMain]').innerText)""", timeout=60_000, polling=50)
    return time.monotonic() - started


def _train_in_background(store: Path, project: Path) -> subprocess.Popen:
    """A long tiny CPU run started from the CLI (as from another terminal), once it trains."""
    env = {**os.environ, "PYTHONPATH": str(project), "ANATOMY_LOCK_DIR": str(store.parent / "locks")}
    process = subprocess.Popen([sys.executable, "-m", "anatomy", "run", "--model", "tiny",
                                "--dataset-size", "100000", "--seq-len", "32", "--store",
                                str(store)], cwd=project, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    from anatomy.store import Store

    def trains() -> bool:
        runs = [run for run in Store(store).runs() if run.status == "running"]
        return bool(runs) and Store(store).last_step(runs[0].id) is not None

    try:
        wait_until(trains, 300, "the background run's first step", every=1, process=process)
    except AssertionError as never:
        process.kill()
        raise SystemExit(str(never)) from None
    return process


def during_run(browser, store: Path, project: Path, repeats: int) -> dict[str, list[float]]:
    """A fresh tab's first chart while a run trains: the Live page (the run in progress) in a
    browser that has opened the dashboard before (a new tab: its cache warm) and in a new browser
    profile (nothing cached); in a new tab, every other page a user can open (a stored run's Live
    page, Runs, Compare, Anatomy)."""
    tabs = TABS
    found: dict[str, list[float]] = {name: [] for name, _, _ in tabs}
    cpu: dict[str, list[float]] = {name: [] for name in found}
    run = _train_in_background(store, project)
    server, url = serve(store, project, store.parent / "locks")
    try:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        _to_chart(context.new_page(), url + PAGES["Runs"])  # the browser has seen the app once
        for _ in range(repeats):
            for name, path, fresh in tabs:
                owner = browser.new_context(viewport={"width": 1400, "height": 1000}) \
                    if fresh else context
                page = owner.new_page()
                before = _cpu_seconds(browser, server)
                found[name].append(_to_chart(page, url + path))
                # The CPU the browser's renderers and the server spent to that chart: what a busy
                # machine stretches into the seconds above, and what a quiet one would take.
                renderers, served = (after - earlier for after, earlier in
                                     zip(_cpu_seconds(browser, server), before))
                cpu[name].append(renderers + served)
                print(f"during a run, {name}: {found[name][-1]:.2f} s (CPU: the browser's "
                      f"renderers {renderers:.2f} s, the server {served:.2f} s)", file=sys.stderr,
                      flush=True)
                page.close()
                if fresh:
                    owner.close()
        context.close()
    finally:
        for process in (server, run):
            end(process, grace_s=30)
    return {**found, **{f"{name} (CPU seconds)": values for name, values in cpu.items()}}


def _cpu_seconds(browser, server: subprocess.Popen) -> tuple[float, float]:
    """CPU seconds so far of the browser's renderer processes (Chromium's own count) and of the
    dashboard's server process."""
    import psutil

    session = browser.new_browser_cdp_session()
    processes = session.send("SystemInfo.getProcessInfo")["processInfo"]
    session.detach()
    renderers = sum(p["cpuTime"] for p in processes if p["type"] == "renderer")
    times = psutil.Process(server.pid).cpu_times()
    return renderers, times.user + times.system


def renderers(browser, store: Path, project: Path, repeats: int, tabs=TABS
              ) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """A fresh tab's first chart while a run trains, on two servers of `project` over the same
    store and run: the SVG picture (the dashboard as it is) and Plotly alone (PLOTLY_ALONE).
    Each repetition opens every tab once on each server, which goes first alternating, so that
    a machine's load falls on both alike. Seconds to the first chart, and the CPU the browser's
    renderers and the server spent to it, by (renderer, tab)."""
    seconds: dict[tuple[str, str], list[float]] = {(r, name): [] for r in RENDERERS
                                                   for name, _, _ in tabs}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in seconds}
    plotly_alone = store.parent / "plotly-alone"
    plotly_alone.mkdir(exist_ok=True)
    (plotly_alone / "sitecustomize.py").write_text(PLOTLY_ALONE)
    run = _train_in_background(store, project)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    contexts: dict[str, object] = {}
    try:
        for renderer, first_on_path in zip(RENDERERS, (None, plotly_alone)):
            servers[renderer] = serve(store, project, store.parent / "locks", first_on_path)
            contexts[renderer] = browser.new_context(viewport=VIEWPORT)
            # the browser has opened this dashboard once: a new tab finds its cache warm (the
            # tab closed, so that no page of it redraws while the others are measured)
            seen = contexts[renderer].new_page()
            _to_chart(seen, servers[renderer][1] + PAGES["Runs"])
            seen.close()
        for repeat in range(repeats):
            order = RENDERERS if repeat % 2 == 0 else RENDERERS[::-1]
            for name, path, fresh in tabs:
                for renderer in order:
                    server, url = servers[renderer]
                    owner = browser.new_context(viewport=VIEWPORT) if fresh else contexts[renderer]
                    page = owner.new_page()
                    before = _cpu_seconds(browser, server)
                    seconds[renderer, name].append(_to_chart(page, url + path))
                    drawn = page.evaluate(FIRST_CHART)
                    renderer_cpu, served = (after - earlier for after, earlier in
                                            zip(_cpu_seconds(browser, server), before))
                    cpu[renderer, name].append(renderer_cpu + served)
                    print(f"[{repeat + 1}/{repeats}] {renderer}, {name}: "
                          f"{seconds[renderer, name][-1]:.2f} s, drawn by {drawn} (CPU: the "
                          f"renderers {renderer_cpu:.2f} s, the server {served:.2f} s)",
                          file=sys.stderr, flush=True)
                    if renderer == "Plotly alone" and drawn == "picture":
                        raise SystemExit(f"{name}: the Plotly-alone server drew a picture")
                    page.close()
                    if fresh:
                        owner.close()
    finally:
        for context in contexts.values():
            context.close()
        for process in [*(server for server, _ in servers.values()), run]:
            end(process, grace_s=30)
    return seconds, cpu


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f} s (min {min(values):.2f}, max "
            f"{max(values):.2f}, n={len(values)})")


def _print_renderers(seconds, cpu, tabs=TABS) -> None:
    """A row a tab: each renderer's seconds and CPU to the first chart, median (min–max), and
    what the picture saves in the median."""
    print("first chart during a run, median (min–max) | SVG picture | Plotly alone | "
          "the picture saves")
    for name, _, _ in tabs:
        svg_s, plotly_s = seconds["SVG picture", name], seconds["Plotly alone", name]
        svg_cpu, plotly_cpu = cpu["SVG picture", name], cpu["Plotly alone", name]
        print(f"{name}: seconds | {_spread(svg_s)} | {_spread(plotly_s)} | "
              f"{statistics.median(plotly_s) - statistics.median(svg_s):+.2f} s")
        print(f"{name}: CPU (renderers + server) | {_spread(svg_cpu)} | {_spread(plotly_cpu)} | "
              f"{statistics.median(plotly_cpu) - statistics.median(svg_cpu):+.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--project", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--no-stop", action="store_true", help="skip the Stop measurement")
    parser.add_argument("--stop-only", action="store_true", help="only the Stop measurement")
    parser.add_argument("--links", action="store_true",
                        help="also: the sidebar's links in an open tab (the app's navigation)")
    parser.add_argument("--during-run", action="store_true",
                        help="only: a fresh tab's first chart while a tiny CPU run trains")
    parser.add_argument("--renderers", action="store_true",
                        help="only: a fresh tab's first chart while a tiny CPU run trains, the "
                             "SVG picture against Plotly alone")
    parser.add_argument("--tab", action="append", choices=[name for name, _, _ in TABS],
                        help="with --renderers: a tab to open (again for another); every tab "
                             "if none is named")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "anatomy.sqlite"
        demo_store.build(store)
        if args.renderers:
            tabs = tuple(t for t in TABS if not args.tab or t[0] in args.tab)
            load = os.getloadavg()[0]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                seconds, cpu = renderers(browser, store, args.project, args.repeats, tabs)
                browser.close()
            commit = subprocess.run(["git", "-C", str(args.project), "rev-parse", "--short",
                                     "HEAD"], capture_output=True, text=True).stdout.strip()
            print(f"project: {args.project} at {commit or '?'}; {os.cpu_count()} cores; load "
                  f"average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
            _print_renderers(seconds, cpu, tabs)
            return
        if args.during_run:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                found = during_run(browser, store, args.project, args.repeats)
                browser.close()
            print(f"project: {args.project}; load average {os.getloadavg()[0]:.2f}")
            for name, values in found.items():
                what = "CPU to the first chart" if name.endswith("(CPU seconds)") else \
                    "first chart"
                print(f"during a run, {name.removesuffix(' (CPU seconds)')}: {what} "
                      f"{_spread(values)}")
            return
        cold: dict[str, list[float]] = {name: [] for name in PAGES}
        warm: dict[str, list[float]] = {name: [] for name in PAGES}
        first_after_start, stops, webgl = [], [], 0
        links: dict[str, list[float]] = {name: [] for name in ("Runs", "Anatomy", "Compare")}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for _ in range(args.repeats):
                server, url = serve(store, args.project, store.parent / "locks")
                try:
                    pages = {} if args.stop_only else PAGES
                    if pages:
                        context = browser.new_context(viewport={"width": 1400, "height": 1000})
                        page = context.new_page()
                        first_after_start.append(_to_chart(page, url + PAGES["Runs"]))
                        context.close()
                    for name, path in pages.items():
                        context = browser.new_context(viewport={"width": 1400, "height": 1000})
                        page = context.new_page()
                        cold[name].append(_to_chart(page, url + path))  # an empty cache
                        warm[name].append(_to_chart(page, url + path))  # the same tab again
                        print(f"{name}: {cold[name][-1]:.2f} s, again {warm[name][-1]:.2f} s",
                              file=sys.stderr, flush=True)
                        if name.startswith("Compare"):
                            page.wait_for_timeout(1000)
                            webgl = max(webgl, page.evaluate(WEBGL))
                        context.close()
                    if args.links and not args.stop_only:
                        context = browser.new_context(viewport={"width": 1400, "height": 1000})
                        page = context.new_page()
                        _to_chart(page, url + PAGES["Live (stored run)"])
                        for name in links:
                            links[name].append(_by_link(page, name))
                            print(f"link to {name}: {links[name][-1]:.2f} s", file=sys.stderr,
                                  flush=True)
                        context.close()
                    if not args.no_stop:
                        context = browser.new_context(viewport={"width": 1400, "height": 1000})
                        page = context.new_page()
                        try:
                            stops.append(_stop_feedback(page, url))
                        except Exception:
                            page.screenshot(path=Path(folder).parent / "stop-failed.png",
                                            full_page=True)
                            raise
                        print(f"Stop: {stops[-1]:.2f} s", file=sys.stderr, flush=True)
                        context.close()
                finally:
                    server.terminate()
                    try:
                        server.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        server.kill()
                        server.wait()
            browser.close()

    print(f"project: {args.project}; load average {os.getloadavg()[0]:.2f}")
    if first_after_start:
        print(f"first request after the server started (Runs): {_spread(first_after_start)}")
    for name in PAGES:
        if cold[name]:
            print(f"{name}: new tab {_spread(cold[name])}; same tab again {_spread(warm[name])}")
    for name, values in links.items():
        if values:
            print(f"sidebar link to {name} in an open tab: {_spread(values)}")
    if stops:
        print(f"Stop to visible feedback: {_spread(stops)}")
    print(f"WebGL canvases on the Compare page: {webgl}")


if __name__ == "__main__":
    main()
