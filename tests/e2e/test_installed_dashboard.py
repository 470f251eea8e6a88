"""Installed where people train: `pip install <clone>[dashboard]` into a fresh virtualenv outside
the clone, a user's own Trainer script with the callback run from another directory, then
`anatomy dashboard`: the run is listed and its Anatomy page shows measured next to predicted.

The virtualenv sees this environment's libraries through a .pth file, as `--system-site-packages`
would show a system's (torch, transformers, Streamlit: nothing is downloaded); anatomy itself is
built from the clone and installed into it, and every command runs from a folder of its own, with
no PYTHONPATH and no $ANATOMY_STORE: the one default store is what joins them."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.e2e.conftest import ARTIFACTS, PADDED_TRAINER_SCRIPT, serve, stop
from tools.browser import CHROMIUM, wait_for_chart

pytestmark = [pytest.mark.packaging, pytest.mark.browser, pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")]

NARROW = {"width": 1000, "height": 900}

@pytest.fixture
def installed(tmp_path, wheel) -> tuple[Path, dict]:
    """A fresh virtualenv with `pip install <clone>[dashboard]` done (the clone's wheel, built as
    pip builds it), and the environment its commands run in (their own data directory, hence
    their own default store)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    target = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    # After the virtualenv's own site-packages: what pip installs there comes first.
    (Path(target) / "this-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANATOMY_STORE")}
    env["XDG_DATA_HOME"] = str(tmp_path / "home-data")
    result = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                             f"anatomy[dashboard] @ {wheel.as_uri()}"], capture_output=True,
                            text=True, timeout=900, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import anatomy; print(anatomy.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env)
    assert where.stdout.startswith(target), where  # the installed copy, not the clone's
    return env_dir / "bin", env


@pytest.mark.timeout(1800)
def test_a_users_trainer_run_shows_measured_next_to_predicted_on_the_installed_dashboard(
        tmp_path, installed, chromium):
    binaries, env = installed
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
        wait_for_chart(page)
        sides = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .flatMap(p => p.data.filter(t => t.type === 'waterfall').map(t => t.name))""")
        assert sorted(set(sides)) == ["measured", "predicted"]
        page.screenshot(path=str(ARTIFACTS / "installed-anatomy-page.png"), full_page=True)
    finally:
        stop(process, log)
