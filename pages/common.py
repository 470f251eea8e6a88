"""What every page shares: the one run manager of the server, the device, and a run's chart and
summary. Not a page itself: app.py lists the pages, and this module is imported by them."""

from __future__ import annotations

import streamlit as st

from anatomy import figures, measurement, session
from anatomy.runs import RunManager, machine
from anatomy.store import Store, resolve_path

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
def device() -> dict:
    """The machine as `anatomy.runs.machine()` sees it: asked once per server (NVML calls)."""
    return machine()


def sidebar_device() -> None:
    info = device()
    with st.sidebar:
        st.subheader("Device")
        if info["backend"] == "nvml":
            for gpu in info["devices"]:
                st.markdown(f"**GPU {gpu['index']}: {gpu['name']}**  \n"
                            f"{gpu['total'] / 2**30:.1f} GiB total")
            st.caption(f"driver {info['driver']} · CUDA {info['cuda_driver']} · "
                       f"NVML memory API {info['memory_api']}")
        else:
            st.markdown("**no GPU: measuring CPU memory of the training process**")
            st.caption(f"{info['ram_total'] / 2**30:.1f} GiB RAM · {info['why_no_gpu']}")
        st.caption("Measures " + measurement.source(info["backend"], info["memory_api"]))


def run_title(rep: dict) -> str:
    o = rep["options"]
    device_name = rep["environment"].get("gpu_name") or "CPU"
    extras = [o["precision"]]
    if o.get("gradient_checkpointing"):
        extras.append("gradient checkpointing")
    if o.get("grad_accum", 1) > 1:
        extras.append(f"accumulation {o['grad_accum']}")
    return (f"Run {rep['id']}: {rep['preset']}, batch size {o['batch_size']}, seq len {o['seq_len']}"
            f", {', '.join(extras)} on {device_name}")


def memory_chart(rep: dict, now: float | None = None) -> None:
    db = store()
    figure = figures.memory_figure(rep, db.decimated(rep["id"]), db.steps(rep["id"]), now)
    st.plotly_chart(figure, key=f"memory-{rep['id']}", config={"displaylogo": False})
    st.caption("Shows " + measurement.source(rep["backend"], rep["memory_api"]) +
               ". A band runs from the end of the phase before to the end of its own phase; its"
               " marker is the memory at that end, the walkthrough's figure.")


def outcome(rep: dict) -> None:
    """How a finished run ended, and its summary as the walkthrough prints it."""
    line = session.status_line(rep)
    if rep["status"] == "completed":
        st.success(line)
    elif rep["status"] == "stopped":
        st.warning(line)
    else:
        st.error(line)
        if rep["error"]:
            st.code(rep["error"], language=None)
    lines = session.summary_lines(rep)
    if lines:
        st.code("\n".join(lines), language=None)
    for message in rep["messages"]:
        st.caption(f"{message['level']}: {message['text']}")
