"""Opening a page of the dashboard through Streamlit's AppTest, as the page tests all do."""

from __future__ import annotations

import functools
import json

from streamlit.components.v2 import manifest_scanner
from streamlit.testing.v1 import AppTest

from anatomy.dashboard import ENTRY
from anatomy.dashboard.widgets import INTERACTIVE

TIMEOUT = 30  # the first run of a test process imports plotly and the engine
APP = str(ENTRY)  # the file `anatomy dashboard` runs

# Each AppTest's first run looks for Streamlit components among the installed packages, parsing
# every one's metadata (~130 here): 0.2 of the 0.25 CPU s a page's first run takes, once per
# page opened, hundreds of times a session. What is installed does not change during a session:
# looked for once a process (it finds none; the app declares no component).
manifest_scanner.scan_component_manifests = functools.cache(
    manifest_scanner.scan_component_manifests)


def open_page(page: str, timeout: float = TIMEOUT, interactive: bool = True, **query: str
              ) -> AppTest:
    """The app run, then `page` (e.g. "screens/runs.py", relative to the entry) with the given
    query parameters, as a link opens it. The first run registers the app's pages
    (st.navigation), so that the switch finds a page by its URL path. `timeout`: seconds a run of
    the page may take (a page that predicts traces a training step). `interactive`: the
    sidebar's "Interactive charts" on, the charts as the Plotly specs the tests read; off, as a
    new tab opens the page: pictures of them (views/figures/svg.py)."""
    app = AppTest.from_file(APP, default_timeout=timeout)
    app.session_state[INTERACTIVE] = interactive
    app.run()
    app.query_params.clear()
    for key, value in query.items():
        app.query_params[key] = value
    app.switch_page(page).run()
    assert not app.exception, app.exception
    return app


def chart_spec(app: AppTest, key: str) -> dict:
    """The spec of the Plotly chart whose element key ends in `key`."""
    (found,) = [c for c in app.get("plotly_chart") if c.proto.id.endswith(f"-{key}")]
    return json.loads(found.proto.spec)
