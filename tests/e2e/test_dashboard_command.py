"""`anatomy dashboard`: a real server started by it from another directory over the store it names
(the browser tests drive the pages of a server started the same way)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from anatomy.store import Store
from tests.conftest import PROJECT
from tests.helpers import free_port, wait_until
from tools.browser import healthy


def test_it_serves_the_store_it_names_from_any_directory_and_ends_with_its_server(tmp_path):
    store, port = tmp_path / "elsewhere" / "runs.sqlite", free_port()
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}  # the package, as installed
    env.pop("ANATOMY_STORE", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "anatomy", "dashboard", "--port", str(port), "--store", str(store)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = server.stdout.readline().strip()
        assert first == (f"anatomy dashboard: http://localhost:{port} · store {store} · pid "
                         f"{server.pid} (Ctrl-C stops it)")  # the pid that serves: see below
        wait_until(lambda: healthy(f"http://localhost:{port}"), 60,
                   "the server to answer its health check", every=0.3, process=server,
                   seen=lambda: first)
        # The command became the server (exec): its pid serves, and the store is its own.
        serving = psutil.Process(server.pid)
        assert "streamlit" in " ".join(serving.cmdline())
        assert serving.environ()["ANATOMY_STORE"] == str(store)
        assert Store(store, read_only=True).runs() == []  # made, and anatomy's
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert not psutil.pid_exists(server.pid)
