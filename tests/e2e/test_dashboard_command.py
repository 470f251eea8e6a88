"""`anatomy dashboard`: a real server started by it from another directory over the store it names
(the browser tests drive the pages of a server started the same way)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import psutil

from anatomy.store import Store
from tests.conftest import PROJECT
from tests.helpers import free_port, wait_until
from tools.browser import healthy


def test_it_serves_the_store_it_names_from_any_directory_and_ends_with_its_server(tmp_path):
    store, port = tmp_path / "elsewhere" / "runs.sqlite", free_port()
    store.parent.mkdir()  # --store names a file; its folder must exist (a typo is refused)
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


def test_streamlit_run_app_py_in_the_clone_serves_the_dashboard_on_this_machine_only(tmp_path):
    """What the project's card says: `streamlit run app.py` from the clone, with the clone's
    Streamlit settings (.streamlit/config.toml: localhost, as `anatomy dashboard` binds)."""
    store, port = tmp_path / "runs.sqlite", free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)],
        cwd=PROJECT, env={**os.environ, "ANATOMY_STORE": str(store)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def page() -> str | None:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/", timeout=2) as answer:
                    return answer.read().decode()
            except OSError:
                return None

        page = wait_until(page, 60, "the page served", every=0.3, process=server)
        assert "<title>Streamlit</title>" in page
        listening = {c.laddr.ip for c in psutil.Process(server.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening and listening <= {"127.0.0.1", "::1"}, listening
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Traceback" not in output, output
