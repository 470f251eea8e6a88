"""What one dashboard server holds for every page, tab and rerun: the run manager over the store
(its collector threads and processes outlive every page, so closing a tab neither stops nor loses
a run), the machine as the engine sees it, the latest sweep, and what stopping the server does
to the runs it started (`ServerEnd`)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Mapping
from functools import partial
from multiprocessing import resource_tracker
from typing import Any

import streamlit as st
from streamlit import runtime

from anatomy.analysis.machine import Machine
from anatomy.dashboard import READ_ONLY_ENV
from anatomy.engine import prometheus
from anatomy.engine.endings import STOP_WORDS, signal_name
from anatomy.engine.lifeline import stop_as_a_job
from anatomy.engine.manager import RunManager, machine
from anatomy.engine.sweep import Sweep
from anatomy.store import ServerUrl, Store, resolve_path

STOPPED_WITH_THE_SERVER = "stopped with the dashboard"
SERVER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ServerEnd:
    """The runs and sweeps this server started end with it, as stopping Jupyter ends its kernels:
    each recorded as stopped ("stopped with the dashboard, by SIGTERM"), what it recorded kept,
    its processes ended — whether Ctrl-C, SIGTERM (`kill PID`, a service manager) or SIGHUP (its
    terminal closed) reaches the server alone or its whole process group. The recording lives in
    this process, so a run cannot outlive it and still be recorded.

    Streamlit stops its server on SIGINT and SIGTERM and the interpreter exits: the runs are
    stopped at that exit (atexit, which runs while their collector threads still do). The
    handlers here mark the runs first, with the signal's name, so that a sampler that the same
    signal ended (a process group's SIGTERM) reads as part of the stop; SIGHUP, whose default
    ends the process at once, stops the server as SIGTERM does. Handlers can only be set from
    the main thread, where Streamlit's event loop runs: they are set there, once a page has
    made the server's manager (before that, the server has started no run)."""

    def __init__(self) -> None:
        self.managers: list[RunManager] = []
        self.sweeps: list[SweepSlot] = []
        self.endpoints: list[prometheus.Endpoint] = []  # `--metrics-port`'s, closed at the end
        self.reason = STOPPED_WITH_THE_SERVER
        atexit.register(self.stop_runs)
        try:
            loop = runtime.get_instance().stopped.get_loop()
        except RuntimeError:  # no server (AppTest): no signal reaches one
            return
        loop.call_soon_threadsafe(self._catch_signals)

    def _catch_signals(self) -> None:
        stop_server = signal.getsignal(signal.SIGTERM)  # Streamlit's: it stops the server
        # multiprocessing's resource tracker (a child of this process, which the runs' queues
        # use) ignores SIGINT and SIGTERM but not SIGHUP: a process group's SIGHUP ended it under
        # the runs, and its stand-in printed tracebacks. Started now, it inherits SIGHUP ignored.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        resource_tracker.ensure_running()
        for signum in SERVER_SIGNALS:
            signal.signal(signum, partial(self._on_signal, stop_server))
        signal.signal(signal.SIGTSTP, lambda signum, frame: stop_as_a_job(self.pause))

    def pause(self, paused: bool) -> None:
        """Every run this server trains stopped or continued with it (its terminal's Ctrl-Z,
        then fg or bg): the workers lead process groups of their own, which the terminal's
        signal does not reach."""
        for manager in self.managers:
            manager.pause(paused)

    def _on_signal(self, stop_server, signum: int, frame) -> None:
        """Mark every run as stopping (safe in a handler), then stop the server."""
        self.reason = f"{STOPPED_WITH_THE_SERVER}, by {STOP_WORDS.get(signum, signal_name(signum))}"
        for manager in self.managers:
            for run_id in list(manager.active):
                manager.request_stop(run_id, self.reason)
        if callable(stop_server):
            stop_server(signal.SIGTERM, frame)
        else:
            raise SystemExit(128 + signum)

    def stop_runs(self) -> None:
        """Stop every sweep, then every run, this server started (their processes end; each
        run's ending is written)."""
        for slot in self.sweeps:
            slot.stop(self.reason)
        for manager in self.managers:
            manager.stop_all(self.reason)
        for endpoint in self.endpoints:
            endpoint.close()


@st.cache_resource(show_spinner=False)
def server_end() -> ServerEnd:
    return ServerEnd()


@st.cache_resource(show_spinner=False)
def _manager(store_path: str) -> RunManager:
    # A read-only dashboard's manager starts nothing, and its store refuses any write.
    manager = RunManager(Store(store_path, read_only=read_only() is not None),
                         front="the dashboard")
    server_end().managers.append(manager)
    _serve_metrics(manager)
    return manager


def _serve_metrics(manager: RunManager) -> None:
    """`anatomy dashboard --metrics-port`: the figures of the runs this server records, while
    they record. The port was found free before Streamlit started; one taken since is said on
    the server's terminal, and the dashboard serves on without it."""
    where = prometheus.from_environment()
    if where is None:
        return

    def recording() -> list:
        return [r.figures for run_id, r in list(manager.recordings.items())
                if run_id in manager.active]
    try:
        server_end().endpoints.append(prometheus.serve(where[1], where[0], recording))
    except prometheus.EndpointRefused as error:
        print(f"anatomy dashboard: {error}", file=sys.stderr, flush=True)


def manager() -> RunManager:
    """The server's one manager of the store the server reads (`$ANATOMY_STORE`)."""
    return _manager(_store_key())


def store() -> Store:
    return manager().store


@st.cache_resource(show_spinner=False)
def device() -> Machine:
    """The machine as the engine sees it: asked once per server (NVML calls)."""
    return machine()


class SweepSlot:
    """The server's latest sweep, run by a thread of its own (never a page's), which writes only
    to the store. Pages read its progress from the store and call `stop`. The engine keeps the
    device for it: another sweep or run on that device is refused as busy."""

    def __init__(self) -> None:
        self.sweep: Sweep | None = None
        self._lock = threading.Lock()

    def start(self, base: Mapping[str, Any], vary: dict[str, list], until_oom: bool) -> int:
        """The sweep's id; InvalidOptions when its plan is wrong, DeviceBusy when its device is
        taken (by a run or a sweep, from this server or another process)."""
        with self._lock:
            sweep = Sweep(manager(), base, vary, until_oom, gpu_count=device().gpu_count)
            sweep.start()
            self.sweep = sweep
            return sweep.id

    def running(self) -> bool:
        return self.sweep is not None and self.sweep.is_alive()

    def running_id(self) -> int | None:
        return self.sweep.id if self.running() else None

    def stop(self, reason: str = "stopped by the user") -> None:
        sweep = self.sweep
        if sweep is not None:
            sweep.stop(reason)
            sweep.wait(timeout=30)


@st.cache_resource(show_spinner=False)
def _sweeps(store_path: str) -> SweepSlot:
    slot = SweepSlot()
    server_end().sweeps.append(slot)
    return slot


def sweeps() -> SweepSlot:
    return _sweeps(_store_key())


def read_only() -> str | None:
    """Why this dashboard writes nothing (`anatomy dashboard --read-only`, or a store it cannot
    write); None: it starts, stops, labels and deletes runs."""
    return os.environ.get(READ_ONLY_ENV) or None


def _store_key() -> str:
    """`$ANATOMY_STORE` as the store is reached: a database's URL with its password (printed
    masked, which no server accepts)."""
    where = resolve_path()
    return where.secret() if isinstance(where, ServerUrl) else str(where)

