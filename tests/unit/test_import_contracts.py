"""The layers' rules, as behaviour: the contract tool tells module-level imports from lazy ones,
and the headless contract names every part of anatomy but the dashboard. (What importing each
layer loads, in a fresh interpreter: tests/e2e/test_imports.py.)"""

from __future__ import annotations

import pkgutil

import tomllib

import anatomy
from tests.conftest import PROJECT
from tools.import_contracts import module_level_imports


def test_only_imports_that_run_at_import_time_count():
    source = '''
import json
from torch import nn
if True:
    import numpy
try:
    import transformers.models
except ImportError:
    import accelerate
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import peft
else:
    import datasets
from . import sibling


def build():
    import torch


class Model:
    import streamlit
'''
    assert [package for _, package in module_level_imports(source)] == [
        "json", "torch", "numpy", "transformers", "accelerate", "typing", "datasets"]



def test_the_headless_contract_holds_every_part_of_anatomy_but_the_dashboard():
    contracts = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (headless,) = [c for c in contracts["contracts"] if c.get("forbidden_modules") == ["streamlit"]]
    parts = {f"anatomy.{module.name}" for module in pkgutil.iter_modules(anatomy.__path__)}
    assert set(headless["source_modules"]) == parts - {"anatomy.dashboard"}
