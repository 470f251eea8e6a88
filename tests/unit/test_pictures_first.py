"""A page opened in a new tab draws its charts as pictures of their figures (views/figures/svg.py):
no Plotly to load before the first chart (docs/BENCHMARKS.md, issue 20). The sidebar's
"Interactive charts" brings the Plotly charts back, on every page of the tab. What a picture holds
is tested against its figure in test_svg_picture.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from anatomy.dashboard.widgets import INTERACTIVE
from tests.apptest import open_page
from tests.unit.test_anatomy_page import measured_run  # noqa: F401 (a fixture)

SVG = "{http://www.w3.org/2000/svg}"


def _pictures(app) -> list[ET.Element]:
    return [ET.fromstring(m.value) for m in app.markdown if "anatomy-chart" in m.value]


def _texts(picture: ET.Element, cls: str) -> list[str]:
    return [e.text for e in picture.iter(f"{SVG}text") if e.get("class") == cls]


def _plotly(app) -> list[str]:
    return [c.proto.id for c in app.get("plotly_chart")]


def test_a_new_tab_of_the_runs_page_draws_pictures_and_the_switch_brings_plotly(store, seed):
    first, second = seed(), seed()
    store.update_run(second, options={**store.run(second).options, "batch_size": 8})
    app = open_page("screens/runs.py", interactive=False, run=str(first))
    assert _plotly(app) == []
    scatter, memory = _pictures(app)
    assert sorted(_texts(scatter, "point-text")) == ["bs 4", "bs 8"]
    assert _texts(memory, "y-title") == ["GPU memory used (MiB)"]
    assert any(c.value.startswith("A picture: hover and zoom with “Interactive charts” in the "
                                  "sidebar.") for c in app.caption)
    app.toggle(key=INTERACTIVE).set_value(True).run()
    assert _pictures(app) == []
    assert any(c.endswith("-runs_efficiency") for c in _plotly(app))
    # The switch holds for the tab: the next page opened in it draws Plotly too.
    app.switch_page("screens/live.py").run()
    assert _pictures(app) == [] and _plotly(app)


def test_a_stored_runs_live_page_draws_its_memory_as_a_picture(store, seed):
    run_id = seed()
    app = open_page("screens/live.py", interactive=False, run=str(run_id))
    (picture,) = _pictures(app)
    assert _plotly(app) == []
    assert [r.get("data-band") for r in picture.iter(f"{SVG}rect") if r.get("data-band")] == [
        "baseline", "kernel", "weights", "training"]


def test_the_compare_pages_first_chart_is_a_picture_of_its_overlay(store, seed):
    first, second = seed(), seed()
    app = open_page("screens/compare.py", interactive=False, runs=f"{first},{second}")
    overlay = _pictures(app)[0]
    legend = [g.find(f"{SVG}text").text for g in overlay.iter(f"{SVG}g")
              if g.get("class") == "legend-item"]
    assert len(legend) == 2 and all(name.startswith("Run ") for name in legend)
    assert "training begins" in [t.text for t in overlay.iter(f"{SVG}text")]
    # The figures of several axes or stacked bars stay interactive, drawn after it.
    assert not any(c.endswith("-compare_overlay") for c in _plotly(app))


def test_the_anatomy_pages_waterfall_and_moments_are_pictures(store, measured_run):  # noqa: F811
    app = open_page("screens/anatomy.py", timeout=300, interactive=False,
                    run=str(measured_run))
    waterfall, moments, *_ = _pictures(app)
    categories = {r.get("data-category") for r in waterfall.iter(f"{SVG}rect")
                  if r.get("class") == "bar"}
    assert {"weights", "gradients", "optimizer states", "activations"} <= categories
    assert _texts(moments, "y-title") == ["tensor memory (MiB)"]
    assert not any(c.endswith(("-anatomy_waterfall", "-anatomy_moments")) for c in _plotly(app))
