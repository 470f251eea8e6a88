"""The dashboard's pages by their files, and runs by URL: a link from another page or a shared URL
names the run to show (?run=ID), and the URL keeps naming the run shown."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from anatomy.dashboard import server
from anatomy.views import text

# The page files, as st.Page and st.switch_page take them: whole paths, since Streamlit reads a
# relative one from the folder of the script it runs, which is the clone's when `streamlit run
# app.py` starts the entry from there. Their URLs are their names: /runs, /compare, /anatomy; the
# Live page is /.
SCREENS = Path(__file__).with_name("screens")
LIVE_PAGE = str(SCREENS / "live.py")
RUNS_PAGE = str(SCREENS / "runs.py")
COMPARE_PAGE = str(SCREENS / "compare.py")
ANATOMY_PAGE = str(SCREENS / "anatomy.py")


def choose_run_from_url(ids: list[int], key: str) -> None:
    """The run of the selectbox stored under `key`: ?run=ID (a link from another page, a shared
    URL) when it is among `ids`, else the one chosen before, else the latest. An id that is not
    among them is said, and the URL is rewritten to name the run shown."""
    wanted = st.query_params.get("run")
    shown = st.session_state.get(key)
    if wanted is not None and wanted != str(shown):
        asked = text.run_id(wanted)
        if asked in ids:
            st.session_state[key] = asked
        else:
            stored = asked is not None and server.store().run(asked) is not None
            instead = shown if shown in ids else ids[0]
            st.warning(text.missing_run(wanted, instead, filtered=stored),
                       icon=":material/search_off:")
    elif shown is not None and shown not in ids:
        if server.store().run(shown) is not None:  # the filters left the run shown out
            st.warning(text.missing_run(str(shown), ids[0], filtered=True),
                       icon=":material/filter_alt:")
        else:  # deleted since it was shown: the page must not turn to another run unsaid
            st.warning(text.missing_run(str(shown), ids[0], gone=True),
                       icon=":material/delete:")
    if st.session_state.get(key) not in ids:
        st.session_state[key] = ids[0]
    st.query_params["run"] = str(st.session_state[key])


def run_to_url(key: str) -> None:
    """The selectbox's run back into ?run=, so the URL always names what is shown."""
    st.query_params["run"] = str(st.session_state[key])

