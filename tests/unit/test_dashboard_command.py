"""`anatomy dashboard`: what it refuses in one line before anything serves. (A real server started
by it: tests/e2e/test_dashboard_command.py.)"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from anatomy import cli
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


