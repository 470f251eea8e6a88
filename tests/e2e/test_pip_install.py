"""The package installs where a user trains: its wheel, built as `pip install .` builds it, into a
fresh virtualenv whose user already has what the package says it needs (torch among them), the
console script, the callback, the phase API and LoRA, and no Streamlit unless the dashboard extra
is asked for; with the extra, a user's own Trainer script run from another directory is listed by
`anatomy dashboard` and its Anatomy page shows measured next to predicted; and a clone's `make`
virtualenv holds it, so the CLI and the examples run from the clone.

One virtualenv and one wheel for the package with and without its extra: one test, since
pytest-xdist may give two tests to two workers, each building the wheel (`wheel`: once a worker)
and a virtualenv of its own."""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from anatomy.store import Store
from tests.conftest import PROJECT
from tests.e2e.conftest import ARTIFACTS, PADDED_TRAINER_SCRIPT, serve, stop
from tools.browser import CHROMIUM, WAIT_MS

NARROW = {"width": 1000, "height": 900}


def _declared(wheel: Path) -> list[Requirement]:
    """What the wheel says it needs (its Requires-Dist), the dashboard extra's aside."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        fields = email.parser.Parser().parsestr(archive.read(name).decode())
    return [r for r in map(Requirement, fields.get_all("Requires-Dist") or ())
            if r.marker is None or r.marker.evaluate({"extra": ""})]


def _pip_into(python: str, *args: str) -> list[str]:
    """`pip install -q ARGS` into the environment of `python`, by this environment's pip."""
    return [sys.executable, "-m", "pip", "--python", python, "install", "-q", *args]


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
@pytest.mark.browser
@pytest.mark.timeout(1800)
def test_pip_install_gives_the_cli_and_the_callback_without_streamlit_and_the_extra_a_dashboard(
        tmp_path, wheel, request):
    # A virtualenv without a pip of its own: this environment's pip installs into it
    # (`pip --python`), as the user's own pip would (ensurepip's copy took 6 CPU seconds and is
    # no part of what the package gives).
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")

    def pip(*args: str) -> None:
        result = subprocess.run(_pip_into(python, *args), capture_output=True, text=True,
                                timeout=900)
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
    # The package alone: the clone's app.py (`streamlit run app.py`) and its .streamlit/ stay
    # there; installed, `anatomy dashboard` serves.
    with zipfile.ZipFile(wheel) as archive:
        assert {n.split("/")[0] for n in archive.namelist() if not n.startswith("anatomy-")} == \
            {"anatomy"}, archive.namelist()
    pip(str(wheel))
    cli = subprocess.run([str(env_dir / "bin" / "anatomy"), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert cli.returncode == 0 and "watch" in cli.stdout, cli.stderr
    probe = ("import importlib.util, anatomy\n"
             "from anatomy import AnatomyCallback, start\n"
             "from anatomy.analysis.models import PRESETS\n"
             "assert all(p.config_path.is_file() for p in PRESETS.values())\n"
             "import torch\n"
             "print(torch.__file__)\n"
             "print(importlib.util.find_spec('streamlit') is None)\n")
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    torch_file, no_streamlit = result.stdout.split()
    assert torch_file.startswith(str(torch_dir)), result.stdout  # the user's, kept
    assert no_streamlit == "True"  # the engine's environment has no Streamlit
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

    if not Path(CHROMIUM).exists():
        pytest.skip("the installed dashboard needs Debian's chromium at /usr/bin/chromium "
                    "(apt-get install chromium)")
    _installed_dashboard_shows_a_users_trainer_run(tmp_path, env_dir, Path(site), wheel,
                                                   request.getfixturevalue("chromium"))


def _installed_dashboard_shows_a_users_trainer_run(tmp_path: Path, env_dir: Path, site: Path,
                                                   wheel: Path, chromium) -> None:
    """`pip install <clone>[dashboard]` into the same virtualenv, a user's own Trainer script
    with the callback run from another directory, then `anatomy dashboard`: the run is listed and
    its Anatomy page shows measured next to predicted. The virtualenv now sees this environment's
    libraries (Streamlit among them: nothing is downloaded) through a .pth file, as
    `--system-site-packages` would show a system's; every command runs from a folder of its own,
    with no PYTHONPATH and no $ANATOMY_STORE: the one default store is what joins them."""
    # After the virtualenv's own site-packages: what pip installed there comes first.
    (site / "this-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANATOMY_STORE")}
    env["XDG_DATA_HOME"] = str(tmp_path / "home-data")
    binaries = env_dir / "bin"
    result = subprocess.run(_pip_into(str(binaries / "python"),
                                      f"anatomy[dashboard] @ {wheel.as_uri()}"),
                            capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    where = subprocess.run([str(binaries / "python"), "-c",
                            "import anatomy; print(anatomy.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(site)), where  # the installed copy, not the clone's

    script_folder = tmp_path / "my-project"
    script_folder.mkdir()
    (script_folder / "train.py").write_text(PADDED_TRAINER_SCRIPT)
    trained = subprocess.run([str(binaries / "python"), "train.py"], capture_output=True,
                             text=True, timeout=900, cwd=script_folder, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    store = Path(env["XDG_DATA_HOME"]) / "anatomy" / "anatomy.sqlite"
    assert store.is_file()  # the one default store

    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    process, url, log = serve([str(binaries / "anatomy"), "dashboard", "--port", "{port}"],
                              cwd=elsewhere, env=env, log_path=elsewhere / "dashboard.log")
    try:
        log.seek(0)
        assert f"store {store}" in log.read()  # it says which store it reads
        page = chromium.new_page(viewport=NARROW)
        page.goto(f"{url}/runs")
        page.get_by_text("train.py").first.wait_for(timeout=120_000)  # the run is listed

        page.goto(f"{url}/anatomy?run=1")
        page.get_by_text("Measured next to predicted").wait_for(timeout=300_000)
        # The waterfall, a picture in a new tab (views/figures/svg.py): its bars joined by
        # connectors, a side each in its legend. Waited for itself: on a loaded machine another
        # chart of the page is drawn first.
        waterfalls = """() => [...document.querySelectorAll('svg.anatomy-chart')]
            .filter(p => p.querySelector('rect.bar') && p.querySelector('line.connector'))"""
        page.wait_for_function(f"() => ({waterfalls})().length > 0", timeout=WAIT_MS)
        sides = page.evaluate(f"""() => ({waterfalls})()
            .flatMap(p => [...p.querySelectorAll('g.legend-item text')].map(t => t.textContent))""")
        assert sorted(set(sides)) == ["measured", "predicted"]
        page.screenshot(path=str(ARTIFACTS / "installed-anatomy-page.png"), full_page=True)
    finally:
        stop(process, log)


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
