"""What the CLI says before it does anything: the store every command would use, and the extra a
command needs where the engine-only install lacks it."""

from __future__ import annotations

import sys

import pytest


def test_every_help_names_the_store_the_command_would_use(tmp_path, monkeypatch):
    """One default store, said the same by every command that reads or writes one: the user's data
    directory (never the clone's data/ folder, which only some of them used), and $ANATOMY_STORE
    where it is set."""
    from anatomy.cli import parser

    def helps() -> dict[str, str]:
        commands = next(a for a in parser()._actions if a.dest == "command").choices
        return {name: "".join(command.format_help().split())  # argparse wraps at hyphens too
                for name, command in commands.items()
                if any("--store" in a.option_strings for a in command._actions)}

    monkeypatch.delenv("ANATOMY_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    texts = helps()
    assert {"run", "sweep", "watch", "runs", "show", "export", "import", "delete"} <= set(texts)
    for name, text in texts.items():
        assert str(tmp_path / "data" / "anatomy" / "anatomy.sqlite") in text, name
        assert "data/anatomy.sqlite" not in text.replace(str(tmp_path / "data"), ""), name
    monkeypatch.setenv("ANATOMY_STORE", str(tmp_path / "mine.sqlite"))
    assert all(str(tmp_path / "mine.sqlite") in text for text in helps().values())


def test_the_html_export_without_the_dashboard_extra_names_it_in_one_line(seed, store, monkeypatch,
                                                                          capsys):
    """The engine-only install has no plotly: the charts' export says what to install, where it
    printed a ModuleNotFoundError before."""
    from anatomy import cli

    run_id = seed()
    # As if never installed: plotly and every part of it an earlier test of this process loaded.
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")] + ["plotly"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "anatomy.views.export", raising=False)
    monkeypatch.delattr("anatomy.views.export", raising=False)  # `from anatomy.views import export`
    assert cli.main(["export", str(run_id), "--format", "html", "--store", str(store.path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and 'pip install "anatomy[dashboard]"' in error, error


def test_version_is_the_installed_distributions(capsys):
    """`anatomy --version` answers what pip installed (pyproject reads anatomy.__version__), not a
    usage error."""
    from importlib.metadata import version

    from anatomy.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"anatomy {version('anatomy')}"
