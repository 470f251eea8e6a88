"""A worker says when torch is compiled from its source at every start (no bytecode beside it,
none may be written): seconds of start-up a user would otherwise blame on anatomy."""

from __future__ import annotations

import py_compile
import sys

from anatomy.engine.worker import compiled_at_every_start


def package(tmp_path, monkeypatch, name: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return folder / "__init__.py"


def test_a_package_without_bytecode_where_none_may_be_written_is_named(tmp_path, monkeypatch):
    package(tmp_path, monkeypatch, "nobytecode_pkg")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert compiled_at_every_start("nobytecode_pkg")


def test_bytecode_beside_it_or_allowed_to_be_written_is_not(tmp_path, monkeypatch):
    source = package(tmp_path, monkeypatch, "cached_pkg")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert not compiled_at_every_start("cached_pkg")  # the first import writes it
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    py_compile.compile(str(source))
    assert not compiled_at_every_start("cached_pkg")
    assert not compiled_at_every_start("no_such_package_here")
