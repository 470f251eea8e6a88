"""`anatomy dashboard --read-only`, and the dashboard over a store it cannot write: the runs are
shown, and no control that writes is offered — no Start, Stop, Save (rename, tags), Delete or
sweep — with the reason in the sidebar."""

from __future__ import annotations

import pytest

from anatomy.dashboard import READ_ONLY_ENV
from tests.apptest import open_page

WRITING_KEYS = ("start", "delete", "stop")


@pytest.fixture
def read_only(monkeypatch):
    monkeypatch.setenv(READ_ONLY_ENV, "asked for (--read-only)")


def _keys(app) -> set[str]:
    return {b.key for b in app.button} | {b.key for b in app.get("form_submit_button")}


def test_a_read_only_dashboard_shows_the_runs_and_offers_no_control_that_writes(
        store, seed, read_only):
    run_id = seed()
    runs = open_page("screens/runs.py", run=str(run_id))
    assert runs.dataframe  # the list is there
    assert not {"delete", "start"} & _keys(runs)
    assert not [b for b in runs.get("form_submit_button") if b.label == "Save"]
    assert any("Read-only: asked for (--read-only)" in c.value for c in runs.sidebar.caption)
    live = open_page("screens/live.py")
    assert "start" not in _keys(live)
    compare = open_page("screens/compare.py")
    assert not [b for b in compare.get("form_submit_button") if "sweep" in (b.label or "").lower()]


def test_a_writable_dashboard_offers_them(store, seed):
    run_id = seed()
    assert "delete" in _keys(open_page("screens/runs.py", run=str(run_id)))
    assert "start" in _keys(open_page("screens/live.py"))
