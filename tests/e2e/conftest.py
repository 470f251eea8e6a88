"""What the tests of real processes share: the real runs that several tests read, and one Chromium
for the session."""

from __future__ import annotations

import pytest

from anatomy.analysis.options import RunOptions
from anatomy.engine.manager import RunManager
from anatomy.store import Store
from tests.conftest import PROJECT
from tools.browser import ARGS, CHROMIUM

ARTIFACTS = PROJECT / "test-artifacts"  # the browser tests' screenshots


@pytest.fixture(scope="session")
def _chromium_session():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def chromium(_chromium_session):
    """Debian's Chromium, launched once a session (seconds each time); what a test opens in it
    (`chromium.new_page(...)`: a page in a context of its own) is closed when the test ends."""
    yield _chromium_session
    for context in _chromium_session.contexts:
        context.close()


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """recorded(options) -> (store, run id): a real run of `options`, made once a session (per
    pytest-xdist worker) in a store of its own and read by every test that asks for the same
    options. Those tests only read it; a test that changes a run makes its own."""
    store = Store(tmp_path_factory.mktemp("recorded") / "runs.sqlite")
    manager = RunManager(store)
    runs: dict[RunOptions, int] = {}

    def record(options: RunOptions) -> tuple[Store, int]:
        if options not in runs:
            runs[options] = manager.start(options)
            manager.wait(runs[options], timeout=300)
        return store, runs[options]

    yield record
    manager.stop_all()
