"""An environment holding a library older than the package declares (installed with --no-deps,
downgraded since): the commands that build, train or trace a model refuse in one line naming it
and how to mend it, the ones that read the store go on. The environment is a real one: an
installed package's metadata, as pip writes it, first on the path."""

from __future__ import annotations

import importlib.metadata

import pytest
from streamlit.testing.v1 import AppTest

from anatomy.analysis import libraries
from anatomy.cli.entry import main
from anatomy.dashboard import ENTRY
from tests.helpers import installed_anatomy


@pytest.fixture
def outdated(tmp_path, monkeypatch):
    """anatomy installed with a floor this machine's torch is below, beside an extra's floor
    (the dashboard's, not asked for by a plain install) and a library not installed at all."""
    site = installed_anatomy(tmp_path / "site", "torch>=99", "transformers>=1",
                             "no-such-library>=1", 'streamlit>=99; extra == "dashboard"')
    monkeypatch.syspath_prepend(str(site))
    libraries.too_old.cache_clear()
    yield importlib.metadata.version("torch")
    libraries.too_old.cache_clear()


def test_the_installed_packages_own_floors_hold_here():
    """This environment is the one requirements.txt pins: nothing refused."""
    libraries.too_old.cache_clear()
    assert libraries.refusal() is None


def _refused(torch: str, dashboard: bool) -> str:
    """The line, with the dashboard's extra where it is asked for."""
    if not dashboard:
        return (f"this environment holds torch {torch} (anatomy needs >=99): pip install "
                "--upgrade 'torch>=99'")
    streamlit = importlib.metadata.version("streamlit")
    return (f"this environment holds torch {torch} (anatomy needs >=99), streamlit {streamlit} "
            "(anatomy needs >=99): pip install --upgrade 'torch>=99' 'streamlit>=99'")


@pytest.mark.parametrize("command", [
    ["predict", "--model", "tiny"],
    ["run", "--model", "tiny", "--max-steps", "1"],
    ["sweep", "--model", "tiny", "--vary", "batch_size=1,2"],
    ["dashboard"],
])
def test_a_command_that_trains_or_predicts_names_the_library_and_the_mend(
        outdated, command, tmp_path, monkeypatch, capsys):
    """The dashboard's pages need its extra too; the other commands the package alone."""
    monkeypatch.setenv("ANATOMY_STORE", str(tmp_path / "runs.sqlite"))
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {_refused(outdated, command == ['dashboard'])}\n"
    assert out == ""
    assert not (tmp_path / "runs.sqlite").exists()  # nothing started, nothing stored


def test_a_command_that_reads_the_store_goes_on(outdated, tmp_path, capsys):
    assert main(["runs", "--store", str(tmp_path / "runs.sqlite")]) == 0
    assert "error" not in capsys.readouterr().err


def test_the_dashboard_says_it_instead_of_its_pages(outdated):
    app = AppTest.from_file(str(ENTRY), default_timeout=30)
    app.run()
    assert not app.exception, app.exception
    (error,) = app.error
    assert error.value == f"The dashboard needs newer libraries: {_refused(outdated, True)}"
