"""`anatomy dashboard`: what it refuses in one line before anything serves; `streamlit run app.py`
in a clone, the same dashboard with the same settings. (A real server started by each:
tests/e2e/test_dashboard_command.py.)"""

from __future__ import annotations

import os
import socket
import sys

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from anatomy import cli
from anatomy.cli.dashboard import DEFAULT_HOST, SETTINGS
from tests.conftest import PROJECT
from tests.helpers import free_port


@pytest.fixture
def never_served(monkeypatch):
    """The command becomes the server by exec: a refusal that failed would replace pytest."""
    def exec_refused(*args):
        raise AssertionError(f"the server was started: {args[1]}")
    monkeypatch.setattr(os, "execve", exec_refused)


def test_without_streamlit_it_says_what_to_install_in_one_line(never_served, monkeypatch, capsys,
                                                               tmp_path):
    monkeypatch.setitem(sys.modules, "streamlit", None)  # as Python marks a module not there
    store = tmp_path / "runs.sqlite"
    assert cli.main(["dashboard", "--store", str(store)]) == 2
    assert capsys.readouterr().err == \
        'error: the dashboard needs streamlit: pip install "anatomy[dashboard]"\n'
    assert not store.exists()  # nothing made


def test_a_file_that_is_not_a_store_is_refused_in_one_line(never_served, capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    assert cli.main(["dashboard", "--store", str(notes), "--port", str(free_port())]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: the store {notes}: ")
    assert notes.read_text() == "not a database\n"


def test_a_port_in_use_is_refused_in_one_line(never_served, capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["dashboard", "--port", str(port), "--store", str(tmp_path / "s.sqlite")])
    assert code == 2
    assert capsys.readouterr().err == \
        f"error: cannot serve on localhost:{port}: Address already in use\n"


@pytest.mark.parametrize("port", ["0", "65536", "http", "²", "٣", "9" * 5000])
def test_a_port_out_of_range_is_refused_by_the_parser(never_served, capsys, port):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["dashboard", "--port", port])
    assert exit_.value.code == 2
    assert f"argument --port: {port!r} is not a port (1 to 65535)"[:80] in capsys.readouterr().err




def test_the_clones_streamlit_config_holds_the_settings_anatomy_dashboard_passes(monkeypatch):
    """`streamlit run app.py` reads .streamlit/config.toml from the folder it starts in: the
    clone's serves on this machine only, as `anatomy dashboard` does, with the same settings."""
    monkeypatch.chdir(PROJECT)
    try:
        config.get_config_options(force_reparse=True)
        read = {name: str(config.get_option(name)).lower() for name in SETTINGS}
        address = config.get_option("server.address")
    finally:
        monkeypatch.undo()
        config.get_config_options(force_reparse=True)
    assert read == {name: value.lower() for name, value in SETTINGS.items()}
    assert address == DEFAULT_HOST


def test_the_clones_app_py_runs_the_packages_dashboard_and_finds_its_pages(store):
    """The top-level app.py is the package's entry run from the clone's folder, where Streamlit
    looks for the pages of a relative path."""
    app = AppTest.from_file(str(PROJECT / "app.py"), default_timeout=30).run()
    assert not app.exception, app.exception
    assert app.title[0].value == "Live run"
    app.switch_page("anatomy/dashboard/screens/runs.py").run()
    assert not app.exception, app.exception
    assert app.title[0].value == "Runs"
