"""What importing a module loads, in a fresh interpreter: neither torch nor Streamlit where they
are not needed."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import PROJECT


def test_importing_the_module_loads_no_torch():
    code = "import sys, anatomy.analysis.operations; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


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


def test_importing_anatomy_loads_neither_torch_nor_the_callback():
    probe = ("import sys, anatomy\n"
             "print(sorted(m for m in ('torch', 'transformers', 'anatomy.engine.callbacks')"
             " if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
