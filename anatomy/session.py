"""What the dashboard shows about a run, computed without Streamlit: which run is live, the form's
values as RunOptions, the phase metrics, the progress, and the summary as the walkthrough prints it.
"""

from __future__ import annotations

from typing import Any

import psutil

from anatomy import measurement
from anatomy.options import FIELDS, RunOptions, validate
from anatomy.prediction import predict
from anatomy.runs import RunManager
from anatomy.store import PHASES, Store


def options_from_form(values: dict[str, Any]) -> RunOptions:
    """The form's widget values as RunOptions; max steps 0 means "train for the epochs"."""
    chosen = {name: values[name] for name in FIELDS if name in values}
    if not chosen.get("max_steps"):
        chosen["max_steps"] = None
    return RunOptions.from_dict(chosen)


def is_live(run: dict, manager: RunManager) -> bool:
    """A "running" row whose worker still lives: ours, or another process's (the CLI). A row left
    "running" by a server that died has no worker left, and is not shown as live."""
    if run["status"] != "running":
        return False
    if manager.is_active(run["id"]):
        return True
    pid = run.get("worker_pid")
    return bool(pid) and psutil.pid_exists(pid)


def live_run(store: Store, manager: RunManager) -> dict | None:
    """The run a freshly opened page shows live: the latest running one, if it really runs."""
    run = store.latest_running()
    return run if run is not None and is_live(run, manager) else None


def phase_metrics(report: dict) -> list[dict]:
    """One entry per walkthrough phase: its memory (at its end, or the latest reading while it
    lasts, as `report()` gives it), the increase over the previous phase, and whether it is done,
    open or still to come."""
    reached = {p["name"]: p for p in report["phases"]}
    metrics = []
    previous_mb = None
    for name in PHASES:
        phase = reached.get(name)
        if phase is None:
            metrics.append({"name": name, "state": "pending", "memory_mb": None, "delta_mb": None})
            continue
        memory_mb = phase["memory_mb"]
        delta = None if memory_mb is None or previous_mb is None else memory_mb - previous_mb
        metrics.append({"name": name, "state": "open" if phase["end_s"] is None else "done",
                        "memory_mb": memory_mb, "delta_mb": delta})
        previous_mb = memory_mb
    return metrics


# What the worker does after each phase ends, until the next begins: the curve rises here.
TRANSITIONS = {
    None: "starting the sampler and the training process",
    "baseline": "loading torch and the CUDA context",
    "kernel": "loading the model's weights",
    "weights": "building the Trainer",
    "training": "finishing",
}


def stage(report: dict) -> str:
    """Where the run is: in a phase, or in the transition after one (while the memory rises)."""
    if not report["phases"]:
        return TRANSITIONS[None]
    last = report["phases"][-1]
    if last["end_s"] is None:
        return f"phase {last['name']}"
    return f"{TRANSITIONS[last['name']]} (after {last['name']})"


def progress(report: dict, last_step: dict | None) -> dict:
    """Training progress: step, total steps, the fraction done and the seconds left (None until
    a step has been timed). Total steps come from the Trainer once it reports, else the options."""
    total = (last_step or {}).get("total") or RunOptions.from_dict(report["options"]).total_steps()
    step = last_step["step"] if last_step else 0
    training = next((p for p in report["phases"] if p["name"] == "training"), None)
    seconds_left = None
    if last_step and step and training is not None:
        per_step = (last_step["t"] - training["start_s"]) / step
        seconds_left = max(0.0, per_step * (total - step))
    return {"step": step, "total": total, "fraction": min(1.0, step / total) if total else 0.0,
            "seconds_left": seconds_left}


def summary_lines(report: dict) -> list[str]:
    """The walkthrough's `print_summary`: Time, Samples/second, then memory occupied."""
    summary = report["summary"]
    lines = []
    if summary["time_s"] is not None:
        lines.append(f"Time: {summary['time_s']:.2f}")
    if summary["samples_per_second"] is not None:
        lines.append(f"Samples/second: {summary['samples_per_second']:.2f}")
    training = next((p for p in report["phases"] if p["name"] == "training"), None)
    if training is not None and training["end_s"] is not None:
        lines.append(measurement.occupied_line(training["memory_bytes"], report["backend"]))
    return lines


def status_line(report: dict) -> str:
    """How the run ended, in one line (the error's own text is shown apart: it can be long)."""
    peak = report["summary"]["peak_mb"]
    peak_text = f"peak {peak} MB" if peak is not None else "no memory sample"
    return {
        "running": "running",
        "completed": f"completed: {peak_text}",
        "oom": f"out of memory: {peak_text} before it failed",
        "failed": f"failed: {peak_text}",
        "stopped": f"stopped by the user: {peak_text}",
    }.get(report["status"], report["status"])


def memory_forecast(options: RunOptions, machine: dict) -> dict:
    """What the run form says before a run starts: the predicted need, and a warning when it is
    more than the device holds. Invalid options get no forecast (the form shows their errors)."""
    if validate(options, machine["gpu_count"]):
        return {"line": None, "warning": None}
    on_gpu = machine["backend"] == "nvml"
    forecast = predict(options, device="cuda" if on_gpu else "cpu")
    if on_gpu:
        total = machine["devices"][options.gpu]["total"]
        where = f"GPU {options.gpu}'s {total / 2**30:.1f} GiB"
    else:
        total = machine["ram_total"]
        where = f"this machine's {total / 2**30:.1f} GiB of RAM"
    warning = None
    if forecast.peak > total:
        warning = (f"predicted peak {forecast.peak / 2**30:.1f} GiB is more than {where}: "
                   "this run will most likely end out of memory")
    return {"line": forecast.need_line(), "warning": warning}
