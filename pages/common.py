"""What every page shares: the one run manager of the server, the device, and a run's chart and
summary. Not a page itself: app.py lists the pages, and this module is imported by them."""

from __future__ import annotations

import threading

import streamlit as st

from anatomy.analysis.machine import Machine
from anatomy.analysis.options import FIELDS, RunOptions
from anatomy.analysis.report import RunReport
from anatomy.engine.manager import RunManager, machine
from anatomy.engine.sweep import Sweep
from anatomy.store import Store, resolve_path
from anatomy.views import figures, session, text

RUNS_PAGE = "pages/runs.py"


@st.cache_resource(show_spinner=False)
def _manager(store_path: str) -> RunManager:
    # One per server and store: its collector threads and processes outlive every page, tab and
    # rerun, so closing the tab neither stops nor loses a run.
    return RunManager(Store(store_path))


def manager() -> RunManager:
    return _manager(str(resolve_path()))


def store() -> Store:
    return manager().store


@st.cache_resource(show_spinner=False)
def device() -> Machine:
    """The machine as the engine sees it: asked once per server (NVML calls)."""
    return machine()


def sidebar_device() -> None:
    info = device()
    with st.sidebar:
        st.subheader("Device")
        if info.has_gpu:
            for gpu in info.devices:
                st.markdown(f"**GPU {gpu.index}: {gpu.name}**  \n"
                            f"{gpu.total / 2**30:.1f} GiB total")
            st.caption(f"driver {info.driver} · CUDA {info.cuda_driver} · "
                       f"NVML memory API {info.memory_api}")
        else:
            st.markdown("**no GPU: measuring CPU memory of the training process**")
            st.caption(f"{info.ram_total / 2**30:.1f} GiB RAM · {info.why_no_gpu}")
        st.caption("Measures " + text.source(info.backend, info.memory_api))


def memory_chart(rep: RunReport, now: float | None = None) -> None:
    db = store()
    figure = figures.memory_figure(rep, db.decimated(rep.id), db.steps(rep.id), now)
    st.plotly_chart(figure, key=f"memory-{rep.id}", config={"displaylogo": False})
    st.caption("Shows " + text.source(rep.backend, rep.memory_api) +
               ". A band runs from the end of the phase before to the end of its own phase; its"
               " marker is the memory at that end, the walkthrough's figure.")


def outcome(rep: RunReport) -> None:
    """How a finished run ended, and its summary as the walkthrough prints it."""
    line = session.status_line(rep)
    if rep.status == "completed":
        st.success(line)
    elif rep.status == "stopped":
        st.warning(line)
    else:
        st.error(line)
        if rep.error:
            st.code(rep.error, language=None)
    lines = session.summary_lines(rep)
    if lines:
        st.code("\n".join(lines), language=None)
    for message in rep.messages:
        st.caption(f"{message.level}: {message.text}")


def option_widget(name: str, default, key: str, label: str | None = None) -> None:
    """One run option as the Live page's form draws it: a choice, a flag or a number. No min/max
    on numbers: Streamlit would silently put a wrong value back; the engine judges instead."""
    field = FIELDS[name]
    label = label or field.label
    if field.free_text and field.choices is not None:  # a list to pick from, or type a path
        choices = list(field.choices) + ([default] if default not in field.choices else [])
        st.selectbox(label, choices, index=choices.index(default), key=key, help=field.help,
                     accept_new_options=True)
    elif field.free_text:
        st.text_input(label, value=default, key=key, help=field.help)
    elif field.choices is not None:
        st.selectbox(label, field.choices, index=field.choices.index(default), key=key,
                     help=field.help)
    elif field.low is None:
        st.checkbox(label, value=default, key=key, help=field.help)
    elif name == "max_steps":
        st.number_input(label, value=default or 0, step=1, key=key,
                        help=f"{field.help}; 0 trains for the epochs ({field.low} to {field.high})")
    else:
        st.number_input(label, value=default, step=1, key=key,
                        help=f"{field.help} ({field.low} to {field.high})")


class SweepSlot:
    """The server's latest sweep, run by a thread of its own (never a page's), which writes only
    to the store. Pages read its progress from the store and call `stop`. The engine keeps the
    device for it: another sweep or run on that device is refused as busy."""

    def __init__(self) -> None:
        self.sweep: Sweep | None = None
        self._lock = threading.Lock()

    def start(self, base: RunOptions, vary: dict[str, list], until_oom: bool) -> int:
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


def choose_run_from_url(ids: list[int], key: str) -> None:
    """?run=ID picks the run of the selectbox stored under `key` (a link from another page, or a
    shared URL); without one, or for an unknown id, the latest run."""
    wanted = st.query_params.get("run")
    if wanted and wanted.isdigit() and int(wanted) in ids:
        st.session_state[key] = int(wanted)
    if st.session_state.get(key) not in ids:
        st.session_state[key] = ids[0]


def run_to_url(key: str) -> None:
    """The selectbox's run back into ?run=, so the URL always names what is shown."""
    st.query_params["run"] = str(st.session_state[key])
