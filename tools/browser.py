"""What the screenshots and the dashboard bench share: Debian's Chromium with its arguments, and
a dashboard served on a free port over a given store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def serve(store: Path, project: Path = PROJECT, lock_dir: Path | None = None
          ) -> tuple[subprocess.Popen, str]:
    """The dashboard of `project` over `store`, once it answers its health check. Device locks of
    its own (`lock_dir`, by default beside the store): a run elsewhere on the machine does not
    make this one "busy". A checkout from before `anatomy dashboard` serves its app.py, so that
    the bench compares before and after."""
    port = free_port()
    env = {**os.environ, "ANATOMY_STORE": str(store), "PYTHONPATH": str(project),
           "ANATOMY_LOCK_DIR": str(lock_dir or store.parent)}
    command = (["-m", "streamlit", "run", "app.py", "--server.headless", "true",
                "--server.port", str(port)] if (project / "app.py").exists() else
               ["-m", "anatomy", "dashboard", "--port", str(port), "--store", str(store)])
    process = subprocess.Popen([sys.executable, *command],
                               cwd=project, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://localhost:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("streamlit did not start")
