"""The layers' rules, as behaviour: the contract tool tells module-level imports from lazy ones,
and importing everything outside the engine loads neither torch nor Streamlit."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import tomllib

import anatomy
from tools.import_contracts import module_level_imports

PROJECT = Path(__file__).resolve().parent.parent


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


def test_the_cli_views_and_analysis_load_without_torch_or_streamlit():
    modules = ["anatomy.cli", "anatomy.views.figures.live", "anatomy.views.figures.compare",
               "anatomy.views.figures.runs", "anatomy.views.figures.anatomy", "anatomy.views.live",
               "anatomy.views.compare", "anatomy.views.anatomy", "anatomy.views.runs",
               "anatomy.views.export", "anatomy.analysis.breakdown", "anatomy.analysis.transfer",
               "anatomy.analysis.sweeps", "anatomy.engine.manager", "anatomy.engine.sweep",
               "anatomy.dashboard"]  # the package names its entry file without Streamlit
    probe = (f"import sys; import {', '.join(modules)}; "
             "print(sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_headless_contract_holds_every_part_of_anatomy_but_the_dashboard():
    contracts = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (headless,) = [c for c in contracts["contracts"] if c.get("forbidden_modules") == ["streamlit"]]
    parts = {f"anatomy.{module.name}" for module in pkgutil.iter_modules(anatomy.__path__)}
    assert set(headless["source_modules"]) == parts - {"anatomy.dashboard"}
