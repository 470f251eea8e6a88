"""The package installs where a user trains: `pip install .` into a fresh virtualenv (with the
torch that is already there), the console script, the callback and the phase API, and no
Streamlit unless the dashboard extra is asked for."""

from __future__ import annotations

import subprocess
import venv

import pytest

from tests.conftest import PROJECT


@pytest.mark.packaging
@pytest.mark.timeout(1200)
def test_pip_install_gives_the_cli_and_the_callback_without_streamlit(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")

    def pip(*args: str) -> None:
        result = subprocess.run([python, "-m", "pip", "install", "-q", *args],
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]

    # The user's environment has its torch (here: the CPU build this machine keeps on disk);
    # the package's range accepts it instead of pulling another build.
    import torch

    pip(f"torch=={torch.__version__.split('+')[0]}")
    pip(str(PROJECT))
    cli = subprocess.run([str(env_dir / "bin" / "anatomy"), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert cli.returncode == 0 and "watch" in cli.stdout, cli.stderr
    probe = ("import importlib.util, anatomy\n"
             "from anatomy import AnatomyCallback, start\n"
             "from anatomy.analysis.models import PRESETS\n"
             "assert all(p.config_path.is_file() for p in PRESETS.values())\n"
             "print(importlib.util.find_spec('streamlit') is None)\n")
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "True"  # the engine's environment has no Streamlit
    # The dashboard ships in the package (its pages and icon), and says what it lacks here.
    dashboard = subprocess.run([str(env_dir / "bin" / "anatomy"), "dashboard"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert dashboard.returncode == 2
    (line,) = dashboard.stderr.splitlines()
    assert line.startswith("error: the dashboard needs streamlit")
    assert line.endswith('pip install "anatomy[dashboard]"')
    shipped = subprocess.run([python, "-c", "import anatomy.dashboard as d\n"
                              "for p in d.ENTRY.parent.rglob('*'): print(p.name)"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert {"app.py", "icon.png", "live.py", "runs.py", "compare.py", "anatomy.py"} <= set(
        shipped.stdout.split()), shipped.stderr


