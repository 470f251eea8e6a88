"""The dashboard's entry, run by Streamlit (`anatomy dashboard`): the page's frame — title, icon,
the navigation among the pages of screens/, the machine in the sidebar — then the page asked for
(/, /runs, /compare, /anatomy: also as a fresh server's first request)."""

from pathlib import Path

import streamlit as st

from anatomy.analysis import libraries
from anatomy.dashboard import links, server, widgets
from anatomy.store import BadLocation, DatabaseError, StoreError, resolve_path, store_error

# The favicon, a file served by this server: a material icon as page_icon is fetched from
# fonts.gstatic.com, which fails offline.
ICON = Path(__file__).with_name("icon.png")

st.set_page_config(page_title="Model training anatomy", page_icon=str(ICON), layout="wide")
page = st.navigation([
    st.Page(links.LIVE_PAGE, title="Live run", icon=":material/monitoring:", default=True),
    st.Page(links.RUNS_PAGE, title="Runs", icon=":material/table_rows:"),
    st.Page(links.COMPARE_PAGE, title="Compare", icon=":material/compare_arrows:"),
    st.Page(links.ANATOMY_PAGE, title="Anatomy", icon=":material/stacked_bar_chart:"),
])
widgets.keep_form()
widgets.style()
widgets.sidebar_device()
if server.read_only():
    st.sidebar.caption(f":material/visibility: Read-only: {server.read_only()}. Runs are shown;"
                       " none is started, stopped, labelled, deleted or imported here.")
widgets.chart_switch()
refused = libraries.refusal((libraries.DASHBOARD,))
if refused is not None:  # as `anatomy dashboard` refuses to start: runs and predictions need them
    st.error(f"The dashboard needs newer libraries: {refused}")
    st.stop()
try:
    server.manager()  # opens the store, and closes runs a dead server left running
    page.run()
except (StoreError, DatabaseError, BadLocation) as error:
    # Not a store, unreadable, read-only; or a page's read of a damaged (or locked) store, as the
    # CLI says it: one line, not a traceback.
    if isinstance(error, DatabaseError):
        error = store_error(resolve_path(), error)
    st.error(f"The run store cannot be used: {error}. Point ANATOMY_STORE at another file.")
