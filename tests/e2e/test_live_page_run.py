"""The Live page driving a real run through AppTest: Start, a second Start refused while busy, Stop."""

from __future__ import annotations

import os

from streamlit.testing.v1 import AppTest

from anatomy.engine.devices import machine
from tests.apptest import APP

TIMEOUT = 30  # the first run of a test process imports plotly and the engine


NO_GPU = machine().gpu_count == 0


def _app(**state) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in state.items():
        app.session_state[key] = value
    return app


def _errors(app: AppTest) -> list[str]:
    return [e.value for e in app.error]


def test_start_a_second_start_refused_while_busy_and_stop(store):
    from anatomy.dashboard import server  # the server's one manager, the one the page started the run with

    app = _app().run()
    app.number_input(key="option_dataset_size").set_value(100_000)  # long enough to be stopped
    try:
        app.button(key="start").click().run()
        assert not app.exception
        (run,) = store.runs()
        assert run.status == "running" and run.options["dataset_size"] == 100_000
        assert app.subheader[0].value.startswith(f"Run {run.id}: ")

        app.button(key="start").click().run()
        device = "this machine" if NO_GPU else "GPU 0"
        # The pid is the dashboard's own (the worker is its child): said so, for ending it ends
        # the dashboard, not only the run
        holder = f"run {run.id} of {store.path} (the dashboard, pid {os.getpid()})"
        assert _errors(app) == [f"Not started: {device} is busy: {holder}."]
        assert len(store.runs()) == 1

        # Stop answers at once; the stop itself (SIGTERM, grace, the last rows) runs on a thread.
        app.button(key="stop").click().run()
        assert app.button(key="stop").label == "Stopping…" and app.button(key="stop").disabled
        assert any(w.value.startswith("Stopping: the training process is told to end")
                   for w in app.warning)
        assert server.manager().wait(run.id, timeout=30) == "stopped"
        app.run()
        assert app.warning[0].value.startswith("stopped by the user")
    finally:
        server.manager().stop_all()
