"""Opening a page of the dashboard through Streamlit's AppTest, as the page tests all do."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

TIMEOUT = 30  # the first run of a test process imports plotly and the engine


def open_page(page: str, **query: str) -> AppTest:
    """app.py run, then `page` (e.g. "pages/runs.py") with the given query parameters, as a link
    opens it. The first run registers app.py's pages (st.navigation), so that the switch finds
    a page by its own URL path ("anatomy" for pages/_anatomy.py)."""
    app = AppTest.from_file("../app.py", default_timeout=TIMEOUT).run()
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
