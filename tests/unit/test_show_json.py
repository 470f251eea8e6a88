"""`show --json` prints the H200 runs of docs/data byte for byte as before the typed spine."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main
from anatomy.store import Message, PhaseMark, Sample, Step, Store
from tests.conftest import PROJECT

SHOWN = sorted(p for p in (PROJECT / "docs" / "data").glob("h200-*.json") if "sweep" not in p.name)
DERIVED = ("context", "non_torch", "peak")  # computed from the samples when a run is read


def _store_as_shown(store: Store, shown: dict) -> int:
    """A store holding the run `shown` describes: its options, environment, phases, messages and
    stored summary, with samples that give each phase's memory and the peak it shows."""
    run_id = store.create_run(shown["options"], shown["backend"], shown["memory_api"],
                              shown["gpu"], shown["environment"], name=shown["name"],
                              sweep=shown["sweep"])
    summary = {k: v for k, v in shown["summary"].items()
               if k not in ("peak_mb", "peak_bytes", "memory_mb")}
    if shown["components"] is not None:
        summary["components"] = {k: v for k, v in shown["components"].items()
                                 if k not in DERIVED}
    if shown["operations"] is not None:
        summary["operations"] = shown["operations"]
    store.update_run(run_id, created_at=shown["created_at"], ended_at=shown["ended_at"],
                     status=shown["status"], error=shown["error"], summary=summary,
                     samples_sent=shown["samples_sent"])
    store.set_tags(run_id, shown["tags"])
    gpu, phases = shown["gpu"], shown["phases"]
    marks, samples = [], []
    for phase in phases:
        marks.append(PhaseMark("start", phase["name"], phase["start_s"]))
        marks.append(PhaseMark("end", phase["name"], phase["end_s"]))
        samples.append(Sample(phase["end_s"], gpu, phase["memory_bytes"], None, None, None))
    last = phases[-1]["end_s"]
    # The peak within the last phase (a worker run's peak is read up to its last phase's end).
    samples.append(Sample((phases[-1]["start_s"] + last) / 2, gpu, shown["summary"]["peak_bytes"],
                          None, None, None))
    samples += [Sample(last + 1 + i / 1e4, gpu, 0, None, None, None)
                for i in range(shown["samples"] - len(samples))]
    steps = [Step(last, k, shown["steps"], None, None, None) for k in range(shown["steps"])]
    messages = [Message(m["t"], m["level"], m["text"]) for m in shown["messages"]]
    store.write(run_id, samples=samples, phases=marks, steps=steps, messages=messages)
    return run_id


@pytest.mark.parametrize("path", SHOWN, ids=lambda p: p.name)
def test_show_json_prints_the_h200_runs_byte_for_byte_as_before(path, store, capsys):
    expected = path.read_text()
    shown = json.loads(expected)
    run_id = _store_as_shown(store, shown)
    assert main(["show", str(run_id), "--json", "--store", str(store.path)]) == 0
    printed = capsys.readouterr().out
    assert printed.replace(f'"id": {run_id},', f'"id": {shown["id"]},', 1) == expected

