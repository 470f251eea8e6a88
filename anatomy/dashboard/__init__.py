"""The dashboard: a Streamlit app over the run store, the only part of anatomy that imports
Streamlit. `anatomy dashboard` runs Streamlit's own CLI on ENTRY (app.py: the page's frame and
the navigation among the pages of screens/); widgets, links and server are what the pages share.
This module itself imports nothing, so that the CLI can name the entry without loading Streamlit."""

from pathlib import Path

ENTRY = Path(__file__).with_name("app.py")
# Why the server writes nothing (`anatomy dashboard --read-only`, or a store it cannot write):
# set by the CLI for the server it starts; unset, it starts, stops, labels and deletes runs.
READ_ONLY_ENV = "ANATOMY_DASHBOARD_READ_ONLY"
