"""What one dashboard server holds for every page, tab and rerun: the run manager over the store
(its collector threads and processes outlive every page, so closing a tab neither stops nor loses
a run), the machine as the engine sees it, and the latest sweep."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import streamlit as st

from anatomy.analysis.machine import Machine
from anatomy.engine.manager import RunManager, machine
from anatomy.engine.sweep import Sweep
from anatomy.store import Store, resolve_path


@st.cache_resource(show_spinner=False)
def _manager(store_path: str) -> RunManager:
    return RunManager(Store(store_path))


def manager() -> RunManager:
    """The server's one manager of the store the server reads (`$ANATOMY_STORE`)."""
    return _manager(str(resolve_path()))


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

    def stop(self) -> None:
        sweep = self.sweep
        if sweep is not None:
            sweep.stop()
            sweep.wait(timeout=30)


@st.cache_resource(show_spinner=False)
def _sweeps(store_path: str) -> SweepSlot:
    return SweepSlot()


def sweeps() -> SweepSlot:
    return _sweeps(str(resolve_path()))

