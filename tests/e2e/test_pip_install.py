"""The package installs where a user trains: its wheel, built as `pip install .` builds it, into a
fresh virtualenv whose user already has what the package says it needs (torch among them), the
console script, the callback, the phase API and LoRA, and no Streamlit unless the dashboard extra
is asked for; and a clone's `make` virtualenv holds it, so the CLI and the examples run from the
clone."""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from anatomy.store import Store
from tests.conftest import PROJECT


def _declared(wheel: Path) -> list[Requirement]:
    """What the wheel says it needs (its Requires-Dist), the dashboard extra's aside."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        fields = email.parser.Parser().parsestr(archive.read(name).decode())
    return [r for r in map(Requirement, fields.get_all("Requires-Dist") or ())
            if r.marker is None or r.marker.evaluate({"extra": ""})]


def _users_environment(folder: Path, wanted: list[Requirement]) -> None:
    """The user's environment before the install: what `wanted` names and all it requires in
    turn, this environment's copies linked into `folder` (installing them again would take most
    of the test's minute; a library the package forgot to declare is not there)."""
    folder.mkdir()
    done, names = set(), [r.name for r in wanted]
    while names:
        name = canonicalize_name(names.pop())
        if name in done:
            continue
        done.add(name)
        distribution = metadata.distribution(name)
        for entry in {f.parts[0] for f in distribution.files or ()} - {"..", "__pycache__"}:
            if not (folder / entry).exists():
                (folder / entry).symlink_to(distribution.locate_file(entry))
        for requirement in map(Requirement, distribution.requires or ()):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                names.append(requirement.name)


@pytest.mark.packaging
@pytest.mark.timeout(1200)
def test_pip_install_gives_the_cli_and_the_callback_without_streamlit(tmp_path, wheel):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")

    def pip(*args: str) -> None:
        result = subprocess.run([python, "-m", "pip", "install", "-q", *args],
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]

    # The user's environment has what the package declares (its torch: the CPU build here), seen
    # through a .pth file after the virtualenv's own site-packages; the package's ranges accept
    # them instead of pulling other builds.
    users = tmp_path / "users-libraries"
    _users_environment(users, _declared(wheel))
    torch_dir = users / "torch"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "users-libraries.pth").write_text(f"{users}\n")
    pip(str(wheel))
    kept = subprocess.run([python, "-c", "import torch; print(torch.__file__)"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert kept.stdout.startswith(str(torch_dir)), kept.stdout + kept.stderr[-3000:]
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
    # LoRA is peft's: a dependency of the package, not of the clone's requirements alone.
    lora = subprocess.run([str(env_dir / "bin" / "anatomy"), "predict", "--model", "tiny",
                           "--lora-rank", "8", "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert lora.returncode == 0 and "Traceback" not in lora.stderr, lora.stderr[-3000:]


def test_the_clones_virtualenv_runs_the_cli_and_the_examples_without_a_path_set(tmp_path):
    """`make`'s virtualenv holds the package (editable): its `anatomy` watches
    `.venv/bin/python examples/plain_loop.py` from the clone, no PYTHONPATH set (a script's own
    folder, examples/, is what Python puts first on its path)."""
    binaries = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["ANATOMY_STORE"] = str(tmp_path / "anatomy.sqlite")
    result = subprocess.run(
        [str(binaries / "anatomy"), "watch", "--", str(binaries / "python"),
         "examples/plain_loop.py", "--steps", "2", "--seq-len", "16", "--batch-size", "2"],
        capture_output=True, text=True, timeout=600, cwd=PROJECT, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    runs = Store(tmp_path / "anatomy.sqlite").runs()
    assert [run.status for run in runs] == ["completed"]
